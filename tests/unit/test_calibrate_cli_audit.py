"""`projection calibrate` details an audit found: the provenance command dropped `--warmup 0` (so a re-run warmed
up 3 times), `--max-shapes` kept the first given shapes rather than the largest, and every reduce-scatter run
printed torch's deprecation warning for reduce_scatter_tensor."""

from __future__ import annotations

import argparse
import warnings

from projection.calibrate.cli_bench import _command, attention_shapes, gemm_shapes


def _args(**kw: object) -> argparse.Namespace:
    base = {"calibrate_name": "gemm", "shape": [], "config": None, "dtype": None, "max_shapes": 8, "warmup": 3,
            "repeat": 10, "device": "cpu"}
    return argparse.Namespace(**{**base, **kw})


def test_warmup_zero_is_recorded() -> None:
    assert "--warmup 0" in _command(_args(warmup=0))
    assert "--warmup 3" in _command(_args())


def test_max_shapes_keeps_the_largest_given() -> None:
    (kept,) = gemm_shapes(_args(shape=["64x64x64", "512x512x512"], max_shapes=1))
    assert (kept.m, kept.n, kept.k) == (512, 512, 512)
    (att,) = attention_shapes(_args(calibrate_name="attention", shape=["1x2x2x16x64", "1x2x2x16x256"], max_shapes=1))
    assert att.seq_q == 256


def test_reduce_scatter_runs_without_a_deprecation_warning() -> None:
    import torch
    import torch.distributed as dist

    from projection.calibrate.bench_collective import _runner

    if not dist.is_available():
        return
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", FutureWarning)
            _runner("reduce_scatter", 1024, 1, 0, torch.device("cpu"))()
    finally:
        dist.destroy_process_group()


def test_the_add_curve_is_measured_in_the_jobs_dtype() -> None:
    """`calibrate memory --config` measured its generic add in bf16 whatever the job, and that curve priced an fp32
    job's memory-bound ops (+70 % on the audit's CPU, where bf16 adds run 3.3x slower per byte)."""
    from pathlib import Path

    from projection.calibrate.cli_bench import _job_dtype

    example = str(Path(__file__).resolve().parents[2] / "examples" / "llama3_8b_inline.yaml")
    base = {"config": example, "hardware": None, "nodes": None, "gpus_per_node": None, "primus_root": None}
    assert _job_dtype(argparse.Namespace(**base, set=None)) == "bf16"
    assert _job_dtype(argparse.Namespace(**base, set=["training.params_dtype=fp32"])) == "fp32"
    assert _job_dtype(argparse.Namespace(**{**base, "config": None}, set=None)) is None


def test_fp8_on_a_cpu_is_refused_before_anything_runs(capsys: object, monkeypatch: object) -> None:
    """An audit's fp32 shape ran first, then the fp8 one failed with key '--dtype' at '<input>', mid progress bar."""
    from projection.calibrate import cli_bench
    from projection.cli import main

    def never(*_: object, **__: object) -> None:
        raise AssertionError("a shape was benchmarked before the refusal")

    monkeypatch.setattr(cli_bench, "bench_gemms", never)  # type: ignore[attr-defined]
    assert main(["calibrate", "gemm", "--device", "cpu", "--shape", "2048x2048x2048:TN:fp32", "--shape",
                 "64x64x64:TN:fp8"]) == 2
    err = capsys.readouterr().err  # type: ignore[attr-defined]
    assert "<command line>: key '--shape': fp8 GEMMs need a GPU" in err


def test_a_tf32_row_is_timed_with_tf32_matmuls_on_and_the_setting_restored(monkeypatch: object) -> None:
    """tf32 rows were plain fp32 timings (torch keeps fp32 matmuls off TF32 by default; an audit found nothing in
    projection turning it on)."""
    import torch

    from projection.calibrate import bench_gemm

    seen: list[bool] = []

    def timed(fn: object, *_: object) -> float:
        seen.append(torch.backends.cuda.matmul.allow_tf32)
        return 1e-3

    monkeypatch.setattr(bench_gemm, "time_call", timed)  # type: ignore[attr-defined]
    shapes = [bench_gemm.GemmShape(64, 64, 64, "tf32"), bench_gemm.GemmShape(64, 64, 64, "fp32")]
    before = torch.backends.cuda.matmul.allow_tf32
    bench_gemm.bench_gemms(shapes, torch.device("cpu"), warmup=0, repeat=1)
    assert seen == [True, False] and torch.backends.cuda.matmul.allow_tf32 == before


def test_the_attention_backward_is_timed_alone(monkeypatch: object) -> None:
    """The backward row was median(forward + backward) - median(forward): a noisy forward run left it at 0.28x an
    own timing (an audit). It is now timed alone, each call's forward run untimed before it."""
    import torch

    from projection.calibrate import bench_attention

    calls: list[bool] = []

    def timed(fn: object, device: object, warmup: int, repeat: int, setup: object = None) -> float:
        calls.append(setup is not None)
        if setup is not None:
            setup()  # type: ignore[operator]
        fn()  # type: ignore[operator]
        return 2e-3 if setup is not None else 1e-3

    monkeypatch.setattr(bench_attention, "time_call", timed)  # type: ignore[attr-defined]
    rows = bench_attention.bench_attention([bench_attention.AttentionShape(1, 2, 2, 16, 32, 32, dtype="fp32")],
                                           torch.device("cpu"), warmup=0, repeat=1)
    assert calls == [False, True] and [r.time_s for r in rows] == [1e-3, 2e-3]
