"""Malformed and impossible measurement files and calibrate flags (a black-box audit: each case ended in a traceback,
or imported wrong, before its fix). The rule (projection/calibrate/import_common.py): an event or data row that cannot
be read or holds impossible values is skipped and said in a provenance note; a file with nothing usable, a failed or
unevenly placed benchmark run, and out-of-range flags are refused with exit code 2 naming the file / key; never a
traceback. Inputs are built here from small strings, in the tools' own layouts."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import pytest

from projection.calibrate.calibration import calibration_from_json
from projection.calibrate.errors import CalibrationError
from projection.calibrate.import_hipblaslt import import_hipblaslt
from projection.calibrate.import_nccl import parse_nccl_text
from projection.calibrate.import_trace import import_trace
from projection.cli import main

# --- PyTorch profiler traces ---------------------------------------------------------------------------------------

def _trace() -> dict[str, Any]:
    """One aten::mm (4096 x 4096 x 4096, bf16) and one all_gather kernel with record_param_comms metadata."""
    def x(cat: str, name: str, ts: float, dur: float, **args: Any) -> dict[str, Any]:
        return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur, "args": args}

    kernel = x("kernel", "ncclDevKernel_AllGather_RING_LL", 400, 40, correlation=2, **{
        "Collective name": "_allgather_base", "In msg nelems": 1 << 20, "Out msg nelems": 8 << 20, "Group size": 8,
        "dtype": "Float"})
    kernel["pid"], kernel["tid"] = 0, 7
    gemm_kernel = x("kernel", "sm90_gemm", 200, 40, correlation=1)
    gemm_kernel["pid"], gemm_kernel["tid"] = 0, 7
    return {"traceEvents": [
        x("cpu_op", "aten::mm", 100, 50, **{"Input Dims": [[4096, 4096], [4096, 4096]],
                                          "Input type": ["c10::BFloat16", "c10::BFloat16"], "External id": 7}),
        x("cuda_runtime", "cudaLaunchKernel", 110, 5, **{"External id": 7, "correlation": 1}),
        gemm_kernel,
        x("cpu_op", "record_param_comms", 300, 50, **{"External id": 8}),
        x("cuda_runtime", "cudaLaunchKernel", 310, 5, **{"External id": 8, "correlation": 2}),
        kernel],
        "distributedInfo": {"rank": 0, "world_size": 8}, "deviceProperties": [{"name": "NVIDIA H100 80GB HBM3"}]}


def _import(trace: dict[str, Any], tmp_path: Path) -> Any:
    path = tmp_path / "t.json"
    path.write_text(json.dumps(trace))
    return import_trace(path)


def _notes(cal: Any) -> str:
    return " | ".join(n for p in cal.provenance for n in p.notes)


def _set(trace: dict[str, Any], index: int, key: str, value: Any, args: bool = False) -> dict[str, Any]:
    out = copy.deepcopy(trace)
    (out["traceEvents"][index]["args"] if args else out["traceEvents"][index])[key] = value
    return out


def test_a_well_formed_trace_imports_both_rows(tmp_path: Path) -> None:
    cal = _import(_trace(), tmp_path)
    assert (len(cal.gemm), len(cal.collective)) == (1, 1)
    assert "skipped" not in _notes(cal)


@pytest.mark.parametrize(("index", "key", "value", "args", "kept", "note"), [
    (5, "In msg nelems", "abc", True, ("gemm",), "In/Out msg nelems"),
    (5, "Group size", 0, True, ("gemm",), "Group size"),
    (5, "correlation", [1, 2], True, ("gemm",), "correlation is not a number"),
    (2, "ts", "abc", False, ("collective",), "ts or dur"),
    (2, "dur", "x", False, ("collective",), "ts or dur"),
    (0, "Input Dims", [[4096, "a"], [4096, 4096]], True, ("collective",), "are not integers"),
    (0, "Input Dims", [[4096, 0], [0, 4096]], True, ("collective",), "zero dimension"),
    (0, "Input Dims", [[4096, 10**20], [10**20, 4096]], True, ("collective",), "not integers from 0 to 2**53"),
    (0, "pid", [1], False, ("collective",), ""),  # a list as the thread id: read as a name, not a crash
])
def test_a_malformed_event_is_skipped_with_a_note(tmp_path: Path, index: int, key: str, value: Any, args: bool,
                                                  kept: tuple[str, ...], note: str) -> None:
    cal = _import(_set(_trace(), index, key, value, args), tmp_path)
    assert {name for name in ("gemm", "collective") if getattr(cal, name)} >= set(kept)
    assert note in _notes(cal)


def test_a_launch_without_a_time_is_skipped(tmp_path: Path) -> None:
    trace = _trace()
    del trace["traceEvents"][1]["ts"]
    cal = _import(trace, tmp_path)
    assert not cal.gemm and len(cal.collective) == 1
    assert "skipped 1 malformed trace event(s)" in _notes(cal)


def test_entries_that_are_not_objects_are_skipped(tmp_path: Path) -> None:
    trace = _trace()
    trace["traceEvents"] += ["a string", 3, None]
    cal = _import(trace, tmp_path)
    assert (len(cal.gemm), len(cal.collective)) == (1, 1)
    assert "skipped 3 malformed trace event(s) (not a JSON object)" in _notes(cal)


def test_unreadable_metadata_is_left_out_with_a_note(tmp_path: Path) -> None:
    trace = _trace()
    trace["distributedInfo"] = "x"
    trace["baseTimeNanoseconds"] = 10**30
    cal = _import(trace, tmp_path)
    assert len(cal.gemm) == 1 and cal.provenance[0].date is None
    assert "distributedInfo is not a JSON object" in _notes(cal)
    assert "baseTimeNanoseconds" in _notes(cal)


@pytest.mark.parametrize("events", [["a", "b"], [{"ph": "X", "cat": "kernel", "name": "k", "ts": "abc"}]])
def test_a_trace_with_nothing_readable_is_refused_with_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                             events: list[Any]) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"traceEvents": events}))
    assert main(["calibrate", "import", str(path), "--out", str(tmp_path / "c.json")]) == 2
    err = capsys.readouterr().err
    assert "bad.json" in err and "malformed trace event" in err and "Traceback" not in err
    assert not (tmp_path / "c.json").exists()


def test_an_all_gather_annotation_stores_the_output_size(tmp_path: Path) -> None:
    """c10d's Work record function records the input tensors: one rank's shard for all_gather (Input Dims x world
    size = the nccl-tests output size the kernel metadata gives)."""
    meta = _import(_trace(), tmp_path).collective[0]
    trace = _trace()
    trace["traceEvents"][3] = {"ph": "X", "cat": "user_annotation", "name": "nccl:all_gather", "pid": 1, "tid": 1,
                               "ts": 300, "dur": 50, "args": {"Input Dims": [[1 << 20]], "Input type": ["float"]}}
    trace["traceEvents"][5]["args"] = {"correlation": 2}
    note = _import(trace, tmp_path).collective[0]
    assert note.size_bytes == meta.size_bytes == 4 * (8 << 20)
    assert (note.kind, note.n_ranks) == ("all_gather", 8)


def test_a_reduce_scatter_annotation_stores_the_input_size(tmp_path: Path) -> None:
    trace = _trace()
    trace["traceEvents"][3] = {"ph": "X", "cat": "user_annotation", "name": "nccl:reduce_scatter", "pid": 1,
                               "tid": 1, "ts": 300, "dur": 50, "args": {"Input Dims": [[8 << 20]],
                                                                        "Input type": ["float"]}}
    trace["traceEvents"][5]["args"] = {"correlation": 2}
    row = _import(trace, tmp_path).collective[0]
    assert (row.kind, row.size_bytes) == ("reduce_scatter", 4 * (8 << 20))


# --- hipblaslt-bench ------------------------------------------------------------------------------------------------

_HEADER = ("[0]transA,transB,grouped_gemm,batch_count,m,n,k,alpha,lda,stride_a,beta,ldb,stride_b,ldc,stride_c,ldd,"
           "stride_d,d_type,compute_type,activation_type,bias_vector,hipblaslt-Gflops,us")


def _hipblaslt_row(m: str = "896", us: str = "24.54", batch: str = "1", grouped: str = "0") -> str:
    return (f"N,N,{grouped},{batch},{m},896,896,1,896,802816,0,896,802816,896,802816,896,802816,fp16_r,f32_r,none,0,"
            f" 58624.5, {us}")


def _hipblaslt(*rows: str) -> str:
    return ("hipBLASLt version: 600\nDevice ID 0 : AMD Radeon Graphics gfx942:sramecc+:xnack-\n"
            + "".join(f"{_HEADER}\n{row}\n" for row in rows))


@pytest.mark.parametrize("row", [_hipblaslt_row(us="0"), _hipblaslt_row(us="-3"), _hipblaslt_row(us="nan"),
                                 _hipblaslt_row(us="inf"), _hipblaslt_row(us="4e9"), _hipblaslt_row(m="0"),
                                 _hipblaslt_row(batch="-4"), _hipblaslt_row(m="9" * 20)])
def test_a_hipblaslt_row_with_impossible_values_is_skipped(row: str) -> None:
    cal = import_hipblaslt("h.txt", _hipblaslt(_hipblaslt_row(), row))
    assert len(cal.gemm) == 1 and cal.gemm[0].source == "h.txt:4"
    assert "skipped 1 data row(s) with impossible values" in _notes(cal) and "h.txt at lines 6 " in _notes(cal)


def test_a_hipblaslt_file_of_impossible_rows_is_refused() -> None:
    with pytest.raises(CalibrationError, match="impossible values"):
        import_hipblaslt("h.txt", _hipblaslt(_hipblaslt_row(us="0")))


@pytest.mark.parametrize(("grouped", "batch", "groups"), [("8", "1", 8), ("2", "3", 6), ("1", "4", 4)])
def test_grouped_gemm_counts_the_gemms_of_the_launch(grouped: str, batch: str, groups: int) -> None:
    """testing_matmul: gemm_count = max(1, grouped_gemm) GEMMs, each batched batch_count times."""
    row = import_hipblaslt("h.txt", _hipblaslt(_hipblaslt_row(grouped=grouped, batch=batch))).grouped_gemm[0]
    assert row.groups == groups
    assert math.isclose(row.flop_per_s, 2 * groups * 896**3 / 24.54e-6)


# --- nccl-tests -----------------------------------------------------------------------------------------------------

def _nccl(sizes: tuple[int, ...] = (1 << 30, 1 << 31), wrong: str = "0", hosts: tuple[int, ...] = (8,),
          tail: str = "") -> str:
    ranks, r = [], 0
    for node, count in enumerate(hosts):
        for d in range(count):
            ranks.append(f"#  Rank {r:2d} Group  0 Pid {1000 + r:6d} on node-{node} device {d:2d} [0x0f] NVIDIA H100")
            r += 1
    n = sum(hosts)
    rows = []
    for i, size in enumerate(sizes):
        time_us = size / 2e5
        algbw = size / (time_us * 1e-6) / 1e9
        half = f"{time_us:10.2f} {algbw:7.2f} {algbw * 2 * (n - 1) / n:7.2f} {wrong if i else '0':>6}"
        rows.append(f"{size:12d} {size // 4:13d}     float     sum      -1 {half} {half}")
    return ("# Collective test starting: all_reduce_perf\n# nThread 1 nGpus 1\n#\n# Using devices\n"
            + "\n".join(ranks) + "\n#\n#       size         count      type   redop    root     time   algbw   busbw "
            "#wrong     time   algbw   busbw #wrong\n" + "\n".join(rows) + "\n" + tail)


def test_a_20_digit_size_is_skipped_with_a_note() -> None:
    cal = parse_nccl_text(_nccl(sizes=(1 << 30, 10**19 + 7)), "n.log")
    assert [r.size_bytes for r in cal.collective] == [1 << 30, 1 << 30]
    assert "skipped 2 half-row(s) with impossible values of n.log at lines 16 " in _notes(cal)


def test_ranks_split_unevenly_over_hosts_are_refused() -> None:
    with pytest.raises(CalibrationError, match=r"split unevenly over the hosts \(8 on node-0, 4 on node-1\)"):
        parse_nccl_text(_nccl(hosts=(8, 4)), "n.log")
    assert {r.n_nodes for r in parse_nccl_text(_nccl(hosts=(4, 4)), "n.log").collective} == {2}


def test_rows_that_failed_the_data_check_are_skipped() -> None:
    cal = parse_nccl_text(_nccl(wrong="1234", tail="# Out of bounds values : 2 FAILED\n"), "n.log")
    assert [r.size_bytes for r in cal.collective] == [1 << 30, 1 << 30]
    assert "skipped 2 half-row(s) that failed the data check" in _notes(cal)


def test_a_log_cut_by_a_test_failure_is_refused() -> None:
    tail = ("host: Test NCCL failure common.cu:1005 'unhandled system error'\n"
            " .. host pid 1: Test failure common.cu:891\n")
    with pytest.raises(CalibrationError, match="the benchmark failed") as err:
        parse_nccl_text(_nccl(tail=tail), "n.log")
    assert err.value.problems[0].line == 17


# --- calibration schema and calibrate flags -------------------------------------------------------------------------

def test_a_host_row_over_an_hour_is_refused() -> None:
    with pytest.raises(CalibrationError, match="host.0.host_s"):
        calibration_from_json('{"host": [{"host_s": 1e9, "kernels": 1}]}', "c.json")
    assert calibration_from_json('{"host": [{"host_s": 2e-6, "kernels": 1}]}').host_kernel_issue_s() == 2e-6


@pytest.mark.parametrize(("argv", "key"), [
    (["memory", "--sizes", "1e20"], "--sizes"),
    (["memory", "--sizes", "1e400"], "--sizes"),
    (["collective", "--sizes", "4096,1e400", "--device", "cpu", "--backend", "gloo"], "--sizes"),
    (["gemm", "--shape", "99999999999999999999x2x2"], "--shape"),
    (["gemm", "--shape", "1000000x1000000x1000000"], "--shape"),
    (["attention", "--shape", "1x32x8x128x9999999999"], "--shape"),
])
def test_out_of_range_flags_are_refused_at_their_key(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                    argv: list[str], key: str) -> None:
    out = tmp_path / "y.json"
    assert main(["calibrate", *argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"key '{key}'" in err and "Traceback" not in err
    assert not out.exists()
