"""Each GPU's NIC share when the cluster's nodes hold another number of GPUs than the device's node
(projection/cost/collectives.py Fabric.from_specs, projection/perf/costmodel.py nic_gpus; found by the scaling
audit: `--gpus-per-node 4` on an 8-NIC H100 node gave each GPU two NICs, and a TP group split over two nodes was
priced near NVLink speed). Rail-optimised nodes give each GPU its NIC, so `--gpus-per-node` keeps the share; a NIC
count stated for the cluster's node is shared by its GPUs."""

from __future__ import annotations

from pathlib import Path

import pytest

from projection.cost.collectives import Fabric
from projection.specs.hardware import ClusterSpec, load_device
from tests.cli.test_performance_cli import perf_json

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "llama3.1_70B-mi300x.yaml"  # TP 8, PP 4


def test_the_share_per_gpu() -> None:
    h100 = load_device("h100-sxm")
    nic = h100.nic.bandwidth_bytes_per_s * (h100.nic.efficiency or 1.0)  # one 400 Gb/s NIC per GPU, as achieved

    def share(gpn: int, nic_gpus: int | None = None) -> float:
        return Fabric.from_specs(h100, ClusterSpec(device=h100, nodes=2, gpus_per_node=gpn),
                                 nic_gpus=nic_gpus).inter.beta_bytes_per_s

    assert share(8) == pytest.approx(nic) and share(4) == pytest.approx(nic) and share(16) == pytest.approx(nic)
    assert share(4, nic_gpus=4) == pytest.approx(2 * nic)  # 8 NICs stated for a node of 4 GPUs


def _perf(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    return perf_json(capsys, "--config", str(EXAMPLE), "--hardware", "h100-sxm", *argv)


def test_four_gpu_nodes_price_as_their_nics_stated(capsys: pytest.CaptureFixture[str]) -> None:
    """8 nodes of 4 H100s: the TP 8 groups span two nodes. Keeping the share is the same hardware as stating the
    node's 4 NICs for its 4 GPUs; the TP traffic over one NIC per GPU costs far more than inside an 8-GPU node."""
    kept = _perf(capsys, "--nodes", "8", "--gpus-per-node", "4")
    stated = _perf(capsys, "--nodes", "8", "--gpus-per-node", "4", "--set", "cluster.device.nic.count_per_node=4")
    assert kept["step_time_s"] == pytest.approx(stated["step_time_s"], rel=1e-12)
    assert any("each GPU keeps that node's NIC share" in n for n in kept["notes"])
    assert not any("NIC share" in n for n in stated["notes"])
    eight = _perf(capsys, "--nodes", "4")
    assert kept["comm_total_s"]["tp"] > 1.5 * eight["comm_total_s"]["tp"]


def test_a_stated_nic_count_counts_even_when_it_equals_the_devices(capsys: pytest.CaptureFixture[str]) -> None:
    """An audit stated 4, 6, 7, 8, 9 and 16 NICs for 4-GPU H100 nodes: 8, the device's own count, was priced as if
    nothing were stated (each GPU its one NIC: 0.1099 s of data-parallel communication, the 4-NIC figure), between
    7 (0.0628 s) and 9 (0.0489 s). A stated count is shared by the node's GPUs whatever its value."""
    llama = REPO / "examples" / "llama3_8b_inline.yaml"
    dp = {}
    for n in (4, 7, 8, 9):
        doc = perf_json(capsys, "--config", str(llama), "--hardware", "h100", "--nodes", "8", "--gpus-per-node", "4",
                        "--set", f"cluster.device.nic.count_per_node={n}")
        dp[n] = doc["comm_total_s"]["dp"]
    assert dp[4] > dp[7] > dp[8] > dp[9]
    assert dp[8] == pytest.approx(dp[4] / 2, rel=0.05)  # bandwidth-bound: 8 NICs for 4 GPUs, twice 4's share
