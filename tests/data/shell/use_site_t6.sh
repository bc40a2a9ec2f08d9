#!/bin/bash
PAR_ARGS=( --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 )
MODEL_ARGS=( --num-layers 32 --hidden-size 4096 --num-attention-heads 32
  --seq-length 4096 --max-position-embeddings 4096 --micro-batch-size 1 --global-batch-size 64 --vocab-size 32000 --bf16 )
torchrun --nproc_per_node 8 --nnodes 1 pretrain_gpt.py --tensor-model-parallel-size 8 --pipeline-model-parallel-size 1 "${MODEL_ARGS[@]}" "${PAR_ARGS[@]}"
