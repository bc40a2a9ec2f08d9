#!/bin/bash
torchrun --nproc_per_node 8 pretrain_gpt.py \
  --num-layers 32 --hidden-size 4096 --num-attention-heads 32 \
  --seq-length 4096 --max-position-embeddings 4096 --micro-batch-size 1 --global-batch-size 64 --vocab-size 32000 --bf16 \
  --tensor-model-parallel-size 2 \
  # --use-distributed-optimizer \
  --pipeline-model-parallel-size 2
