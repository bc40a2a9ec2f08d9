"""Unit parsing (projection/units.py): SI results, decimal vs binary prefixes, bits vs bytes, refusals."""

from __future__ import annotations

import pytest

from projection.units import GB, GiB, parse_bandwidth, parse_bytes, parse_duration, parse_flop_rate


def test_constants() -> None:
    assert GB == 10**9
    assert GiB == 2**30


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("192GB", 192e9),
        ("192 GB", 192e9),
        ("  80GB  ", 80e9),
        ("64GiB", 64 * 2**30),
        ("1.5TB", 1.5e12),
        ("512MiB", 512 * 2**20),
        ("4kB", 4e3),
        ("4KiB", 4096),
        ("1.5e9", 1.5e9),
        ("1.5e+9 bytes", 1.5e9),
        ("123", 123.0),
        ("7 B", 7.0),
        (123, 123.0),
        (1.25e9, 1.25e9),
    ],
)
def test_parse_bytes(text: str | int | float, expected: float) -> None:
    assert parse_bytes(text) == pytest.approx(expected, rel=1e-12)
    assert isinstance(parse_bytes(text), float)


@pytest.mark.parametrize(
    "bad", ["", "GB", "192 GB/s", "192 furlongs", "-5GB", "1,5GB", "12 GB HBM3", True, None, -1, float("inf"),
            float("nan")])
def test_parse_bytes_rejects(bad: object) -> None:
    with pytest.raises(ValueError):
        parse_bytes(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("400Gbps", 50e9),  # bits: 400e9 / 8
        ("400 Gb/s", 50e9),
        ("400 Gbit/s", 50e9),
        ("200 Gbits/s", 25e9),
        ("50GB/s", 50e9),  # bytes
        ("50 GBps", 50e9),
        ("448 GB/s", 448e9),
        ("5.3TB/s", 5.3e12),
        ("1 GiB/s", 2**30),
        ("12 bytes/s", 12.0),
        ("5e10", 5e10),
        (5e10, 5e10),
        (7, 7.0),
    ],
)
def test_parse_bandwidth(text: str | int | float, expected: float) -> None:
    assert parse_bandwidth(text) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("bad", ["", "5 GB", "fast", "10 furlongs/s", "-1GB/s", False, [1]])
def test_parse_bandwidth_rejects(bad: object) -> None:
    with pytest.raises(ValueError):
        parse_bandwidth(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1307.4 TFLOP/s", 1307.4e12),
        ("1307.4TFLOP/s", 1307.4e12),
        ("2.5PFLOPS", 2.5e15),
        ("989 TFLOPs", 989e12),
        ("163 TFLOP", 163e12),
        ("989.4e12", 989.4e12),
        ("3.2e+12", 3.2e12),
        (312e12, 312e12),
    ],
)
def test_parse_flop_rate(text: str | float, expected: float) -> None:
    assert parse_flop_rate(text) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("bad", ["1 TB/s", "lots", "1.3 TFLOP/s/GPU", True])
def test_parse_flop_rate_rejects(bad: object) -> None:
    with pytest.raises(ValueError):
        parse_flop_rate(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2us", 2e-6),
        ("2 µs", 2e-6),
        ("2μs", 2e-6),  # Greek mu as well as the micro sign
        ("0.45 us", 0.45e-6),
        ("3ms", 3e-3),  # milli here, not the mega of byte prefixes
        ("10ns", 10e-9),
        ("1.5s", 1.5),
        ("2 min", 120.0),
        ("1e-6", 1e-6),
        (5e-6, 5e-6),
        (0, 0.0),
    ],
)
def test_parse_duration(text: str | float, expected: float) -> None:
    assert parse_duration(text) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("bad", ["", "2 parsecs", "-1us", "us", "2 Ms", True, None])
def test_parse_duration_rejects(bad: object) -> None:
    with pytest.raises(ValueError):
        parse_duration(bad)  # type: ignore[arg-type]


def test_errors_quote_the_input() -> None:
    with pytest.raises(ValueError, match="furlongs"):
        parse_bytes("3 furlongs")
