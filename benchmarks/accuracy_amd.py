"""Accuracy of `projection performance` on public training logs from AMD Instinct GPUs (MI300X, MI325X).

Run: python3 benchmarks/accuracy_amd.py

Issue 6's published tables (benchmarks/accuracy.py) are all A100 and H100. These are the AMD runs found with a
configuration complete enough to project and a measured step time (research notes 2026-11-30: no AMD-published
table pairs a complete config with a number; AMD's ROCm training docs give commands only). Each is a launch script
rebuilt from the run's own script and environment, loaded by projection's Megatron script loader on the device the
run used, projected with the shipped default calibration, and compared on tokens/s/GPU = global batch x sequence /
(step time x GPUs). Validation only: nothing is fitted to them, and they are not part of issue 6's four sources.

* M1, 8 x MI300X (1 node, "AAC8"; the GPU model from the same repository's rccl-tests output on that machine):
  hisohara/ai-scripts training/02_megatron/README.md @3ae89cf1, 2025-08-13. ROCm/Megatron-LM rocm_dev @38fc8307,
  torch 2.8.0+rocm6.4, ROCm TransformerEngine 8c4a512 (2.1.0.dev0), no flash-attn package, no GEMM tuning.
  `MBS=4 BS=256 TP=1 TE_FP8=1 SEQ_LENGTH=4096 MODEL_SIZE=7 TOTAL_ITERS=50 USE_FLASH_ATTN=0 GEMM_TUNING=0 bash
  examples/llama/train_llama2.sh`; the flags below are what that script builds from those settings (read from
  ROCm/Megatron-LM examples/llama/train_llama2.sh @02b8aa76, a later commit than the run's: A). Measured: the script's
  mean elapsed time per iteration, 10,250.5 ms (iterations 3-49), 12,786.9 tokens/s/GPU.
* U4, 64 x MI325X (8 nodes, Broadcom Thor-2 RoCE): hisohara/ai-scripts training/04_megatron-pyxis @97db03fb,
  2025-11-24, rocm/megatron-lm v25.9 image, `examples/llama/train_llama3.sh` for Llama-3.1-70B with FP8, FSDP2,
  full recompute, MBS 4, BS 256, sequence 8192. The flags are the run's own argument dump (its log,
  megatron-pyxis-12384.out, 403 arguments). Measured: the script's mean, 19,124.9 ms (iterations 3-9),
  1,713.4 tokens/s/GPU. The same log's memory report is an oracle of tests/oracle/test_memory_reserved_public.py.
* U1-U3, AMD Primus on MI325X (hisohara/ai-scripts training/03_primus @4fb66ab5, 2025-11-14/15, rocm/primus
  v25.9): Llama-2-7B FP8 on 64 GPUs, Llama-2-70B FP8 with FSDP2 and full recompute on 16, Mixtral-8x7B BF16 with
  EP 8 on 64. Each log's rank-0 Megatron argument dump is kept as a flat YAML of argparse dests in amd_runs/ (with
  its measured lines in the header) and loaded as it is. Measured: the log's mean elapsed time per iteration from
  iteration 3 to 50.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from accuracy import Case, _tokens, evaluate  # noqa: E402,F401  (evaluate: for tests/oracle/test_performance_amd_public.py)
from accuracy import main as accuracy_main  # noqa: E402

SOURCE = "AMD public logs"

LLAMA2_7B_FP8 = (
    "torchrun --nproc_per_node 8 --nnodes 1 pretrain_gpt.py --tensor-model-parallel-size 1 "
    "--pipeline-model-parallel-size 1 --context-parallel-size 1 --num-layers 32 --hidden-size 4096 "
    "--ffn-hidden-size 11008 --num-attention-heads 32 --seq-length 4096 --max-position-embeddings 32000 "
    "--untie-embeddings-and-output-weights --position-embedding-type rope --no-position-embedding --swiglu "
    "--disable-bias-linear --init-method-std 0.02 --attention-dropout 0.0 --hidden-dropout 0.0 --normalization RMSNorm "
    "--micro-batch-size 4 --global-batch-size 256 --train-iters 50 --no-async-tensor-model-parallel-allreduce --bf16 "
    "--no-masked-softmax-fusion --tokenizer-type HuggingFaceTokenizer "
    "--tokenizer-model NousResearch/Llama-2-7b-chat-hf "
    "--dataloader-type cyclic --log-interval 1 --num-workers 8 --mock-data --log-throughput --no-save-optim "
    "--group-query-attention --num-query-groups 32 --no-gradient-accumulation-fusion --distributed-backend nccl "
    "--overlap-grad-reduce --use-distributed-optimizer --overlap-param-gather --sequence-parallel --use-mcore-models "
    "--transformer-impl transformer_engine --fp8-margin 0 --fp8-format hybrid --fp8-interval 1 "
    "--fp8-amax-history-len 1024 --fp8-amax-compute-algo max --attention-softmax-in-fp32 --lr 1e-4 --min-lr 1e-5 "
    "--lr-decay-style cosine --weight-decay 1.0e-1 --clip-grad 1.0 --ckpt-format torch_dist --optimizer adam "
    "--adam-beta1 0.9 --adam-beta2 0.95\n")

LLAMA31_70B_FP8_FSDP2 = (
    "torchrun --nproc_per_node 8 --nnodes 8 pretrain_gpt.py --tensor-model-parallel-size 1 "
    "--pipeline-model-parallel-size 1 --context-parallel-size 1 --num-layers 80 --hidden-size 8192 "
    "--ffn-hidden-size 28672 --num-attention-heads 64 --seq-length 8192 --max-position-embeddings 131072 "
    "--untie-embeddings-and-output-weights --position-embedding-type rope --no-position-embedding --swiglu "
    "--disable-bias-linear --init-method-std 0.02 --attention-dropout 0.0 --hidden-dropout 0.0 --normalization RMSNorm "
    "--micro-batch-size 4 --global-batch-size 256 --train-iters 10 --bf16 --no-masked-softmax-fusion "
    "--recompute-num-layers 80 --recompute-granularity full --recompute-method block "
    "--tokenizer-type HuggingFaceTokenizer --tokenizer-model meta-llama/Llama-3.1-70B --mock-data --log-interval 1 "
    "--log-throughput --group-query-attention --num-query-groups 8 --no-gradient-accumulation-fusion "
    "--distributed-backend nccl --overlap-grad-reduce --use-torch-fsdp2 --use-flash-attn --use-mcore-models "
    "--transformer-impl transformer_engine --fp8-margin 0 --fp8-format hybrid --fp8-interval 1 "
    "--fp8-amax-history-len 1024 --fp8-amax-compute-algo max --attention-softmax-in-fp32 "
    "--no-fp8-weight-transpose-cache --lr 1e-4 --min-lr 1e-5 --lr-decay-style cosine --weight-decay 1.0e-1 "
    "--clip-grad 1.0 --ckpt-format torch_dist --optimizer adam --adam-beta1 0.9 --adam-beta2 0.95\n")


RUNS = Path(__file__).resolve().parent / "amd_runs"  # Primus runs' argument dumps, each file citing its log


def cases() -> list[Case]:
    """(name, GPUs, nodes, device, script or config file, measured step seconds, global batch, sequence)."""
    runs = [("M1 Llama-2-7B FP8 tp1 dp8", 8, 1, "mi300x", LLAMA2_7B_FP8, 10.2505, 256, 4096),
            ("U4 Llama-3.1-70B FP8 FSDP2 dp64", 64, 8, "mi325x", LLAMA31_70B_FP8_FSDP2, 19.1249, 256, 8192),
            ("U1 Llama-2-7B FP8 dp64", 64, 8, "mi325x", RUNS / "primus_llama2_7b_fp8_64xmi325x.yaml",
             6.4027, 2048, 4096),
            ("U2 Llama-2-70B FP8 FSDP2 dp16", 16, 2, "mi325x",
             RUNS / "primus_llama2_70b_fp8_fsdp2_16xmi325x.yaml", 92.6319, 640, 4096),
            ("U3 Mixtral-8x7B BF16 ep8 dp64", 64, 8, "mi325x",
             RUNS / "primus_mixtral_8x7b_bf16_ep8_64xmi325x.yaml", 3.0995, 256, 4096)]
    return [Case(SOURCE, name, gpus, {}, "tokens/s/GPU", gbs * seq / (step * gpus), _tokens, note=f"step {step} s",
                 script=run if isinstance(run, str) else "", config=str(run) if isinstance(run, Path) else "",
                 hardware=device, nodes=nodes)
            for name, gpus, nodes, device, run, step, gbs, seq in runs]


def main() -> int:
    return accuracy_main(cases(), "on tokens/s/GPU; the runs and their sources are in the module docstring")


if __name__ == "__main__":
    sys.exit(main())
