"""Measured by TorchTitan: the projected tokens/s/GPU of every row of pytorch/torchtitan docs/performance.md (the
H100 Tables 1-6 @eaea6f6a and the earlier A100 Llama 3 table @04133643), each a TorchTitan TOML in
benchmarks/torchtitan_runs/ loaded as it is (sources, setups and assumptions in benchmarks/accuracy_torchtitan.py),
with the shipped calibrations, held to issue 6's per-case limit of 20 %; and, where the table publishes Memory(GiB)
(the log's max_reserved_gib: torch.cuda reserved_bytes.all.peak / 2**30, the largest over the GPUs), `projection
memory`'s largest per-rank reserved bytes held to 10 %. Validation only: nothing is fitted to them. Every case beyond
its limit is a strict xfail with the numbers measured on 2026-11-30. The TOMLs are in benchmarks/, so this runs
without ../shared.

The H100 rows ran on 96 GB HBM2e H100s at a 500 W power limit (Grand Teton) and are projected on h100-sxm, the 80 GB
HBM3 700 W part: a projection faster than the measurement is partly expected there, by an amount nothing here
measures. The A100 rows ran on the part they are projected on."""

from __future__ import annotations

import pytest

from tests.oracle.bench_modules import load_benchmark

LIMIT = 0.20  # issue 6: no case beyond 20 %
MEMORY_LIMIT = 0.10

_H100 = ("; the runs' H100s are 96 GB HBM2e parts at the default 500 W power limit, projected as the 700 W HBM3 "
         "h100-sxm (the A100 rows of the same file, projected on their own part, come out +12 % fast)")
_COMPILE = ("; the compile gain is priced (eager TorchTitan's norms, RoPE, SwiGLU and loss kernel by kernel, "
            "compiled blocks as fused kernels: projection/workload/ops_eager.py): +18.5 % in the projection, +15.7 % "
            "measured (T3 +18.7 / +16.2 %)")
_EAGER_FP8 = ("; Float8 on the compiled blocks (per-op checkpointing keeps every second float8 mm output, as "
              "tests/oracle/test_memory_torchtitan_float8_sac.py measures, so half of them are not re-run)" + _H100)
_PP = "; the pipeline split and microbatches are assumed (TorchTitan's defaults of the period, see the TOML)"
_CP = ("; with 32k tokens per GPU in every row, the measured throughput falls 1.5x / 3.6x / 7.1x from CP 1 to "
       "CP 2 / 4 / 8, the projected 1.6x / 2.9x / 5.4x")

PERFORMANCE: dict[str, str | None] = {
    "T1 8B fsdp8": "projected 7,331.6 tokens/s/GPU (2.235 s per step) against 5,762 measured: +27.2 %" + _H100,
    "T1 8B fsdp8 compile": "projected 8,685.8 tokens/s/GPU (1.886 s) against 6,667 measured: +30.3 %" + _COMPILE,
    "T1 8B fsdp8 compile fp8": "projected 11,323.5 tokens/s/GPU (1.447 s) against 8,532 measured: +32.7 %" + _EAGER_FP8,
    "T2 8B fsdp8 cp1 32k": "projected 5,298.3 tokens/s/GPU (6.185 s) against 3,890 measured: +36.2 %" + _H100,
    "T2 8B fsdp4 cp2 64k": "projected 3,231.3 tokens/s/GPU (10.141 s) against 2,540 measured: +27.2 %" + _CP,
    "T2 8B fsdp2 cp4 128k": "projected 1,834.0 tokens/s/GPU (17.867 s) against 1,071 measured: +71.2 %" + _CP,
    "T2 8B fsdp1 cp8 256k": "projected 982.1 tokens/s/GPU (33.365 s) against 548 measured: +79.2 %" + _CP,
    "T3 8B fsdp128": "projected 7,417.2 tokens/s/GPU (2.209 s) against 5,605 measured: +32.3 %" + _H100,
    "T3 8B fsdp128 compile": "projected 8,806.2 tokens/s/GPU (1.861 s) against 6,514 measured: +35.2 %" + _COMPILE,
    "T3 8B fsdp128 compile fp8": ("projected 11,531.0 tokens/s/GPU (1.421 s) against 8,380 measured: +37.6 %"
                                  + _EAGER_FP8),
    "T4 70B fsdp32 tp8": None,  # +18.7 % (983.8 projected, 829 measured), 2026-12-01
    "T4 70B fsdp32 tp8 asyncTP": ("projected 1,195.9 tokens/s/GPU (13.700 s) against 876 measured: +36.5 % "
                                  "(2026-12-02, its matmuls priced as the tp pieces async TP splits them into, "
                                  "perf/tp_overlap.py; +33.1 % before); async TP gains 21.6 % in the projection "
                                  "and 5.7 % in the measurement" + _H100),
    "T5 405B 3D 1F1B": "projected 143.5 tokens/s/GPU (28.534 s) against 100 measured: +43.5 %" + _PP + _H100,
    "T5 405B 3D interleaved": ("projected 206.3 tokens/s/GPU (19.851 s, torch's lock-step runtime of the period) "
                               "against 128 measured: +61.2 % (2026-12-02; +70.0 % before the TP-overlapped matmuls "
                               "were priced split, +75.8 % before 2026-12-01); Interleaved 1F1B gains 44 % over "
                               "1F1B in the projection and 28 % in the measurement" + _PP),
    "T6 405B 4D fsdp8 cp1 32k": "projected 104.3 tokens/s/GPU (39.263 s) against 76 measured: +37.3 %" + _PP + _H100,
    "T6 405B 4D fsdp4 cp2 64k": "projected 72.9 tokens/s/GPU (56.221 s) against 47 measured: +55.0 %" + _PP,
    "T6 405B 4D fsdp2 cp4 128k": "projected 47.0 tokens/s/GPU (87.233 s) against 31 measured: +51.5 %" + _PP,
    "T6 405B 4D fsdp1 cp8 256k": "projected 25.5 tokens/s/GPU (160.860 s) against 16 measured: +59.1 %" + _PP,
    # eager FSDP2 rows on the part they ran on, within the limit since the eager elementwise chains are priced
    # (2026-11-30; before: +26.6 / +29.0 / +20.1 %)
    "A 8B fsdp64 sel layer": None,  # 3,172.4 projected, 2,904 measured: +9.2 %
    "A 8B fsdp64 sel op": None,  # 3,242.4 projected, 2,973 measured: +9.1 %
    "A 70B fsdp64 full": None,  # 359.9 projected, 331 measured: +8.7 %
}

_FP8_MEM = ("; Float8 keeps what the compiled bf16 row keeps, in the measurement (77.0 / 62.0 -> 76.8 / 61.8 GiB) as "
            "in the projection since torchao's mm outputs are counted under op SAC")
_RESERVED = ("; reserved bytes are projected with expandable segments (the loader's TorchTitan default: no "
             "fragmentation allowance); nothing here measures the runs' allocator settings")

# name -> the strict-xfail reason of the memory comparison (None: within MEMORY_LIMIT), as measured 2026-11-30 (the
# pipeline rows 2026-12-01, with torch 2.7's output_chunks)
MEMORY: dict[str, str | None] = {
    "T1 8B fsdp8": "82.4 GiB max reserved measured, projected 71.6 GiB: -13.1 %" + _RESERVED,
    "T1 8B fsdp8 compile": "77.0 GiB measured, projected 67.6 GiB: -12.2 %" + _RESERVED,
    "T1 8B fsdp8 compile fp8": "76.8 GiB measured, projected 67.4 GiB: -12.3 %" + _FP8_MEM,
    "T2 8B fsdp8 cp1 32k": "83.9 GiB measured, projected 72.4 GiB: -13.7 %" + _RESERVED,
    "T2 8B fsdp4 cp2 64k": "84.2 GiB measured, projected 72.4 GiB: -14.0 %" + _RESERVED,
    "T2 8B fsdp2 cp4 128k": "84.0 GiB measured, projected 72.4 GiB: -13.8 %" + _RESERVED,
    "T2 8B fsdp1 cp8 256k": "84.5 GiB measured, projected 72.6 GiB: -14.0 %" + _RESERVED,
    "T3 8B fsdp128": "67.0 GiB measured, projected 57.6 GiB: -14.1 %" + _RESERVED,
    "T3 8B fsdp128 compile": "62.0 GiB measured, projected 53.6 GiB: -13.6 %" + _RESERVED,
    "T3 8B fsdp128 compile fp8": "61.8 GiB measured, projected 53.4 GiB: -13.7 %" + _FP8_MEM,
    "T4 70B fsdp32 tp8": "71.9 GiB measured, projected 58.8 GiB: -18.2 %" + _RESERVED,
    "T4 70B fsdp32 tp8 asyncTP": ("67.6 GiB measured, projected 58.8 GiB: -13.0 %; async TP changes no projected "
                                  "byte while the measurement drops 4.3 GiB" + _RESERVED),
    "T5 405B 3D 1F1B": "82.5 GiB measured (largest GPU), projected 60.2 GiB (largest rank): -27.0 %" + _PP,
    "T5 405B 3D interleaved": "72.7 GiB measured (largest GPU), projected 60.5 GiB: -16.8 %" + _PP,
    "T6 405B 4D fsdp8 cp1 32k": "75.3 GiB measured (largest GPU), projected 60.2 GiB: -20.0 %" + _PP,
    "T6 405B 4D fsdp4 cp2 64k": "75.9 GiB measured (largest GPU), projected 60.2 GiB: -20.6 %" + _PP,
    "T6 405B 4D fsdp2 cp4 128k": "77.1 GiB measured (largest GPU), projected 60.2 GiB: -21.9 %" + _PP,
    "T6 405B 4D fsdp1 cp8 256k": "84.9 GiB measured (largest GPU), projected 66.2 GiB: -22.1 %" + _PP,
}


def _params(table: dict[str, str | None]) -> list[object]:
    return [pytest.param(name, id=name.replace(" ", "-")) if reason is None else
            pytest.param(name, id=name.replace(" ", "-"), marks=pytest.mark.xfail(
                strict=True, reason=f"measured 2026-12-01: {name}: {reason}"))
            for name, reason in table.items()]


def _case(name: str) -> object:
    mod = load_benchmark("accuracy_torchtitan")
    (case,) = [c for c in mod.cases() if c.name == name]
    return case


def test_every_published_row_is_listed() -> None:
    mod = load_benchmark("accuracy_torchtitan")
    assert [c.name for c in mod.cases()] == list(PERFORMANCE)
    assert list(mod.measured_memory_gib()) == list(MEMORY)


@pytest.mark.parametrize("name", _params(PERFORMANCE))
def test_tokens_per_second(name: str) -> None:
    mod = load_benchmark("accuracy_torchtitan")
    case = _case(name)
    (row,) = mod.evaluate([case])
    print(f"\n{case.name} on {case.gpus} x {case.hardware}: measured {case.measured:.1f} tokens/s/GPU, projected "
          f"{row.projected:.1f} ({row.error:+.1%}), step {row.step_time_s:.3f} s ({case.note})")
    assert abs(row.error) <= LIMIT


@pytest.mark.parametrize("name", _params(MEMORY))
def test_max_reserved_memory(name: str) -> None:
    mod = load_benchmark("accuracy_torchtitan")
    case = _case(name)
    measured = mod.measured_memory_gib()[name]
    projected = mod.projected_reserved_gib(case)
    print(f"\n{name}: max reserved measured {measured:.1f} GiB, projected {projected:.1f} GiB "
          f"({projected / measured - 1:+.1%})")
    assert abs(projected / measured - 1) <= MEMORY_LIMIT
