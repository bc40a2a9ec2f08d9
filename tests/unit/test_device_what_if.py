"""What-if edits of the loaded device (`--set cluster.device.*`) reach the prices, on the calibrated path too.

A shipped calibration was measured on the bundled device's machine (8 NICs of 400 Gb/s per 8-GPU node). A cluster
with other NICs keeps the efficiency that measurement shows and scales by the analytic bandwidth: a data-parallel
group of one GPU per node over 8 nodes is bound by its NIC share, so 1 NIC per node instead of 8 makes a large
reduce-scatter 8x slower, and 100 Gb/s NICs instead of 400 Gb/s 4x slower, as the roofline path (no calibration)
says by its own arithmetic."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from projection import api
from projection.cost.collectives import GroupPlacement
from projection.perf.costmodel import default_cost_model

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "llama3.1_70B-mi300x.yaml"
DP = GroupPlacement(8, 1, 8)  # one GPU per node, 8 nodes: every byte crosses that GPU's NIC share
SIZE = 4 << 30


def seconds(*edits: str, calibrated: bool = True) -> float:
    sc = api.load(EXAMPLE, overrides=dict(e.split("=", 1) for e in edits))
    model = default_cost_model(sc)
    if not calibrated:
        model = model.fallback  # the roofline of the same scenario
    return model.collective_seconds("reduce_scatter", SIZE, DP)


@pytest.mark.parametrize("calibrated", [True, False], ids=["calibrated", "roofline"])
def test_nic_count_and_speed_scale_inter_node_collectives(calibrated: bool) -> None:
    base = seconds(calibrated=calibrated)
    one = seconds("cluster.device.nic.count_per_node=1", calibrated=calibrated)
    slow = seconds("cluster.device.nic.bandwidth_bytes_per_s=100Gbps", calibrated=calibrated)
    print(f"\n{'calibrated' if calibrated else 'roofline'}: 8 NICs {base:.4f} s, 1 NIC {one:.4f} s, "
          f"100 Gb/s {slow:.4f} s")
    assert one / base == pytest.approx(8.0, rel=0.01)
    assert slow / base == pytest.approx(4.0, rel=0.01)


def test_the_calibration_keeps_its_measured_efficiency() -> None:
    """The bundled machine itself is priced from the calibration's curves (not the roofline), and a what-if keeps
    the calibrated/roofline ratio of that machine."""
    cal, roof = seconds(), seconds(calibrated=False)
    assert cal != pytest.approx(roof, rel=0.01)
    one_cal = seconds("cluster.device.nic.count_per_node=1")
    one_roof = seconds("cluster.device.nic.count_per_node=1", calibrated=False)
    assert one_cal / one_roof == pytest.approx(cal / roof, rel=0.01)


def test_an_edit_is_cited_and_a_wrong_one_refused() -> None:
    sc = api.load(EXAMPLE, overrides={"cluster.device.nic.count_per_node": "4"})
    assert sc.cluster.device.nic.count_per_node == 4
    assert "what-if" in sc.cluster.device.sources["nic.count_per_node"]
    for edit, says in (("cluster.device.foo_bar=1", "unknown device field"),
                       ("cluster.device.nic.count_per_node=abc", "valid integer"),
                       ("cluster.device=3", "a table of device fields")):
        res = subprocess.run([sys.executable, "-m", "projection", "performance", "--config", str(EXAMPLE), "--set",
                              edit], capture_output=True, text=True, timeout=120)
        assert res.returncode == 2 and says in res.stderr and "Traceback" not in res.stderr, (edit, res.stderr)
        assert res.stdout == ""


def test_latency_edits_reach_the_calibrated_path() -> None:
    """With the NIC latency 5 us -> 50 us, a 16 MiB all-reduce over 2 nodes (the smallest size of the shipped 2-node
    sweep, whose measured ring is the price there) keeps its measured time plus the added latency of each of the
    ring's 2 (n - 1) = 30 steps: 30 x 45 us. Below the sweep's sizes the tuner's tree competes (fewer steps)."""
    small = GroupPlacement(16, 8, 2, True)

    def t(*edits: str, size: int = 2**24) -> float:
        sc = api.load(EXAMPLE, overrides=dict(e.split("=", 1) for e in edits))
        return default_cost_model(sc).collective_seconds("all_reduce", size, small)

    base, slow = t(), t("cluster.device.nic.latency_s=50us")
    print(f"\n16 MiB all-reduce over 2 nodes: {base * 1e6:.1f} us, NIC latency 50 us: {slow * 1e6:.1f} us")
    assert slow - base == pytest.approx(30 * 45e-6, rel=1e-6)
    tiny, tiny_slow = t(size=4096), t("cluster.device.nic.latency_s=50us", size=4096)
    assert 0 < tiny_slow - tiny < 30 * 45e-6  # a tree's fewer latency steps


def test_an_own_calibration_prices_the_edit_from_the_cluster_as_loaded() -> None:
    """--calibration FILE is taken as measured on the cluster as loaded, before the what-if: the shipped file given
    explicitly prices 1 NIC per node as the default path does (it used to cancel the edit out)."""
    from projection.paths import REPO_ROOT

    edit = {"cluster.device.nic.count_per_node": "1"}
    own = REPO_ROOT / "calibrations" / "mi300x.json"
    sc = api.load(EXAMPLE, overrides=edit)
    explicit = default_cost_model(sc, calibration=own).collective_seconds("reduce_scatter", SIZE, DP)
    assert explicit == pytest.approx(default_cost_model(sc).collective_seconds("reduce_scatter", SIZE, DP), rel=1e-9)
    assert explicit / seconds() == pytest.approx(8.0, rel=0.01)


def test_peak_and_hbm_edits_reach_the_calibrated_compute_tables(tmp_path: Path) -> None:
    """An audit doubled and halved the bf16 peak on mi300x: the calibrated GEMMs moved -2.6 / +9 % (the halved peak
    only capping them), the fp8 step not at all, while MFU was quoted against the edited peak. A measured time is now
    scaled by the measured / edited rate (the dtype's peak for GEMMs and attention, HBM bandwidth for memory-bound
    ops), as the collectives are by their fabric; the roofline fallback prices the edited device by itself."""
    from projection.workload.ops_base import gemm, mem

    def priced(*edits: str, calibration: Path | None = None) -> tuple[tuple[float, str], tuple[float, str]]:
        sc = api.load(EXAMPLE, overrides=dict(e.split("=", 1) for e in edits))
        model = default_cost_model(sc, calibration=calibration)
        g = gemm("fc1", "F", 4096, 4096, 4096, "bf16", 2, layout="TN")  # inside the measured bf16 table
        m = mem("add", "F", 2**27, 2**27)
        return (model.op_seconds(g), model.provenance(g)), (model.op_seconds(m), model.provenance(m))

    (g1, g1_src), (m1, m1_src) = priced()
    (g2, g2_src), (m2, _) = priced("cluster.device.peak_flop_per_s.bf16=2614.8TFLOP/s",
                                   "cluster.device.hbm_bandwidth_bytes_per_s=10.6TB/s")
    assert g1_src.startswith("calibrated: mi300x.json gemm bf16") and m1_src.startswith("calibrated: mi300x.json")
    assert g2 == pytest.approx(g1 / 2, rel=1e-9) and m2 == pytest.approx(m1 / 2, rel=1e-9)
    assert "the device edit" in g2_src
    # one's own calibration is taken as measured on the device as loaded: scaled by the edit the same way
    own = tmp_path / "own.json"
    own.write_text((Path(__file__).resolve().parents[2] / "calibrations" / "mi300x.json").read_text())
    (o1, _), _ = priced(calibration=own)
    (o2, _), _ = priced("cluster.device.peak_flop_per_s.bf16=653.7TFLOP/s", calibration=own)
    assert o1 == pytest.approx(g1) and o2 == pytest.approx(2 * o1, rel=1e-9)


def test_inspect_shows_the_device_edits() -> None:
    """An audit: `inspect --set cluster.device.hbm_bytes=60GiB` printed nothing of the edit that `memory` used."""
    from projection.report.inspect import build_inspect_report

    sc = api.load(EXAMPLE, overrides={"cluster.device.hbm_bytes": "60GiB", "cluster.device.nic.count_per_node": 4})
    report = build_inspect_report(sc)
    rows = {k: (v, o) for k, v, o in report.resolved}
    assert rows["cluster.device.hbm_bytes"][0] == 60 * 2**30 == sc.cluster.device.hbm_bytes
    assert rows["cluster.device.nic.count_per_node"][0] == 4 and "--set" in rows["cluster.device.hbm_bytes"][1]
    assert report.to_dict()["cluster"]["device_edits"] == {"hbm_bytes": 60 * 2**30, "nic.count_per_node": 4}
    assert "cluster.device.hbm_bytes" in report.to_table()
    assert "device_edits" in build_inspect_report(api.load(EXAMPLE)).to_dict()["cluster"]
