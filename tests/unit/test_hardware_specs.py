"""Device and cluster specs: the bundled YAMLs, their sources, unit parsing, user errors, and an oracle against the
peak-spec table of shared/reference/hardware.md §1."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from projection.errors import ConfigError
from projection.paths import HARDWARE_DIR
from projection.specs.hardware import ClusterSpec, DeviceSpec, list_devices, load_device
from projection.units import parse_bandwidth, parse_bytes, parse_flop_rate

BUNDLED = {"mi300x", "mi325x", "mi355x", "h100-sxm", "h200", "b200", "a100-80g"}
HARDWARE_MD = Path(__file__).resolve().parents[2].parent / "shared/reference/hardware.md"
MI300X_TEXT = (HARDWARE_DIR / "mi300x.yaml").read_text(encoding="utf-8")


def _numbers(value: Any, prefix: str = "") -> list[str]:
    """Dotted paths of every number in a dumped spec (written here, independently of the package's own walk)."""
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _numbers(v, f"{prefix}{k}.")]
    if isinstance(value, int | float) and not isinstance(value, bool):
        return [prefix.rstrip(".")]
    return []


def _write(tmp_path: Path, text: str, name: str = "dev.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def _edited(old: str, new: str) -> str:
    assert old in MI300X_TEXT, old
    return MI300X_TEXT.replace(old, new, 1)


def _line_of(text: str, fragment: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if fragment in line)


# ------------------------------------------------------------------------------------------------ bundled files


def test_list_devices_has_the_bundled_set() -> None:
    assert set(list_devices()) >= BUNDLED
    assert list_devices() == sorted(list_devices())


@pytest.mark.parametrize("name", sorted(BUNDLED))
def test_bundled_yaml_loads(name: str) -> None:
    dev = load_device(name)
    assert dev.name == name
    assert dev.peak_flop_per_s["bf16"] > 1e14
    assert dev.hbm_bytes > 1e10 and isinstance(dev.hbm_bytes, int)
    assert dev.hbm_bandwidth_bytes_per_s > 1e12
    assert dev.gpus_per_node == 8
    assert 1e-7 < dev.intra_node.latency_s < 1e-4 and 1e-7 < dev.nic.latency_s < 1e-4
    assert dev.nic.bandwidth_bytes_per_s < dev.intra_node.bandwidth_per_direction_bytes_per_s
    # fp16 dense equals bf16 dense on every bundled part (an assumption stated in each file's sources)
    assert dev.peak_flop_per_s["fp16"] == dev.peak_flop_per_s["bf16"]


@pytest.mark.parametrize("name", sorted(BUNDLED))
def test_every_number_has_a_tagged_source(name: str) -> None:
    dev = load_device(name)
    numbers = _numbers(dev.model_dump(exclude={"sources"}))
    assert "peak_flop_per_s.bf16" in numbers and "nic.latency_s" in numbers
    assert [p for p in numbers if p not in dev.sources] == []
    for key, text in dev.sources.items():
        assert re.match(r"(R|R2|D|A|\?): \S", text), f"{name}: source of {key} lacks a tag: {text!r}"
        if not text.startswith("A:"):
            assert "§" in text, f"{name}: source of {key} names no section: {text!r}"
    for key in ("intra_node.latency_s", "nic.latency_s"):
        assert dev.sources[key].startswith("A:"), "latencies are assumptions and must say so"


@pytest.mark.parametrize(
    ("alias", "name"),
    [("mi300x", "mi300x"), ("MI300X", "mi300x"), ("  MI325X ", "mi325x"), ("MI355X", "mi355x"), ("h100", "h100-sxm"),
     ("h100-sxm", "h100-sxm"), ("H100_SXM5", "h100-sxm"), ("h200", "h200"), ("H200 SXM", "h200"), ("B200", "b200"),
     ("a100", "a100-80g"), ("A100-80GB", "a100-80g")],
)
def test_names_and_aliases(alias: str, name: str) -> None:
    assert load_device(alias).name == name


def test_path_and_name_give_the_same_spec() -> None:
    assert load_device(HARDWARE_DIR / "mi300x.yaml") == load_device(str(HARDWARE_DIR / "mi300x.yaml"))
    assert load_device(HARDWARE_DIR / "mi300x.yaml") == load_device("mi300x")


# ------------------------------------------------------------------------------------------------ units in YAML


def test_unit_strings_and_plain_numbers_agree(tmp_path: Path) -> None:
    text = MI300X_TEXT
    for old, new in [("1307.4 TFLOP/s", "1.3074e+15"), ("2614.9 TFLOP/s", "2614.9e12"), ("196592MiB", "206141652992"),
                     ("5.3TB/s", "5.3e+12"), ("448GB/s", "4.48e+11"), ("400Gbps", "50e9"), ("2us", "2.0e-6"),
                     ("5us", "0.000005")]:
        assert old in text
        text = text.replace(old, new)
    assert load_device(_write(tmp_path, text)) == load_device("mi300x")


def test_si_values_of_mi300x() -> None:
    dev = load_device("mi300x")
    assert dev.hbm_bytes == 196592 * 2**20  # hardware_specs/README.md § Device memory
    assert dev.hbm_bandwidth_bytes_per_s == pytest.approx(5.3e12)
    assert dev.intra_node.bandwidth_per_direction_bytes_per_s == pytest.approx(448e9)
    assert dev.nic.bandwidth_bytes_per_s == pytest.approx(400e9 / 8)  # 400 Gb/s in bytes/s
    assert dev.intra_node.latency_s == pytest.approx(2e-6)


# Device memory totals as the drivers print them in public logs (hardware_specs/README.md § Device memory gives each
# source): nvidia-smi MiB on NVIDIA parts, amd-smi MiB / rocm-smi bytes on AMD parts.
MEASURED_HBM_BYTES = {
    "h100-sxm": 81559 * 2**20,    # nvidia-smi, modal-labs/modal-client #2797, NVIDIA/nccl #1264
    "a100-80g": 81920 * 2**20,    # nvidia-smi, modal-labs/modal-client #2797
    "h200": 143771 * 2**20,       # nvidia-smi, sgl-project/sglang #3196
    "b200": 183359 * 2**20,       # nvidia-smi, NVIDIA/TensorRT-LLM #10278
    "mi300x": 206141652992,       # rocm-smi VRAM Total Memory (B), ROCm/legacy-rocm-build #4750
    "mi325x": 274861129728,       # torch total_memory on an MI325X; amd-smi 262128 MiB
    "mi355x": 309220868096,       # rocm-smi --showmeminfo vram on an MI355X; amd-smi 294896 MiB
}


@pytest.mark.parametrize("name", sorted(MEASURED_HBM_BYTES))
def test_hbm_is_the_measured_total(name: str) -> None:
    assert load_device(name).hbm_bytes == MEASURED_HBM_BYTES[name]


def test_binary_prefix_is_honoured(tmp_path: Path) -> None:
    assert load_device(_write(tmp_path, _edited("196592MiB", "64GiB"))).hbm_bytes == 64 * 2**30


# ------------------------------------------------------------------------------------------------ user errors


def _error(tmp_path: Path, text: str) -> tuple[str, Path]:
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_device(path)
    return str(info.value), path


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match="not found") as info:
        load_device(path)
    assert str(path) in str(info.value) and "mi300x" in str(info.value)


def test_unknown_key_names_file_line_and_fix(tmp_path: Path) -> None:
    text = _edited("hbm_bytes: 196592MiB", "hbm_bytse: 196592MiB")
    msg, path = _error(tmp_path, text)
    assert f"{path}:{_line_of(text, 'hbm_bytse')}" in msg
    assert "'hbm_bytse'" in msg and "unknown key" in msg and "hbm_bytes" in msg  # the fix lists the allowed keys


def test_unknown_nested_key(tmp_path: Path) -> None:
    text = _edited("  latency_s: 2us", "  latncy_s: 2us")
    msg, path = _error(tmp_path, text)
    assert f"{path}:{_line_of(text, 'latncy_s')}" in msg and "intra_node.latncy_s" in msg
    assert "intra_node.latency_s" in msg and "missing" in msg


def test_unknown_dtype(tmp_path: Path) -> None:
    msg, path = _error(tmp_path, _edited("  fp8: 2614.9", "  fp9: 2614.9"))
    assert str(path) in msg and "peak_flop_per_s.fp9" in msg and "bf16" in msg


@pytest.mark.parametrize(
    ("old", "new", "key"),
    [("links_per_gpu: 7", "links_per_gpu: seven", "intra_node.links_per_gpu"),
     ("links_per_gpu: 7", "links_per_gpu: 7.5", "intra_node.links_per_gpu"),
     ("tdp_w: 750", "tdp_w: true", "tdp_w"),
     ("hbm_bytes: 196592MiB", "hbm_bytes: [192]", "hbm_bytes"),
     ("hbm_bytes: 196592MiB", "hbm_bytes: -192GB", "hbm_bytes"),
     ("hbm_bytes: 196592MiB", "hbm_bytes: 0", "hbm_bytes"),
     ("5.3TB/s", "5.3 furlongs", "hbm_bandwidth_bytes_per_s"),
     ("  latency_s: 5us", "  latency_s: soon", "nic.latency_s"),
     ("vendor: amd", "vendor: intel", "vendor"),
     ("kind: xgmi", "kind: infiniband", "intra_node.kind")],
)
def test_wrong_type_or_value(tmp_path: Path, old: str, new: str, key: str) -> None:
    text = _edited(old, new)
    msg, path = _error(tmp_path, text)
    assert f"{path}:{_line_of(text, new.strip())}" in msg
    assert f"key '{key}'" in msg and "fix:" in msg


def test_number_without_source(tmp_path: Path) -> None:
    text = "\n".join(line for line in MI300X_TEXT.splitlines() if not line.startswith("  tdp_w:"))
    msg, path = _error(tmp_path, text)
    assert str(path) in msg and "key 'sources'" in msg and "tdp_w" in msg and "without a source" in msg


def test_nic_efficiency_above_line_rate(tmp_path: Path) -> None:
    text = MI300X_TEXT.replace("  latency_s: 5us", "  latency_s: 5us\n  efficiency: 1.2", 1)
    msg, path = _error(tmp_path, text)
    assert f"{path}:{_line_of(text, 'efficiency: 1.2')}" in msg
    assert "key 'nic.efficiency'" in msg and "fix:" in msg


def test_example_values_follow_the_full_key(tmp_path: Path) -> None:
    nic = _error(tmp_path, MI300X_TEXT.replace("  latency_s: 5us", "  latency_s: 5us\n  efficiency: high", 1))[0]
    assert "key 'nic.efficiency'" in nic and "write e.g. 0.96" in nic
    curves = MI300X_TEXT[:MI300X_TEXT.index("\nefficiency:")] + "\nefficiency: 0.9\n" + MI300X_TEXT[
        MI300X_TEXT.index("\nsources:"):]
    msg = _error(tmp_path, curves)[0]  # the top-level curves block is not the NIC's fraction
    assert "key 'efficiency'" in msg and "0.96" not in msg


def test_nic_efficiency_needs_a_source(tmp_path: Path) -> None:
    text = MI300X_TEXT.replace("  latency_s: 5us", "  latency_s: 5us\n  efficiency: 0.9", 1)
    msg, path = _error(tmp_path, text)
    assert str(path) in msg and "nic.efficiency" in msg and "without a source" in msg


def test_source_for_no_field(tmp_path: Path) -> None:
    msg, _ = _error(tmp_path, MI300X_TEXT.rstrip("\n") + '\n  hbm_byte: "R: typo"\n')
    assert "hbm_byte" in msg and "name no field" in msg


def test_bad_yaml_syntax(tmp_path: Path) -> None:
    msg, path = _error(tmp_path, "name: mi300x\nvendor: [amd\n")
    assert str(path) in msg and "invalid YAML" in msg


@pytest.mark.parametrize("text", ["", "- a\n- b\n", "just text\n"])
def test_not_a_mapping(tmp_path: Path, text: str) -> None:
    msg, path = _error(tmp_path, text)
    assert str(path) in msg and "mapping" in msg


def test_duplicate_key(tmp_path: Path) -> None:
    text = _edited("tdp_w: 750", "tdp_w: 750\ntdp_w: 751")
    msg, path = _error(tmp_path, text)
    assert f"{path}:{_line_of(text, 'tdp_w: 751')}" in msg and "duplicate" in msg


def test_unknown_device_lists_the_available_ones() -> None:
    with pytest.raises(ConfigError) as info:
        load_device("mi999x")
    msg = str(info.value)
    assert "mi999x" in msg and str(HARDWARE_DIR) in msg
    assert all(name in msg for name in BUNDLED)


def test_custom_search_dir_and_ambiguous_alias(tmp_path: Path) -> None:
    _write(tmp_path, _edited("aliases: []", "aliases: [my-gpu]").replace("name: mi300x", "name: lab"), "lab.yaml")
    assert list_devices(tmp_path) == ["lab"]
    assert load_device("MY_GPU", search_dir=tmp_path).name == "lab"
    _write(tmp_path, _edited("aliases: []", "aliases: [my-gpu]"), "other.yaml")
    with pytest.raises(ConfigError, match="ambiguous"):
        load_device("my-gpu", search_dir=tmp_path)
    assert list_devices(tmp_path / "absent") == []


# ------------------------------------------------------------------------------------------------ models


def test_device_spec_is_frozen() -> None:
    dev = load_device("mi300x")
    with pytest.raises(ValidationError):
        dev.hbm_bytes = 1  # type: ignore[misc]


def test_device_spec_accepts_unit_strings_directly() -> None:
    data = load_device("h100").model_dump()
    data["hbm_bytes"] = "81559MiB"
    data["nic"]["bandwidth_bytes_per_s"] = "400Gbps"
    assert DeviceSpec.model_validate(data) == load_device("h100")


def test_cluster_spec() -> None:
    dev = load_device("mi300x")
    cluster = ClusterSpec(device=dev, nodes=4)
    assert cluster.gpus_per_node == dev.gpus_per_node == 8
    assert cluster.world_size == 32
    assert cluster.inter_node_topology == "rail_optimized" and cluster.oversubscription == 1.0
    small = ClusterSpec.model_validate({"device": dev.model_dump(), "nodes": 2, "gpus_per_node": 4,
                                        "inter_node_topology": "fat_tree", "oversubscription": 2.0})
    assert small.world_size == 8 and small.device == dev


@pytest.mark.parametrize(
    "bad",
    [{"nodes": 0}, {"nodes": 1, "gpus_per_node": 0}, {"nodes": 1, "oversubscription": 0.5},
     {"nodes": 1, "inter_node_topology": "torus"}, {"nodes": 1, "extra": 1}, {}],
)
def test_cluster_spec_rejects(bad: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        ClusterSpec.model_validate({"device": load_device("mi300x"), **bad})


# ------------------------------------------------------------------------------------------------ oracle


def _section_1_table() -> list[dict[str, str]]:
    """The rows of hardware.md §1's peak-spec table as {header: cell}."""
    if not HARDWARE_MD.is_file():
        pytest.skip(f"reference table {HARDWARE_MD} is not present (it lives outside the repository)")
    section = re.search(r"^## 1\..*?(?=^## |^### )", HARDWARE_MD.read_text(encoding="utf-8"), re.M | re.S)
    assert section, "hardware.md has no '## 1.' section"
    rows = [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in section.group(0).splitlines() if line.startswith("|")]
    header, body = rows[0], [r for r in rows[2:] if len(r) == len(rows[0])]
    return [dict(zip(header, r, strict=True)) for r in body]


def _column(row: dict[str, str], pattern: str) -> tuple[str, str]:
    """(header, cell) of the one column whose header matches `pattern` entirely."""
    (hit,) = [(h, c) for h, c in row.items() if re.fullmatch(pattern, h)]
    return hit


def _quantity(cell: str, unit_pattern: str) -> str | None:
    m = re.search(rf"(\d+(?:\.\d+)?)\s*({unit_pattern})", cell)
    return f"{m.group(1)} {m.group(2)}" if m else None


def test_yaml_values_match_hardware_md_table() -> None:
    rows = _section_1_table()
    matched: set[str] = set()
    for row in rows:
        label = row["GPU"]
        try:
            dev = load_device(label.split()[0])
        except ConfigError:
            continue  # a part in the table without a bundled YAML (MI350X)
        matched.add(dev.name)
        peaks = {str(k): v for k, v in dev.peak_flop_per_s.items()}
        for dtype, pattern in (("bf16", r"BF16 .*FLOP/s"), ("fp8", r"FP8 .*FLOP/s")):
            header, cell = _column(row, pattern)
            unit = re.search(r"\w?FLOP/s", header).group(0)  # type: ignore[union-attr]
            number = re.search(r"\d+(?:\.\d+)?", cell)
            if number is None:
                assert dtype not in peaks, f"{label}: table has no {dtype} peak, YAML has one"
                continue
            expected = parse_flop_rate(f"{number.group(0)} {unit}")
            assert peaks[dtype] == pytest.approx(expected, rel=1e-12), f"{label} {dtype}"
        hbm = _quantity(_column(row, "HBM")[1], r"GiB|GB|TB")
        # the datasheet's "80 GB", or the device's measured total (hardware_specs/README.md § Device memory), which
        # lies between its decimal and its binary reading
        table = parse_bytes(hbm.replace(" ", "")) if hbm else 0.0
        assert hbm and table * (1 - 1e-12) <= dev.hbm_bytes <= table * 2**30 / 1e9 * (1 + 1e-12), label
        bandwidth = _quantity(_column(row, "HBM BW")[1], r"[TG]B/s")
        assert bandwidth and dev.hbm_bandwidth_bytes_per_s == pytest.approx(parse_bandwidth(bandwidth), rel=1e-12)
        nic = _quantity(_column(row, r".*NIC.*")[1], r"Gb/s")
        assert nic and dev.nic.bandwidth_bytes_per_s == pytest.approx(parse_bandwidth(nic), rel=1e-12), label
        tbp = re.search(r"(\d+)\s*W\b", _column(row, "TBP")[1])
        assert tbp and dev.tdp_w == pytest.approx(float(tbp.group(1))), label
        fp4 = re.search(r"FP4\S*\s+(\d+(?:\.\d+)?)\s*PF", _column(row, r"FP8 .*FLOP/s")[1])
        if fp4:
            assert dev.peak_flop_per_s["fp4"] == pytest.approx(parse_flop_rate(f"{fp4.group(1)} PFLOP/s"))
    assert matched >= BUNDLED, f"bundled devices without a row in hardware.md §1: {sorted(BUNDLED - matched)}"
