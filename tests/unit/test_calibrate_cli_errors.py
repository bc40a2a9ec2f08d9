"""Bad input to `projection calibrate ...` is exit code 2 with a message naming the flag (or file) and the fix: no
traceback, no benchmark run, no output file written."""

from __future__ import annotations

from pathlib import Path

import pytest

from projection.cli import main

CALIBRATIONS = Path(__file__).resolve().parents[2] / "calibrations"
CPU = ("--device", "cpu", "--quiet")

# (defect, argv, text the message must hold)
CASES = [
    ("gemm shape with a zero dimension", ["gemm", *CPU, "--shape", "0x64x64"], ["--shape", "'0x64x64'"]),
    ("gemm --repeat 0", ["gemm", *CPU, "--shape", "8x8x8", "--repeat", "0"], ["--repeat"]),
    ("host --repeat 0", ["host", *CPU, "--repeat", "0"], ["--repeat"]),
    ("attention KV heads not dividing heads", ["attention", *CPU, "--shape", "1x8x3x64x128"],
     ["--shape", "3 KV heads do not divide 8 heads"]),
    ("collective nccl on the CPU", ["collective", *CPU, "--backend", "nccl", "--sizes", "4096"],
     ["--backend", "--backend gloo"]),
    ("gemm --max-shapes 0", ["gemm", *CPU, "--max-shapes", "0", "--out", "g.json"], ["--max-shapes"]),
    ("collective --world-size 0", ["collective", *CPU, "--world-size", "0", "--sizes", "4096"], ["--world-size"]),
    ("gemm --warmup -1", ["gemm", *CPU, "--shape", "8x8x8", "--warmup", "-1"], ["--warmup"]),
    ("memory --sizes 0", ["memory", *CPU, "--sizes", "0", "--out", "m.json"], ["--sizes", "'0'"]),
    ("attention --max-shapes -1", ["attention", *CPU, "--max-shapes", "-1"], ["--max-shapes"]),
    ("memory --dtype unknown", ["memory", *CPU, "--sizes", "4096", "--dtype", "bogus"], ["--dtype", "'bogus'"]),
    ("attention --dtype unknown", ["attention", *CPU, "--shape", "1x2x2x8x16", "--dtype", "bogus"], ["--dtype"]),
    ("collective unknown kind", ["collective", *CPU, "--kinds", "all_reduce,gossip"], ["--kinds", "'gossip'"]),
    ("collective larger than the host's RAM", ["collective", *CPU, "--sizes", "900GiB"],
     ["--sizes", "<command line>", "more than the host's available RAM", "give --sizes up to"]),
    ("--out onto a directory", ["gemm", *CPU, "--shape", "8x8x8", "--out", "outdir"], ["--out", "is a directory"]),
    ("--out in a missing directory", ["host", *CPU, "--out", "missing/h.json"], ["--out", "does not exist"]),
    ("import --out in a missing directory", ["import", str(CALIBRATIONS / "mi300x.json"), "--out", "missing/c.json"],
     ["--out", "does not exist"]),
    ("fit --out in a missing directory", ["fit", str(CALIBRATIONS / "mi300x.json"), "--out", "missing/f.json"],
     ["--out", "does not exist"]),
]


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["calibrate", *argv])
    err = capsys.readouterr().err
    return code, err


def _assert_user_error(code: int, err: str, wanted: list[str]) -> None:
    assert code == 2, err
    assert "Traceback" not in err and "fix:" in err, err
    for text in wanted:
        assert text in err, (text, err)


@pytest.fixture
def scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "outdir").mkdir()
    return tmp_path


def _written(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.name != "outdir")


@pytest.mark.parametrize(("argv", "wanted"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_flag_is_exit_2_naming_the_flag(argv: list[str], wanted: list[str], scratch: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _run(argv, capsys)
    _assert_user_error(code, err, [f"key '{wanted[0]}'", *wanted[1:]])
    assert _written(scratch) == []


def test_every_bad_flag_is_listed_at_once(scratch: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _run(["gemm", *CPU, "--shape", "0x8x8", "--shape", "8x8", "--repeat", "0", "--warmup", "-1",
                      "--max-shapes", "0", "--dtype", "bogus", "--out", "missing/g.json"], capsys)
    _assert_user_error(code, err, ["7 problems", "key '--repeat'", "key '--warmup'", "key '--max-shapes'",
                                   "key '--dtype'", "key '--out'", "'0x8x8'", "'8x8'"])
    code, err = _run(["collective", *CPU, "--world-size", "1", "--sizes", "4096,-1,0", "--warmup", "-2"], capsys)
    _assert_user_error(code, err, ["4 problems", "key '--world-size'", "key '--warmup'", "'-1'", "'0'"])
    assert _written(scratch) == []


def test_import_of_two_devices_names_the_files_given(scratch: Path, capsys: pytest.CaptureFixture[str]) -> None:
    h100, mi300x = str(CALIBRATIONS / "h100-sxm.json"), str(CALIBRATIONS / "mi300x.json")
    code, err = _run(["import", h100, mi300x, "--out", "c.json"], capsys)
    _assert_user_error(code, err, [f"{h100} holds NVIDIA H100", f"{mi300x} holds AMD Instinct MI300X",
                                   "--allow-mixed-devices"])
    assert "shared/" not in err  # not the sources recorded inside the calibrations
    assert _written(scratch) == []


def test_fit_without_collective_rows_names_the_file_given(scratch: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["calibrate", "gemm", *CPU, "--shape", "8x8x8", "--warmup", "0", "--repeat", "1",
                 "--out", "gemm_only.json"]) == 0
    capsys.readouterr()
    code, err = _run(["fit", "gemm_only.json", "--out", "fit.json"], capsys)
    _assert_user_error(code, err, ["gemm_only.json: no collective rows to fit", "1 gemm row"])
    assert _written(scratch) == ["gemm_only.json"]


def test_import_and_fit_do_not_import_torch(tmp_path: Path) -> None:
    """Reading logs and fitting curves needs no PyTorch (about 1 s of start-up): only the microbenchmarks load it."""
    import subprocess
    import sys

    code = ("import sys; from projection.cli import main; "
            f"main(['calibrate', 'fit', {str(CALIBRATIONS / 'mi300x.json')!r}]); "
            "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().endswith("NO-TORCH")


def test_collective_memory_check_counts_the_output_buffer_of_all_to_all_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each rank holds the buffer and its 1/world part; all_to_all also an output as large as the buffer: with 100 GiB
    of RAM, 20 GiB over 2 ranks fits an all-reduce (60 GiB) but not an all-to-all (100 GiB > 90 %)."""
    import torch

    from projection.calibrate import cli_bench
    from projection.calibrate.errors import CalibrationError

    monkeypatch.setattr(cli_bench, "_available_ram_bytes", lambda: 100 * 2**30)
    cpu = torch.device("cpu")
    cli_bench._collective_memory_check(["all_reduce", "all_gather"], [20 * 2**30], 2, cpu, "--sizes")
    with pytest.raises(CalibrationError, match="needs about 100.0 GiB over 2 ranks"):
        cli_bench._collective_memory_check(["all_to_all"], [20 * 2**30], 2, cpu, "--sizes")


def test_fit_of_a_shipped_single_size_calibration_uses_its_devices_latency(capsys: pytest.CaptureFixture[str]) -> None:
    """calibrations/mi325x.json holds rccl-tests 16 GiB all-reduces, one size per placement: `calibrate fit` takes
    the latency of the device the file is for (its name) and fits the bandwidth, as `performance` does (it used to
    refuse, blaming the latency of a bandwidth-bound message)."""
    path = Path(__file__).resolve().parents[2] / "calibrations" / "mi325x.json"
    assert main(["calibrate", "fit", str(path)]) == 0
    out = capsys.readouterr().out
    assert "tier inter_node: alpha 5.00 us per step, beta 44.1 GB/s per GPU" in out
