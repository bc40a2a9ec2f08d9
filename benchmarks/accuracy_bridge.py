"""Accuracy of `projection performance` on Megatron-Bridge's published DGX-H100 table, each row as the
ConfigContainer its performance recipe builds.

Run: python3 benchmarks/accuracy_bridge.py

Source: NVIDIA-NeMo/Megatron-Bridge docs/performance-summary.md @df0289c1 (sections "26.02" and "25.11 NeMo
Container", DGX-H100, FP8 current scaling). Each row is a Megatron-Bridge YAML in bridge_runs/perf_*.yaml, written
from the recipe that produced it (scripts/performance/ presets and builders, the megatron-bridge library recipe);
its header quotes the row, cites every source and lists what the recipe sets that a config cannot say (userbuffers
TP-overlap configurations, NCCL user buffers, first and last layers in fp8 too) and what is uncertain. Each file is
loaded by projection's Megatron-Bridge loader as it is, on h100-sxm at the row's GPU count, projected with the
shipped default calibration, and compared on tokens/s/GPU. Validation only: nothing is fitted to it.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from accuracy import Case, _tokens, evaluate  # noqa: E402,F401  (evaluate: for tests/oracle/test_performance_bridge_public.py)
from accuracy import main as accuracy_main  # noqa: E402

SOURCE = "Megatron-Bridge"
RUNS = Path(__file__).resolve().parent / "bridge_runs"

# (name, file, GPUs, published tokens/s/GPU, container of the row)
ROWS = [
    ("B1 Llama3-8B FSDP dp8", "perf_llama3_8b_8xh100_fp8cs.yaml", 8, 14451, "25.11"),
    ("B2 Llama3-70B tp4 pp8 vp5", "perf_llama3_70b_64xh100_fp8cs.yaml", 64, 1621, "26.02"),
    ("B3 Llama3.1-405B tp8 pp8 cp2 vp8", "perf_llama31_405b_1024xh100_fp8cs.yaml", 1024, 311, "26.02"),
    ("B4 Qwen3-30B-A3B pp2 vp24 ep8", "perf_qwen3_30b_a3b_16xh100_fp8cs.yaml", 16, 5275, "25.11"),
    ("B5 Qwen3-235B-A22B tp2 pp8 vp4 ep32", "perf_qwen3_235b_a22b_256xh100_fp8cs.yaml", 256, 1633, "26.02"),
]


def cases() -> list[Case]:
    return [Case(SOURCE, name, gpus, {}, "tokens/s/GPU", float(measured), _tokens, note=f"table {container}",
                 config=str(RUNS / file), hardware="h100-sxm", nodes=gpus // 8)
            for name, file, gpus, measured, container in ROWS]


def main() -> int:
    return accuracy_main(cases(), "on tokens/s/GPU; the rows and their recipes are in bridge_runs/perf_*.yaml")


if __name__ == "__main__":
    sys.exit(main())
