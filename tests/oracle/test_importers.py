"""Importers against the fixture files of shared/fixtures (sources in fixtures/README.md):

* every nccl-tests log: each printed algbw / busbw is read back exactly, and recomputed from the printed time, size
  and rank count with the bus factor of hardware.md §0, equal to the printed value to its printed precision;
* every hipblaslt-bench row: the printed hipblaslt-Gflops recomputed from m, n, k, batch and us;
* the Kineto traces: the GEMM rows of TraceLens's reference perf reports (traces/expected/*/GEMM.csv: shape, call
  count, FLOP, kernel time mean and sum, TFLOP/s mean, to the traces' 1 ns timestamp resolution) and the collective
  rows of its coll_analysis.csv;
* files that hold no benchmark table raise CalibrationError.
The expected values are parsed here from the files themselves, independently of the package's parsers."""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import re
import shutil
from decimal import Decimal
from pathlib import Path

import pytest

from projection.calibrate.calibration import (
    Calibration,
    CollectiveRow,
    GemmRow,
    Provenance,
    blas_from_torch,
    load_calibration,
    merge_calibrations,
    normalize_dtype,
)
from projection.calibrate.errors import CalibrationError
from projection.calibrate.import_hipblaslt import import_hipblaslt, read_te_algo_shapes
from projection.calibrate.import_nccl import parse_nccl_text
from projection.calibrate.import_trace import (
    import_trace,
    load_trace,
    summarize_gemms,
    trace_collective_calls,
    trace_gemm_calls,
)
from projection.calibrate.importers import detect_format, import_file, import_files
from projection.cli_calibrate import add_parser, run
from projection.cost.collectives import bus_factor

FIXTURES = Path(__file__).resolve().parents[2].parent / "shared" / "fixtures"
COLLECTIVES = FIXTURES / "collectives"
GEMM = FIXTURES / "gemm"
TRACES = FIXTURES / "traces"
LOGS = sorted(COLLECTIVES.glob("*.log")) if COLLECTIVES.is_dir() else []
# superbenchmark logs have no collective name inside: the file name says which one ran (fixtures/README.md)
KIND_OF_FILE = {"nccl_allgather": "all_gather", "nccl_allreduce": "all_reduce", "nccl_alltoall": "all_to_all",
                "nccl_broadcast": "broadcast", "nccl_reduce": "reduce", "nccl_reducescatter": "reduce_scatter",
                "image_classification_mxnet_1x8x400_240501022708975460797_nccl": "all_reduce"}


@pytest.fixture(autouse=True)
def _need_fixtures() -> None:
    if not FIXTURES.is_dir():
        pytest.skip("shared fixtures absent (user clone)")


def half_ulp(token: str) -> Decimal:
    """Half a unit in the last printed place of a decimal token ('4200.3' -> 0.05, '16215' -> 0.5)."""
    exponent = Decimal(token).as_tuple().exponent
    assert isinstance(exponent, int)
    return Decimal(1).scaleb(exponent) / 2


def printed_rows(path: Path) -> list[tuple[int, int, list[str]]]:
    """(line number, size, [time, algbw, busbw] x 2 halves as printed) for each data line, read from the right."""
    out = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        tokens = line.split()
        if len(tokens) >= 11 and tokens[0].isdigit() and tokens[1].isdigit() and not line.lstrip().startswith("#"):
            tail = tokens[-8:]
            out.append((number, int(tokens[0]), tail[0:3] + tail[4:7]))
    return out


@pytest.mark.parametrize("log", LOGS, ids=[p.stem[:40] for p in LOGS])
def test_nccl_columns_reproduced_exactly(log: Path) -> None:
    cal = import_file(log)
    rows = cal.collective
    printed = printed_rows(log)
    assert len(rows) == 2 * len(printed) > 0
    kind = KIND_OF_FILE[log.stem]
    for (number, size, values), (out_row, in_row) in zip(printed, zip(rows[::2], rows[1::2], strict=True),
                                                           strict=True):
        for row, (time, algbw, busbw) in ((out_row, values[:3]), (in_row, values[3:])):
            assert (row.kind, row.n_ranks, row.n_nodes, row.size_bytes) == (kind, 8, 1, size)
            assert row.source.endswith(f":{number}") and row.in_place == (row is in_row)
            # read back exactly as printed
            assert f"{row.algbw_bytes_per_s / 1e9:.2f}" == algbw and f"{row.busbw_bytes_per_s / 1e9:.2f}" == busbw
            assert row.time_s == pytest.approx(float(time) * 1e-6, rel=1e-12)
            # recomputed from the printed time (within half its last place), size and the bus factor
            t_lo, t_hi = (Decimal(time) - half_ulp(time)) * Decimal("1e-6"), (Decimal(time) + half_ulp(time)) * \
                Decimal("1e-6")
            factor = Decimal(repr(bus_factor(kind, 8)))
            for printed_value, scale in ((algbw, Decimal(1)), (busbw, factor)):
                hi = Decimal(size) / t_lo / Decimal(10**9) * scale
                lo = Decimal(size) / t_hi / Decimal(10**9) * scale
                tol = half_ulp(printed_value)
                assert lo - tol <= Decimal(printed_value) <= hi + tol, (number, printed_value, lo, hi)


def test_nccl_headers_give_kind_ranks_nodes_device_and_command() -> None:
    cal = import_file(COLLECTIVES / "image_classification_mxnet_1x8x400_240501022708975460797_nccl.log")
    row = cal.collective[0]
    assert (row.kind, row.n_ranks, row.n_nodes, row.dtype, row.size_bytes) == ("all_reduce", 8, 1, "fp16", 53687090)
    assert f"{row.busbw_bytes_per_s / 1e9:.2f}" == "327.37"
    prov = cal.provenance[0]
    assert prov.device_name == "NVIDIA H100 80GB HBM3" and "all_reduce_perf_mpi" in (prov.command or "")
    a100 = import_file(COLLECTIVES / "nccl_allgather.log")
    assert a100.provenance[0].device_name == "A100-SXM4-40GB" and {r.dtype for r in a100.collective} == {"fp32"}


NEW_LAYOUT = """\
## single node
```bash
$ mpirun -np 8 ./build/all_gather_perf -b 1M -e 2M -f 2 -g 1
# nThread 1 nGpus 1 minBytes 1048576 maxBytes 2097152 step: 2(factor) warmup iters: 5 iters: 20 validation: 1
#
rccl-tests: Version develop:0123abc
# Using devices
#  Rank  0 Group  0 Pid  101 on node-a device  0 [0000:05:00] AMD Instinct MI300X
#  Rank  1 Group  0 Pid  102 on node-a device  1 [0000:25:00] AMD Instinct MI300X
#  Rank  2 Group  0 Pid  103 on node-b device  0 [0000:05:00] AMD Instinct MI300X
#  Rank  3 Group  0 Pid  104 on node-b device  1 [0000:25:00] AMD Instinct MI300X
RCCL version : 2.22.3-HEAD:7d8d67c
#
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
node-a:1:1 [0] NCCL INFO comm 0x1 rank 0 nranks 4 cudaDev 0 busId 5000 - Init COMPLETE
           0             0  bfloat16    none      -1     2.00    0.00    0.00    N/A     2.00    0.00    0.00    N/A
     1048576        131072  bfloat16    none      -1    50.00   20.97   15.73    N/A    52.00   20.16   15.12    N/A
     2097152        262144  bfloat16    none      -1    60.00   34.95   26.21      0    61.00   34.38   25.78      0
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 13.7
```
### excerpt of a multi-node sweep
```
====== 2-node ======
  4294967296    1073741824     float    none      -1    23192  185.19  173.62      0    23209  185.06  173.49      0
```
"""


def test_new_layout_fenced_blocks_and_banners() -> None:
    cal = parse_nccl_text(NEW_LAYOUT, "readme.md")
    first, second = cal.collective[:6], cal.collective[6:]
    assert {(r.kind, r.n_ranks, r.n_nodes, r.dtype, r.device) for r in first} == {
        ("all_gather", 4, 2, "bf16", "AMD Instinct MI300X")}
    assert [r.size_bytes for r in first] == [0, 0, 1048576, 1048576, 2097152, 2097152]
    assert f"{first[3].busbw_bytes_per_s / 1e9:.2f}" == "15.12" and first[3].in_place
    # the excerpt: the banner starts a new run and says 2 nodes; the kind carries over from the last binary name
    # (all_gather_perf), the rank count comes from the busbw / algbw ratio (173.62 / 185.19 = (n - 1) / n, n = 16)
    assert [(r.kind, r.n_ranks, r.n_nodes) for r in second] == [("all_gather", 16, 2)] * 2
    with pytest.raises(CalibrationError, match="cannot tell how many ranks"):  # 2 (n-1) / n: no all_gather ratio
        parse_nccl_text(NEW_LAYOUT.replace("173.62", "347.23"), "readme.md")
    with pytest.raises(CalibrationError, match=r"busbw / algbw = 1\.500 .* all_gather over 4 ranks"):
        parse_nccl_text(NEW_LAYOUT.replace("34.95   26.21", "34.95   52.42"), "readme.md")
    assert cal.provenance[0].library_versions == {"rccl-tests": "develop:0123abc", "rccl": "2.22.3-HEAD:7d8d67c"}
    with pytest.raises(CalibrationError, match="no nccl-tests"):
        parse_nccl_text("# just a comment\nhello 1 2 3\n", "x.log")
    # a table whose sizes restart (a second data type) keeps its header and device list
    two_types = NEW_LAYOUT.replace("# Out of bounds", "     1048576        262144     float    none      -1    "
                                   "50.00   20.97   15.73    N/A    52.00   20.16   15.12    N/A\n# Out of bounds")
    extra = parse_nccl_text(two_types, "readme.md").collective[6:8]
    assert [(r.dtype, r.n_ranks, r.n_nodes, r.device) for r in extra] == [("fp32", 4, 2, "AMD Instinct MI300X")] * 2


def read_hipblaslt(path: Path) -> list[dict[str, str]]:
    rows, header = [], None
    for line in path.read_text(encoding="utf-8").splitlines():
        line = re.sub(r"^\[\d+\]", "", line.strip())
        if line.startswith("transA,"):
            header = line.split(",")
        elif header and line.count(",") == len(header) - 1:
            rows.append(dict(zip(header, (v.strip() for v in line.split(",")), strict=True)))
    return rows


HIPBLASLT = sorted(p for p in GEMM.glob("*.txt")) if GEMM.is_dir() else []


@pytest.mark.parametrize("path", HIPBLASLT, ids=[p.name for p in HIPBLASLT])
def test_hipblaslt_gflops_reproduced(path: Path) -> None:
    cal = import_file(path)
    expected = read_hipblaslt(path)
    assert len(cal.gemm) == len(expected) > 0
    for row, e in zip(cal.gemm, expected, strict=True):
        m, n, k, batch = int(e["m"]), int(e["n"]), int(e["k"]), int(e["batch_count"])
        assert (row.m, row.n, row.k, row.batch, row.layout) == (m, n, k, batch, e["transA"] + e["transB"])
        assert row.dtype == normalize_dtype(e.get("a_type", e["d_type"]))
        us = Decimal(e["us"])
        flop = Decimal(2 * m * n * k * batch)
        lo, hi = flop / (us + half_ulp(e["us"])) / Decimal("1e3"), flop / (us - half_ulp(e["us"])) / Decimal("1e3")
        printed = Decimal(e["hipblaslt-Gflops"])
        tol = half_ulp(str(printed.normalize()) if "e" in e["hipblaslt-Gflops"] else e["hipblaslt-Gflops"])
        assert lo - tol <= printed <= hi + tol, (e, lo, hi)
        assert row.flop_per_s == pytest.approx(float(flop) / (float(us) * 1e-6), rel=1e-12)
    if "tune_gemm" in path.name:
        assert cal.provenance[0].device_name == "gfx950:sramecc+:xnack- (256 CUs)"


def test_te_algorithm_cache_has_shapes_but_no_table() -> None:
    path = GEMM / "te_hipblaslt_algo-v26.3.csv"
    with pytest.raises(CalibrationError, match="no timings"):
        import_file(path)
    shapes = read_te_algo_shapes(path)
    assert len(shapes) == 9 and shapes[0].m == 5120 and shapes[0].layout == "TN" and shapes[0].dtype == "fp8"
    with pytest.raises(CalibrationError):
        import_hipblaslt(path)


EXPECTED = {"h100/Qwen_Qwen1.5-0.5B-Chat__1016005": "h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz",
            "mi300/Qwen_Qwen1.5-0.5B-Chat__1016005": "mi300/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz",
            "mi300/resnet_act_checkpoint": "mi300/resnet_act_checkpoint.json.gz"}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_trace_gemms_reproduce_tracelens(name: str) -> None:
    trace = load_trace(TRACES / EXPECTED[name])
    summaries = summarize_gemms(trace_gemm_calls(trace))
    expected = list(csv.DictReader((TRACES / "expected" / name / "GEMM.csv").open(encoding="utf-8")))
    assert len(summaries) == len(expected)
    by_key = {(s.op, s.m, s.n, s.k, s.batch, s.bias): s for s in summaries}
    print(f"\n{name}: op, M, N, K, calls, kernel time mean (us), TFLOP/s mean (ours | TraceLens)")
    for e in expected:
        key = (e["name"], int(e["param: M"]), int(e["param: N"]), int(e["param: K"]), int(e["param: B"]),
               e["param: bias"] == "True")
        s = by_key[key]
        print(f"  {key[0]:<12} {key[1]:>5} {key[2]:>5} {key[3]:>5} {s.count:>3}  {s.time_mean_s * 1e6:9.4f} | "
              f"{float(e['Kernel Time (µs)_mean']):9.4f}  {s.flop_per_s_mean / 1e12:8.3f} | "
              f"{float(e['TFLOPS/s_mean']):8.3f}")
        assert s.count == int(e["name_count"])
        assert s.flop / 1e9 == pytest.approx(float(e["GFLOPS_first"]), rel=1e-12)
        # to the trace's resolution: timestamps in us with 3 decimals (1 ns) per kernel
        assert s.time_mean_s * 1e6 == pytest.approx(float(e["Kernel Time (µs)_mean"]), abs=1e-3)
        assert s.time_sum_s * 1e6 == pytest.approx(float(e["Kernel Time (µs)_sum"]), abs=1e-3 * s.count)
        assert s.flop_per_s_mean / 1e12 == pytest.approx(float(e["TFLOPS/s_mean"]), rel=1e-3 / (s.time_mean_s * 1e6))
        assert s.dtype == normalize_dtype(e["param: dtype_A_B"].split("'")[1])


def test_trace_calibration_rows_use_the_blas_convention() -> None:
    cal = import_trace(TRACES / EXPECTED["h100/Qwen_Qwen1.5-0.5B-Chat__1016005"])
    # nn.Linear x[8944, 1024] @ W[2816, 1024]^T: BLAS m = 2816 (out), n = 8944 (tokens), k = 1024, "TN" (cuBLAS's
    # sm90_xmma_gemm_..._tn_n kernel in the trace)
    up = next(r for r in cal.gemm if (r.m, r.n, r.k) == (2816, 8944, 1024))
    assert up.layout == "TN" and up.dtype == "bf16" and up.count == 48
    assert up.flop_per_s == pytest.approx(2 * 2816 * 8944 * 1024 / up.time_s)
    assert blas_from_torch(8944, 2816, 1024, False, True) == (2816, 8944, 1024, "TN")
    prov = cal.provenance[0]
    assert prov.device_name == "NVIDIA H100 80GB HBM3" and prov.date == "2025-07-01"
    assert prov.library_versions["cuda_runtime"] == "12040"


def test_trace_collectives_reproduce_tracelens() -> None:
    calls = trace_collective_calls(load_trace(TRACES / "mi300/resnet_act_checkpoint.json.gz"))
    expected = list(csv.DictReader((TRACES / "expected/mi300/resnet_act_checkpoint/coll_analysis.csv").open()))
    for e in expected:
        mine = [c for c in calls if c.name == e["Collective name"] and c.in_nelems == int(float(e["In msg nelems"]))]
        assert len(mine) == int(e["operation_count"])
        assert all(c.n_ranks == int(float(e["Group size"])) for c in mine)
        assert sum(c.time_s for c in mine) * 1e6 == pytest.approx(float(e["dur_sum"]), rel=1e-9)
        assert mine[0].size_bytes / 2**20 == pytest.approx(float(e["In msg size (MB)_first"]), rel=1e-12)
    assert len(calls) == sum(int(e["operation_count"]) for e in expected)
    hta = trace_collective_calls(load_trace(TRACES / "nccl_data.json.gz"))
    assert [c.kind for c in hta].count("all_reduce") == 15 and [c.kind for c in hta].count("broadcast") == 6
    assert {c.n_ranks for c in hta} == {2}
    # an old trace without collective metadata: name and size from the nccl:<name> annotation, group = world size
    old = import_trace(TRACES / "control.json.gz")
    assert {r.kind for r in old.collective} == {"all_reduce", "all_to_all"} and {r.n_ranks for r in old.collective} \
        == {8} and all(r.n_nodes is None for r in old.collective)


def test_non_benchmark_files_raise(tmp_path: Path) -> None:
    (tmp_path / "empty.log").write_text("", encoding="utf-8")
    (tmp_path / "data.json").write_text(json.dumps({"hello": [1, 2, 3]}), encoding="utf-8")
    (tmp_path / "notes.txt.gz").write_bytes(gzip.compress(b"no table here\n1 2 3\n"))
    candidates = [FIXTURES / "README.md", FIXTURES / "torchtitan" / "llama3_8b.toml", tmp_path / "empty.log",
                  tmp_path / "data.json", tmp_path / "notes.txt.gz"]
    for path in candidates:
        with pytest.raises(CalibrationError, match="no benchmark table") as err:
            import_file(path)
        assert str(path) in str(err.value)
    with pytest.raises(CalibrationError) as err:
        import_files(candidates[:2])
    assert len(err.value.problems) == 2
    with pytest.raises(CalibrationError, match="file not found"):
        import_file(tmp_path / "missing.log")


def test_format_comes_from_content_not_suffix(tmp_path: Path) -> None:
    log = tmp_path / "results.json"
    shutil.copy(COLLECTIVES / "nccl_reduce.log", log)
    trace = tmp_path / "trace.txt"
    trace.write_bytes((TRACES / "mi250_minitoy_train_ROCm6_2_kineto.json.gz").read_bytes())
    assert detect_format(log.read_bytes()) == "nccl" and detect_format(trace.read_bytes()) == "trace"
    cal = import_files([log, trace, GEMM / "mi300x_hipblaslt_bench_fp16_896.txt"], allow_mixed_devices=True)
    assert cal.row_counts()["collective"] == 68 and cal.row_counts()["gemm"] == 3
    assert len(cal.provenance) == 3


def test_calibration_json_round_trip_merge_and_errors(tmp_path: Path) -> None:
    cal = import_files([COLLECTIVES / "nccl_allreduce.log", COLLECTIVES / "nccl_allgather.log"])
    path = tmp_path / "cal.json"
    cal.save(path)
    again = load_calibration(path)
    assert again == cal and detect_format(path.read_bytes()) == "calibration"
    assert import_files([path, COLLECTIVES / "nccl_allreduce.log"]) == cal  # duplicates kept once
    with pytest.raises(CalibrationError, match="different devices"):
        import_files([COLLECTIVES / "nccl_allreduce.log",
                      COLLECTIVES / "image_classification_mxnet_1x8x400_240501022708975460797_nccl.log"])
    bad = json.loads(path.read_text(encoding="utf-8"))
    bad["collective"][3]["time_s"] = -1
    bad["collective"][4]["speed"] = 1
    path.write_text(json.dumps(bad), encoding="utf-8")
    with pytest.raises(CalibrationError) as err:
        load_calibration(path)
    text = str(err.value)
    assert "collective.3.time_s" in text and "collective.4.speed" in text and "unknown key" in text
    path.write_text("{\n  \"gemm\": [\n", encoding="utf-8")
    with pytest.raises(CalibrationError, match=r"cal\.json:3: invalid JSON"):
        load_calibration(path)


def test_rows_fill_derived_columns() -> None:
    row = CollectiveRow(kind="all_reduce", n_ranks=8, size_bytes=2**30, time_s=0.004)
    assert row.algbw_bytes_per_s == pytest.approx(2**30 / 0.004)
    assert row.busbw_bytes_per_s == pytest.approx(1.75 * 2**30 / 0.004)
    gemm = GemmRow(m=4096, n=4096, k=4096, dtype="bf16", layout="TN", time_s=1e-3)
    assert gemm.flop_per_s == pytest.approx(2 * 4096**3 / 1e-3)
    assert [normalize_dtype(x) for x in ("float", "c10::BFloat16", "f8_r", "Float8_e4m3fnuz", "half", "Long")] == [
        "fp32", "bf16", "fp8", "fp8", "fp16", "int64"]
    a = Calibration(provenance=(Provenance(device_name="A100-SXM4-40GB"),), collective=(row,))
    b = Calibration(provenance=(Provenance(device_name="NVIDIA A100-SXM4-40GB"),), gemm=(gemm,))
    merged = merge_calibrations([a, b])
    assert merged.row_counts() == {"gemm": 1, "grouped_gemm": 0, "attention": 0, "memory_bound": 0, "collective": 1,
                                   "host": 0}


def test_cli_import_and_fit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="projection")
    add_parser(parser.add_subparsers(dest="command", required=True))
    out = tmp_path / "a100.json"
    logs = [str(p) for p in sorted(COLLECTIVES.glob("nccl_*.log"))]
    assert run(parser.parse_args(["calibrate", "import", *logs, "--out", str(out)])) == 0
    assert "408 collective from 6 file(s)" in capsys.readouterr().out
    assert run(parser.parse_args(["calibrate", "fit", str(out), "--out", str(tmp_path / "fit.json")])) == 0
    table = capsys.readouterr().out
    assert "intra_node  all_reduce" in table and "quality per" in table and "tier intra_node: alpha" in table
    assert run(parser.parse_args(["calibrate", "fit", str(out), "--format", "json"])) == 0
    data = json.loads(capsys.readouterr().out)
    assert {q["name"] for q in data["quality"]} >= {"intra_node", "all_gather"} and len(data["curves"]) == 6
    assert json.loads((tmp_path / "fit.json").read_text()) == data  # --out holds what --format json prints
    assert run(parser.parse_args(["calibrate", "import", str(FIXTURES / "README.md"), "--out", str(out)])) == 2
    assert "no benchmark table" in capsys.readouterr().err
    assert run(parser.parse_args(["calibrate", "fit", str(tmp_path / "missing.json")])) == 2
    # more sub-commands join the same group through hooks
    hooked = argparse.ArgumentParser(prog="projection")
    add_parser(hooked.add_subparsers(dest="command"), hooks=(
        lambda sub: sub.add_parser("gemm").set_defaults(calibrate_run=lambda args: 7),))
    assert run(hooked.parse_args(["calibrate", "gemm"])) == 7


@pytest.mark.parametrize(("trace", "device"), [("h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz", "h100-sxm"),
                                               ("mi300/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz", "mi300x")])
def test_trace_host_issue_time(trace: str, device: str) -> None:
    """The TraceLens Qwen forward traces issue their kernels from one thread without interruption: the host seconds
    per launch the importer finds equal (last launch - first launch) / (launches - 1) read here from the raw events
    (within the one interval a mid-trace block removes), and the figure the device YAML states for that trace."""
    from projection.specs.hardware import load_device

    events = json.loads(gzip.decompress((TRACES / trace).read_bytes()))["traceEvents"]
    starts = sorted(e["ts"] for e in events if e.get("ph") == "X" and re.fullmatch(
        r"cuda(LaunchKernel(ExC)?)|cuLaunchKernel|hip(Ext)?(Module)?LaunchKernel", str(e.get("name", ""))))
    raw = (starts[-1] - starts[0]) / (len(starts) - 1) * 1e-6
    rows = import_trace(TRACES / trace).host
    assert len(rows) == 1 and rows[0].kernels >= len(starts) - 2
    assert rows[0].host_s == pytest.approx(raw, rel=0.01)
    assert rows[0].host_s == pytest.approx(load_device(device).host_kernel_issue_s, rel=0.01)


def test_a_data_row_that_cannot_be_read_is_said_not_dropped_silently(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """One time replaced by 'abc' in an nccl-tests log: that row (both halves) is skipped and the import says which
    line; the fixture's own rows all read (no note)."""
    log = (COLLECTIVES / "nccl_allreduce.log").read_text().splitlines()
    row = next(i for i, line in enumerate(log) if line.split()[:1] == ["4"])
    log[row] = log[row].replace(log[row].split()[4], "abc", 1)
    bad = tmp_path / "bad.log"
    bad.write_text("\n".join(log) + "\n")
    parser = argparse.ArgumentParser(prog="projection")
    add_parser(parser.add_subparsers(dest="command", required=True))
    assert run(parser.parse_args(["calibrate", "import", str(bad), "--out", str(tmp_path / "c.json")])) == 0
    assert f"skipped 1 malformed data row(s) of {bad} (numbers that cannot be read) at lines {row + 1}" in \
        capsys.readouterr().err
    assert run(parser.parse_args(["calibrate", "import", str(COLLECTIVES / "nccl_allreduce.log"), "--out",
                                  str(tmp_path / "d.json")])) == 0
    assert "skipped" not in capsys.readouterr().err
    # older nccl-tests print the check column as a maximum error (%le: 0e+00, 5e-07), not a count: a row, read;
    # starred (`error ? "*" : ""`, common.cu) it failed the data check: that half is skipped, and said
    log = (COLLECTIVES / "nccl_allreduce.log").read_text().splitlines()
    log[row] = log[row].replace(" N/A", " 0e+00", 1).replace(" N/A", " 5e-07", 1)
    old = tmp_path / "old.log"
    old.write_text("\n".join(log) + "\n")
    assert run(parser.parse_args(["calibrate", "import", str(old), "--out", str(tmp_path / "e.json")])) == 0
    out, err = capsys.readouterr()
    assert "68 collective" in out and "skipped" not in err
    old.write_text("\n".join(log).replace(" 5e-07", " 5e-07*", 1) + "\n")
    assert run(parser.parse_args(["calibrate", "import", str(old), "--out", str(tmp_path / "f.json")])) == 0
    out, err = capsys.readouterr()
    assert "67 collective" in out and "skipped 1 half-row(s) that failed the data check" in err
