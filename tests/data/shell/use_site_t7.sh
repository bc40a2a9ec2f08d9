#!/bin/bash
RECOMPUTE_ARGS="--recompute-granularity full --recompute-method uniform --recompute-num-layers 1"
# recompute disabled for this run
RECOMPUTE_ARGS=""
torchrun --nproc_per_node 8 --nnodes 1 pretrain_gpt.py --num-layers 32 --hidden-size 4096 --num-attention-heads 32 \
  --seq-length 4096 --max-position-embeddings 4096 --micro-batch-size 1 --global-batch-size 64 --vocab-size 32000 --bf16 \
  --tensor-model-parallel-size 8 $RECOMPUTE_ARGS
