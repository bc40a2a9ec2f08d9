#!/bin/bash
python tools/preprocess_data.py --input data.jsonl --output-prefix my --tokenizer-type GPT2BPETokenizer --workers 32 --append-eod
torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers 32 --hidden-size 4096 --num-attention-heads 32 \
  --seq-length 4096 --max-position-embeddings 4096 --micro-batch-size 1 --global-batch-size 64 --vocab-size 32000 --bf16 \
  --tensor-model-parallel-size 4
# evaluate afterwards on fewer GPUs
torchrun --nproc_per_node 2 tasks/main.py --task LAMBADA --tensor-model-parallel-size 2 --micro-batch-size 8 --seq-length 1024
