#!/bin/bash
LLAMA8B_ARGS=( --num-layers 32 --hidden-size 4096 --num-attention-heads 32 --ffn-hidden-size 14336 )
LLAMA70B_ARGS=( --num-layers 80 --hidden-size 8192 --num-attention-heads 64 --ffn-hidden-size 28672 )
MODEL_ARGS=( "${LLAMA8B_ARGS[@]}" )
torchrun --nproc_per_node 8 --nnodes 1 pretrain_gpt.py "${MODEL_ARGS[@]}" \
  --seq-length 4096 --max-position-embeddings 4096 --micro-batch-size 1 --global-batch-size 64 \
  --tensor-model-parallel-size 8 --pipeline-model-parallel-size 1 --vocab-size 32000 --bf16
