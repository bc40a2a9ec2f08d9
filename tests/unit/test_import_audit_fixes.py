"""Benchmark logs an audit of the importers found misread (each failed before its fix): nccl-tests / rccl-tests
output written with `-S 1` (a timestamp after each row), `-C 1` (the time column is the host's), rccl-tests' old
`bf16` type name and ranks split unevenly over hosts; hipblaslt-bench's current `[0]:transA,...` header and rows that
do not read as results; calibration JSON rows with more nodes than ranks. The logs are written here in the tools'
own layout (nccl-tests src/util.cu writeResultHeader / writeBenchmarkLineBody; hipBLASLt clients/benchmarks)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from projection.calibrate.calibration import calibration_from_json
from projection.calibrate.errors import CalibrationError
from projection.calibrate.import_hipblaslt import import_hipblaslt
from projection.calibrate.import_nccl import parse_nccl_text


def _nccl_log(*, hosts: int = 1, time_col: str = "time", dtype: str = "float", stamp: bool = False) -> str:
    ranks = "\n".join(f"#  Rank {r:2d} Group  0 Pid {1000 + r:6d} on node-{r * hosts // 8:03d} device {r % 8:2d} "
                      f"[0000:{r:02x}:00.0] NVIDIA H100 80GB HBM3" for r in range(8))
    rows = []
    for size, time_us in ((1 << 30, 6000.0), (1 << 31, 12000.0)):
        algbw = size / (time_us * 1e-6) / 1e9
        half = f"{time_us:10.2f} {algbw:7.2f} {algbw * 1.75:7.2f}      0"
        rows.append(f"{size:12d} {size // 4:13d} {dtype:>9}     sum      -1 {half} {half}"
                    + ("  2025-01-01 12:00:00" if stamp else ""))
    return ("# Collective test starting: all_reduce_perf\n# nThread 1 nGpus 1 minBytes 1073741824 maxBytes 2147483648\n"
            f"#\n# Using devices\n{ranks}\n#\n"
            "#" + " " * 62 + "out-of-place" + " " * 23 + "in-place\n"
            f"#       size         count      type   redop    root {time_col:>8}   algbw   busbw #wrong "
            f"{time_col:>8}   algbw   busbw #wrong\n" + "\n".join(rows) + "\n# Avg bus bandwidth    : 300\n")


def test_timestamped_rows_are_read() -> None:
    cal = parse_nccl_text(_nccl_log(stamp=True))
    assert [(r.size_bytes, r.time_s) for r in cal.collective] == [
        (1 << 30, pytest.approx(6e-3)), (1 << 30, pytest.approx(6e-3)), (1 << 31, pytest.approx(12e-3)),
        (1 << 31, pytest.approx(12e-3))]


def test_cpu_time_is_refused() -> None:
    with pytest.raises(CalibrationError, match="reports CPU time"):
        parse_nccl_text(_nccl_log(time_col="cputime"))


def test_old_rccl_bf16_type_name() -> None:
    assert {r.dtype for r in parse_nccl_text(_nccl_log(dtype="bf16")).collective} == {"bf16"}


def test_ranks_split_unevenly_over_hosts_are_refused() -> None:
    assert {r.n_nodes for r in parse_nccl_text(_nccl_log(hosts=2)).collective} == {2}
    with pytest.raises(CalibrationError, match="8 ranks on 3 nodes"):
        parse_nccl_text(_nccl_log(hosts=3))


def test_calibration_rows_need_their_ranks_on_their_nodes() -> None:
    row = {"kind": "all_reduce", "n_ranks": 8, "size_bytes": 1 << 30, "time_s": 6e-3}
    for nodes in (16, 3):
        with pytest.raises(CalibrationError) as e:
            calibration_from_json(json.dumps({"schema_version": 1, "collective": [{**row, "n_nodes": nodes}]}))
        assert f"8 ranks cannot sit evenly on {nodes} nodes" in e.value.problems[0].message
    assert calibration_from_json(json.dumps({"schema_version": 1, "collective": [{**row, "n_nodes": 2}]}))


def test_current_hipblaslt_bench_header_and_unreadable_rows(tmp_path: Path) -> None:
    text = ("hipBLASLt version: 100200\nDevice ID 0 : AMD Instinct MI350X gfx950:sramecc+:xnack-\n"
            "[0]:transA,transB,grouped_gemm,batch_count,m,n,k,alpha,lda,stride_a,beta,ldb,stride_b,ldc,stride_c,ldd,"
            "stride_d,a_type,b_type,c_type,d_type,compute_type,scaleA,scaleB,scaleC,scaleD,amaxD,activation_type,"
            "bias_vector,bias_type,hipblaslt-Gflops,hipblaslt-GB/s,us\n"
            "    T,N,0,1,8192,8192,8192,1,8192,67108864,0,8192,67108864,8192,67108864,8192,67108864,bf16_r,bf16_r,"
            "bf16_r,bf16_r,f32_r,0,0,0,0,0,none,0,bf16_r,1292101,236.6,850.941\n"
            "    T,N,0,1,4096\n")
    path = tmp_path / "bench.txt"
    path.write_text(text, encoding="utf-8")
    cal = import_hipblaslt(path)
    (row,) = cal.gemm
    assert (row.m, row.n, row.k, row.layout, row.dtype) == (8192, 8192, 8192, "TN", "bf16")
    assert row.time_s == pytest.approx(850.941e-6)
    assert 2 * 8192**3 / row.time_s / 1e9 == pytest.approx(1292101, rel=1e-5)  # the file's own hipblaslt-Gflops
    assert any("skipped 1 malformed data row" in n for p in cal.provenance for n in p.notes)


def test_gzip_members_are_all_read_and_a_cut_stream_is_refused(tmp_path: Path) -> None:
    """`gzip -c a >> x.gz` makes one gzip of two members: every row of both is read; a cut stream is refused, not
    read in part."""
    import gzip

    from projection.calibrate.importers import import_file

    text = _nccl_log().encode()
    cut = text.index(b"\n", len(text) // 2) + 1
    whole = tmp_path / "two.log.gz"
    whole.write_bytes(gzip.compress(text[:cut]) + gzip.compress(text[cut:]))
    assert len(import_file(whole).collective) == len(parse_nccl_text(text.decode()).collective) == 4
    packed = gzip.compress(text)
    short = tmp_path / "cut.log.gz"
    short.write_bytes(packed[: len(packed) - 20])
    with pytest.raises(CalibrationError, match="ends before its end marker"):
        import_file(short)


def test_a_second_runs_banner_is_not_a_malformed_row(tmp_path: Path) -> None:
    """Two hipblaslt-bench runs appended to one log: the second run's device banner (text with commas) is not a
    result row, so no row is reported skipped."""
    banner = ("hipBLASLt version: 100200\nDevice ID 0 : AMD Instinct MI350X gfx950:sramecc+:xnack-\n"
              "with 270.6 GB memory, max. SCLK 2200 MHz, max. MCLK 1900 MHz, compute capability 9.5\n")
    row = ("[0]:transA,transB,batch_count,m,n,k,a_type,d_type,hipblaslt-Gflops,us\n"
           "    T,N,1,4096,4096,4096,bf16_r,bf16_r,1000,137.4\n")
    path = tmp_path / "runs.txt"
    path.write_text((banner + row) * 2, encoding="utf-8")
    cal = import_hipblaslt(path)
    assert len(cal.gemm) == 2 and not [n for p in cal.provenance for n in p.notes if "skipped" in n]
