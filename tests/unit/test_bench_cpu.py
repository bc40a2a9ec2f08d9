"""`projection calibrate gemm | attention | collective` on the CPU with tiny shapes: valid Calibration JSON with
provenance, the BLAS shapes actually run, the shapes of --config, and a calibrated cost model that prices the job's
ops from the measured rows. The collective run spawns 2 gloo processes."""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

import pytest
import torch

from projection import api, cli_calibrate
from projection.calibrate import cli_bench
from projection.calibrate.bench_common import Progress
from projection.calibrate.bench_gemm import GemmShape, gemm_callable
from projection.calibrate.calibration import load_calibration
from projection.cost.calibrated import CalibratedCostModel
from projection.workload.ops import layer_ops

TINY = """\
model:
  name: tiny-llama
  num_layers: 2
  hidden_size: 64
  num_attention_heads: 4
  num_kv_heads: 2
  ffn_hidden_size: 96
  vocab_size: 256
training:
  seq_length: 32
  micro_batch_size: 1
  global_batch_size: 2
  params_dtype: fp32
plan:
  tp: 1
cluster:
  hardware: mi300x
  nodes: 1
  gpus_per_node: 1
"""


def calibrate(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    cli_calibrate.add_parser(parser.add_subparsers(dest="command"), hooks=(cli_bench.register,))
    return cli_calibrate.run(parser.parse_args(["calibrate", *argv]))


@pytest.mark.parametrize("layout", ["NN", "NT", "TN", "TT"])
def test_gemm_runs_the_blas_shape(layout: str) -> None:
    """BLAS D[m, n] = op(A) op(B) runs as the row-major C[n, m]; 'T' operands are column-major views."""
    out = gemm_callable(GemmShape(m=24, n=40, k=16, dtype="fp32", layout=layout), torch.device("cpu"))()
    assert isinstance(out, torch.Tensor) and out.shape == (40, 24)


def test_gemm_calibration_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "gemm.json"
    code = calibrate("gemm", "--shape", "64x32x48:TN:fp32", "--shape", "32x32x32:NN:bf16", "--device", "cpu",
                     "--warmup", "1", "--repeat", "3", "--out", str(out))
    assert code == 0
    captured = capsys.readouterr()
    assert "calibrate gemm [" in captured.err and "2/2" in captured.err  # progress bar on stderr
    assert captured.out.startswith(f"wrote {out}: 2 gemm")
    cal = load_calibration(out)
    assert [(r.m, r.n, r.k, r.layout, r.dtype) for r in cal.gemm] == [(64, 32, 48, "TN", "fp32"),
                                                                      (32, 32, 32, "NN", "bf16")]
    assert all(r.time_s > 0 and r.count == 3 and r.source.startswith("R: projection calibrate gemm") for r in cal.gemm)
    prov = cal.provenance[0]
    assert prov.torch_version == torch.__version__ and prov.device_name and prov.device_name.startswith("CPU")
    assert prov.date and prov.command and prov.command.startswith("projection calibrate gemm --device cpu")
    assert "--shape 64x32x48:TN:fp32 --shape 32x32x32:NN:bf16" in prov.command


def test_gemm_on_the_shapes_of_a_config_prices_its_ops(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "tiny.yaml"
    config.write_text(TINY, encoding="utf-8")
    out = tmp_path / "cpu.json"
    assert calibrate("gemm", "--config", str(config), "--device", "cpu", "--warmup", "1", "--repeat", "3",
                     "--quiet", "--out", str(out)) == 0
    capsys.readouterr()
    cal = load_calibration(out)
    sc = api.load(config)
    ops = [o for i in range(2) for o in layer_ops(sc.model, sc.training, sc.plan, i) if o.kind == "gemm"]
    assert {(o.m, o.n, o.k, o.layout) for o in ops} <= {(r.m, r.n, r.k, r.layout) for r in cal.gemm}
    model = CalibratedCostModel(cal, name="cpu.json")  # no device spec for a CPU: no roofline fallback
    for o in ops:
        row = next(r for r in cal.gemm if (r.m, r.n, r.k, r.layout) == (o.m, o.n, o.k, o.layout))
        assert model.op_seconds(o) == pytest.approx(row.time_s, rel=1e-9)
        assert model.provenance(o).startswith("calibrated: cpu.json gemm fp32")


def test_attention_calibration_json(capsys: pytest.CaptureFixture[str]) -> None:
    code = calibrate("attention", "--shape", "1x4x2x16x64", "--device", "cpu", "--dtype", "fp32", "--warmup", "1",
                     "--repeat", "3", "--quiet")
    assert code == 0
    doc = json.loads(capsys.readouterr().out)  # no --out: the JSON on stdout
    rows = doc["attention"]
    assert [r["direction"] for r in rows] == ["fwd", "bwd"]
    assert all((r["heads"], r["kv_heads"], r["head_dim"], r["seq_q"], r["causal"]) == (4, 2, 16, 64, True)
               and r["time_s"] > 0 for r in rows)


def test_collective_calibration_with_two_gloo_processes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "coll.json"
    code = calibrate("collective", "--kinds", "all_reduce,all_gather", "--sizes", "4096,64KiB", "--device", "cpu",
                     "--warmup", "1", "--repeat", "3", "--quiet", "--out", str(out))
    assert code == 0, capsys.readouterr().err
    cal = load_calibration(out)
    assert [(r.kind, r.size_bytes, r.n_ranks, r.n_nodes) for r in cal.collective] == [
        ("all_reduce", 4096, 2, 1), ("all_reduce", 65536, 2, 1), ("all_gather", 4096, 2, 1),
        ("all_gather", 65536, 2, 1)]
    assert all(r.time_s > 0 and r.busbw_bytes_per_s > 0 for r in cal.collective)
    assert "gloo" in cal.collective[0].source


def test_memory_calibration_json(capsys: pytest.CaptureFixture[str]) -> None:
    code = calibrate("memory", "--sizes", "3KiB,3MiB", "--dtype", "fp32", "--device", "cpu", "--warmup", "1",
                     "--repeat", "3", "--quiet")
    assert code == 0
    rows = json.loads(capsys.readouterr().out)["memory_bound"]
    assert [r["size_bytes"] for r in rows] == [3 * 1024, 3 * 2**20] and all(r["time_s"] > 0 for r in rows)


def test_user_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert calibrate("gemm", "--shape", "12x34", "--device", "cpu") == 2
    assert "cannot read shape" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert calibrate("gemm", "--shape", "8x8x8", "--device", "cuda") == 2
        assert "sees no GPU" in capsys.readouterr().err
    assert calibrate("collective", "--kinds", "gossip", "--device", "cpu") == 2


def test_progress_bar() -> None:
    stream = io.StringIO()
    bar = Progress(2, "x", stream, width=4)
    bar.step("a")
    bar.step("b")
    assert stream.getvalue().endswith("\rx [####] 2/2 b" + " " * 39 + "\n")


@pytest.mark.parametrize(("argv", "what"), [
    # within the flags' physical bounds (cli_checks: 2**38 elements an operand, 1 TiB a buffer), beyond this host
    (("gemm", "--shape", "500000x500000x500000:TN:fp32"), "the GEMM 500000x500000x500000 fp32 TN"),
    (("attention", "--shape", "1000x64x64x128x30000", "--dtype", "fp32"), "attention b1000 h64/64 d128"),
    (("memory", "--sizes", "1000GiB", "--dtype", "fp32"), "the add over"),
])
def test_a_shape_beyond_the_device_memory_is_a_clear_error(argv: tuple[str, ...], what: str,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """The allocator's failure becomes exit 2 naming the shape and how to benchmark less, not a traceback."""
    assert calibrate(*argv, "--device", "cpu", "--warmup", "0", "--repeat", "1", "--quiet") == 2
    err = capsys.readouterr().err
    assert what in err and "does not fit in the memory of CPU" in err
    assert ("smaller --sizes" if argv[0] == "memory" else "--max-shapes") in err
    assert "Traceback" not in err
