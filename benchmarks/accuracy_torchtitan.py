"""Accuracy of `projection performance` (and `projection memory`) on TorchTitan's published training performance.

Run: python3 benchmarks/accuracy_torchtitan.py

TorchTitan publishes its measured throughput in pytorch/torchtitan `docs/performance.md`. Each published row is a
TorchTitan TOML in benchmarks/torchtitan_runs/, written here from the row's setup in TorchTitan's own (v0.2) config
layout, with a header citing the file, commit and row, the measured numbers, and what the table leaves unstated
(tagged A, with the TorchTitan source of the period it is taken from). Each is loaded by projection's TorchTitan loader
on the named device, projected with the shipped default calibration and no per-case constant, and compared on
tokens/s/GPU. Validation only: nothing is fitted to these numbers.

Source H (18 cases): pytorch/torchtitan docs/performance.md @ eaea6f6a2fa940f03a10906be1df3489cf30af85, Tables 1-6,
measured with torch 1963fc8 (2024-12-23), torchao eab345c and torchtitan 9dec370 (2024-12-26). TPS/GPU logged every
10 iterations, read at iteration 90 (train.py divides the rank's tokens by time x CP x TP x PP, i.e. global tokens /
(step time x GPUs)). Memory(GiB) is the log line's `max_reserved_gib`: torch.cuda.memory_stats()
["reserved_bytes.all.peak"] / 2**30 (GiB, not GB; reserved, not active or allocated; torchtitan/metrics.py
DeviceMemoryMonitor.get_peak_stats), the largest over all GPUs (the doc's footnote 1), compared with projection's
largest per-rank `reserved_bytes`.
* T1 Llama 3.1 8B, 8 GPUs, FSDP 8, local batch 2, selective AC: FSDP 5,762 TPS/GPU 82.4 GiB; + torch.compile 6,667
  77.0; + compile + Float8 8,532 76.8.
* T2 Llama 3.1 8B, 8 GPUs, FSDP + CP + compile + Float8, local batch 1, full AC: FSDP 8 CP 1 seq 32k 3,890 83.9;
  FSDP 4 CP 2 64k 2,540 84.2; FSDP 2 CP 4 128k 1,071 84.0; FSDP 1 CP 8 256k 548 84.5.
* T3 as T1 on 128 GPUs (FSDP 128): 5,605 67.0; 6,514 62.0; 8,380 61.8.
* T4 Llama 3.1 70B, 256 GPUs, FSDP 32 TP 8, local batch 16, compile + Float8, full AC: 2D 829 71.9; + async TP
  876 67.6.
* T5 Llama 3.1 405B, 512 GPUs, FSDP 8 TP 8 PP 8, local batch 32, compile + Float8 + async TP, full AC: 1F1B 100
  82.5; Interleaved 1F1B 128 72.7.
* T6 Llama 3.1 405B, 512 GPUs, TP 8 PP 8 1F1B, local batch 8, compile + Float8 + async TP, full AC: FSDP 8 CP 1
  seq 32k 76 75.3; FSDP 4 CP 2 64k 47 75.9; FSDP 2 CP 4 128k 31 77.1; FSDP 1 CP 8 256k 16 84.9.
Assumed for H (A, each TOML says where from): sequence 8192 where the table gives none (the llama3 train_configs of
the period); selective AC = op-level SAC ('op', llama3_8b.toml); the loss not compiled (train.py of the period:
"TODO: compiling loss function causes CUDA errors"), so [compile] names the model only; Float8 = torchao tensorwise
dynamic scaling on every nn.Linear but `output`, with FSDP float8 all-gather and precomputed scales (docs/float8.md)
and the float8 TP plan; PP split and microbatches as TorchTitan then built them with none given (generate_split_points,
n_microbatches = stages: 1F1B 8 x 4 sequences, Interleaved 1F1B 16 x 2, T6 8 x 1); PYTORCH_CUDA_ALLOC_CONF=
expandable_segments:True (set by run_llama_train.sh of the period, the loader's TorchTitan default; the multi-node
launcher the runs used is not published). CP is priced as projection's ring exchange of K/V chunks; TorchTitan's
context_parallel_rotate_method (all-gather or all-to-all) is not a key projection reads.

HARDWARE CAVEAT (H): TorchTitan ran on Meta's Grand Teton hosts: 8 NVIDIA H100 per host fully connected with NVLink,
each H100 with 96 GB HBM2e at 2.4 TB/s peak bandwidth, 400 Gb/s RDMA per GPU, at the default 500 W power limit (the
doc: "tuning it up to 700W TDP can potentially provide further speedups"; its footnote 2: an "HBM2e-based SXM H100
with lower TDP", peak TFLOP/s "between SXM and NVL", exact value unknown). projection has no spec for that part: the
cases are projected on h100-sxm, the H100 SXM5 80 GB HBM3 (3.35 TB/s) 700 W part, so a faster projection is expected
on the compute- and memory-bound terms, by an amount nothing here measures. Memory bytes do not depend on the device;
only the table's fit verdict does, and it is against the 80 GB part (the runs had 96 GB).

Source A (3 cases): the same file at an earlier version, pytorch/torchtitan docs/performance.md @
041336434916bdc0f88c1f89fda176fd3c2092e4 (2024, superseded by the tables above), "Llama 3 performance numbers": Llama
3 with FSDP2 on 64 A100 (80GB), local batch 1, no memory published: 8B selective layer 2,904 WPS (56.8 % MFU); 8B
selective op 2,973 (58.2 %); 70B full 331 (51.7 %). Projected on a100-80g, the part the doc names. A: sequence 8192,
no compile, no Float8 (llama3_8b.toml, "a preset for 64 A100 GPUs", of the period); "selective layer" = the JobConfig
default selective_ac_option "2" (every other layer); 8 GPUs per node.

Not scored:
* The Llama 2 13B / 70B table of the 2024 version (64 A100): TorchTitan v0.1/v0.2, whose configs the loader reads,
  have no llama2 train spec, and projection's TorchTitan flavor table has none (llama3, llama4, deepseek_v3, qwen3).
* The 2024 interim version's Llama 3.1 405B table (128 H100 "94GB", TP 8 x FSDP 16, local batch 2, full AC: 109 /
  177 / 185 WPS for none / Float8 / Float8 + async TP): whether torch.compile was on in the first two rows and which
  float8 options were used is not stated, and that version's commit could not be pinned from the code index.
* MFU columns: a different FLOP count (TorchTitan's 6N + attention formula) of the same measured throughput.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from accuracy import Case, _tokens, evaluate  # noqa: E402,F401  (evaluate: for tests/oracle/test_performance_torchtitan_public.py)
from accuracy import main as accuracy_main  # noqa: E402

RUNS = Path(__file__).resolve().parent / "torchtitan_runs"  # one TorchTitan TOML per published row, each citing it
SOURCE_H = "TorchTitan H100"   # docs/performance.md @eaea6f6a, Grand Teton H100 96 GB HBM2e, 500 W
SOURCE_A = "TorchTitan A100"   # docs/performance.md @04133643, 64 A100 80 GB

# (name, TOML stem, GPUs, device, measured TPS/GPU, measured max reserved GiB or None)
RUNS_TABLE: list[tuple[str, str, int, str, float, float | None]] = [
    ("T1 8B fsdp8", "t1_llama31_8b_fsdp8", 8, "h100-sxm", 5762, 82.4),
    ("T1 8B fsdp8 compile", "t1_llama31_8b_fsdp8_compile", 8, "h100-sxm", 6667, 77.0),
    ("T1 8B fsdp8 compile fp8", "t1_llama31_8b_fsdp8_compile_float8", 8, "h100-sxm", 8532, 76.8),
    ("T2 8B fsdp8 cp1 32k", "t2_llama31_8b_fsdp8_cp1_seq32k", 8, "h100-sxm", 3890, 83.9),
    ("T2 8B fsdp4 cp2 64k", "t2_llama31_8b_fsdp4_cp2_seq64k", 8, "h100-sxm", 2540, 84.2),
    ("T2 8B fsdp2 cp4 128k", "t2_llama31_8b_fsdp2_cp4_seq128k", 8, "h100-sxm", 1071, 84.0),
    ("T2 8B fsdp1 cp8 256k", "t2_llama31_8b_fsdp1_cp8_seq256k", 8, "h100-sxm", 548, 84.5),
    ("T3 8B fsdp128", "t3_llama31_8b_fsdp128", 128, "h100-sxm", 5605, 67.0),
    ("T3 8B fsdp128 compile", "t3_llama31_8b_fsdp128_compile", 128, "h100-sxm", 6514, 62.0),
    ("T3 8B fsdp128 compile fp8", "t3_llama31_8b_fsdp128_compile_float8", 128, "h100-sxm", 8380, 61.8),
    ("T4 70B fsdp32 tp8", "t4_llama31_70b_fsdp32_tp8", 256, "h100-sxm", 829, 71.9),
    ("T4 70B fsdp32 tp8 asyncTP", "t4_llama31_70b_fsdp32_tp8_asynctp", 256, "h100-sxm", 876, 67.6),
    ("T5 405B 3D 1F1B", "t5_llama31_405b_fsdp8_tp8_pp8_1f1b", 512, "h100-sxm", 100, 82.5),
    ("T5 405B 3D interleaved", "t5_llama31_405b_fsdp8_tp8_pp8_interleaved1f1b", 512, "h100-sxm", 128, 72.7),
    ("T6 405B 4D fsdp8 cp1 32k", "t6_llama31_405b_fsdp8_cp1_tp8_pp8_seq32k", 512, "h100-sxm", 76, 75.3),
    ("T6 405B 4D fsdp4 cp2 64k", "t6_llama31_405b_fsdp4_cp2_tp8_pp8_seq64k", 512, "h100-sxm", 47, 75.9),
    ("T6 405B 4D fsdp2 cp4 128k", "t6_llama31_405b_fsdp2_cp4_tp8_pp8_seq128k", 512, "h100-sxm", 31, 77.1),
    ("T6 405B 4D fsdp1 cp8 256k", "t6_llama31_405b_fsdp1_cp8_tp8_pp8_seq256k", 512, "h100-sxm", 16, 84.9),
    ("A 8B fsdp64 sel layer", "a100_llama3_8b_fsdp64_sel_layer", 64, "a100-80g", 2904, None),
    ("A 8B fsdp64 sel op", "a100_llama3_8b_fsdp64_sel_op", 64, "a100-80g", 2973, None),
    ("A 70B fsdp64 full", "a100_llama3_70b_fsdp64_full", 64, "a100-80g", 331, None),
]
GPUS_PER_NODE = 8
# Source H's torch: the nightly of commit 1963fc8 (2024-12-23), after the 2.6 branch cut, so a 2.7 pre-release: its
# ScheduleInterleaved1F1B ran on PipelineScheduleMulti's lock-step time steps (ParallelPlan.pipeline_runtime)
TORCH_H = "2.7.0a0+git1963fc8"
GiB = 2**30


def cases() -> list[Case]:
    """One Case per published row: its TOML loaded as it is on the device and node count the row ran on."""
    return [Case(SOURCE_A if name.startswith("A ") else SOURCE_H, name, gpus, {}, "tokens/s/GPU", float(tps), _tokens,
                 note=f"max reserved {mem} GiB" if mem is not None else "no memory published",
                 config=str(RUNS / f"{stem}.toml"), hardware=device, nodes=gpus // GPUS_PER_NODE,
                 pytorch="" if name.startswith("A ") else TORCH_H)
            for name, stem, gpus, device, tps, mem in RUNS_TABLE]


def measured_memory_gib() -> dict[str, float]:
    """The published Memory(GiB) column (max reserved, GiB, largest over the GPUs) by case name."""
    return {name: mem for name, _, _, _, _, mem in RUNS_TABLE if mem is not None}


def projected_reserved_gib(case: Case) -> float:
    """`projection memory`'s reserved-bytes peak of the case, the largest over its pipeline ranks, in GiB."""
    from projection import api

    # on the torch the row ran (up to 2.9 each input's gradient stays on its pipeline receive buffer)
    sc = api.load(Path(case.config), hardware=case.hardware, nodes=case.nodes, pytorch=case.pytorch or None)
    return max(r.reserved_bytes for r in api.estimate_memory(sc).ranks) / GiB


def main() -> int:
    rc = accuracy_main(cases(), "on tokens/s/GPU; the rows and their sources are in the module docstring")
    print("\nmemory (max reserved GiB, largest rank): measured vs `projection memory`")
    mem = measured_memory_gib()
    for case in cases():
        if case.name in mem:
            proj = projected_reserved_gib(case)
            print(f"  {case.name:<28} {mem[case.name]:>6.1f} {proj:>7.1f} {proj / mem[case.name] - 1:>+7.1%}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
