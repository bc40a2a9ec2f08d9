"""Device values a unit slip makes, refused at their key with an example (an audit: `hbm_bytes: 192` projected
"46.18 GiB of 0.0 GiB -> OUT OF MEMORY"; `nic.latency_s: 5`, meant as 5 us, priced 70 s of data-parallel
communication; `192Gb` read as 192 GB where datasheets write bits so)."""

from __future__ import annotations

from pathlib import Path

import pytest

from projection import api
from projection.errors import ConfigError
from projection.units import parse_bytes

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "llama3_8b_inline.yaml"


@pytest.mark.parametrize("key,value,fix", [("hbm_bytes", "192", "192GB"), ("hbm_bytes", 40, "192GB"),
                                           ("hbm_bytes", "192Gb", "192GB"), ("nic.latency_s", 5, "2us"),
                                           ("intra_node.latency_s", "0.5", "2us")])
def test_refused_at_its_key_with_an_example(key: str, value: object, fix: str) -> None:
    with pytest.raises(ConfigError) as err:
        api.load(EXAMPLE, overrides={f"cluster.device.{key}": value})
    (problem,) = err.value.problems
    assert problem.key == f"--set cluster.device.{key}" and fix in (problem.fix or "")


def test_the_real_values_still_load() -> None:
    for key, value in (("hbm_bytes", "60GiB"), ("hbm_bytes", "192GB"), ("nic.latency_s", "5us"),
                       ("nic.latency_s", 5e-6), ("hbm_bytes", 2.0e11)):
        api.load(EXAMPLE, overrides={f"cluster.device.{key}": value})
    assert parse_bytes("192GB") == parse_bytes("192gb") == 1.92e11 and parse_bytes("64GiB") == 2**36
    with pytest.raises(ValueError, match="reads as bits"):
        parse_bytes("80Mb")


def test_a_mesh_with_fewer_links_than_peers_is_refused(tmp_path: Path) -> None:
    """An audit ran a 16-GPU mesh node with 7 links per GPU: the mesh formula then gave groups above 8 full bandwidth.
    Refused at links_per_gpu, in a device YAML and as a what-if alike; a switch node of 16 still loads."""
    from projection.specs.hardware import load_device

    yaml_text = (Path(__file__).resolve().parents[2] / "hardware_specs" / "mi300x.yaml").read_text()
    bad = tmp_path / "mesh16.yaml"
    bad.write_text(yaml_text.replace("gpus_per_node: 8", "gpus_per_node: 16", 1))
    with pytest.raises(ConfigError) as err:
        load_device(str(bad))
    (problem,) = err.value.problems
    assert problem.key == "intra_node.links_per_gpu" and problem.line is not None and "15 other GPUs" in problem.message
    with pytest.raises(ConfigError) as err:
        api.load(EXAMPLE, overrides={"cluster.device.gpus_per_node": 16})
    assert any(p.key and p.key.endswith("intra_node.links_per_gpu") for p in err.value.problems)
    api.load(EXAMPLE, overrides={"cluster.device.gpus_per_node": 16, "cluster.device.intra_node.topology": "switch"})
