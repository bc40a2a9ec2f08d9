"""An MTP depth's routed experts are expert parameters: sharded over the expert grid and the expert-data-parallel
group like the decoder's, not over dense data parallelism. An audit counted the DeepSeek-V3 proxy's last pipeline
rank by hand (tp 2, pp 4, ep 16, etp 1 on 64 GPUs: dense state sharded over 8, experts over 1): four MoE layers of
4 local experts (decoder layers and the MTP depth, built like the last decoder layer), where the memory estimate
counted three, its optimizer state 9.50 GiB instead of 11.23 GiB and its peak 1.72 GiB low."""

from __future__ import annotations

from pathlib import Path

import pytest

from projection import api
from projection.memory.estimate import estimate_memory
from projection.perf.stage_params import stage_params
from projection.workload.params import per_rank_params
from projection.workload.stages import split_stages

ROOT = Path(__file__).resolve().parents[2]
PROXY = ROOT.parent / "shared/fixtures/megatron/deepseekv3_proxy_flex_tp1pp4emp16etp1cp1_release/model_config.yaml"
GiB = 2**30


@pytest.fixture(scope="module")
def proxy() -> api.Scenario:
    if not PROXY.is_file():
        pytest.skip("shared/fixtures/megatron absent (user clone)")
    return api.load(PROXY, nodes=8)


def test_the_mtp_depths_experts_are_counted_as_experts(proxy: api.Scenario) -> None:
    m, p = proxy.model, proxy.plan
    assert (p.tp, p.pp, p.ep, p.etp_, m.mtp_num_layers) == (2, 4, 16, 1, 1) and m.moe is not None
    local = m.moe.num_experts // p.ep
    one_layer = local * 3 * m.hidden_size * m.moe.expert_ffn_hidden_size  # SwiGLU: gate, up and down
    last = per_rank_params(m, p)[-1]
    moe_layers = sum(m.is_moe_layer(i) for i in last.layers) + m.mtp_num_layers * m.is_moe_layer(m.num_layers - 1)
    assert (one_layer, moe_layers) == (176_160_768, 4)  # the audit's hand count
    assert last.by_component["experts"] == moe_layers * one_layer
    # the pricing's own split (perf/stage_params.py, a separate count) agrees, rank by rank
    for rank in per_rank_params(m, p):
        slots = [s for s in split_stages(m, p) if s.pp_rank == rank.pp_rank]
        expert = sum(e for s in slots for _, _, e in stage_params(m, p, s).components)
        assert rank.by_component["experts"] == expert
        assert sum(rank.by_component.values()) == rank.params


def test_the_last_ranks_optimizer_state_shards_the_experts_over_expert_dp(proxy: api.Scenario) -> None:
    report = estimate_memory(proxy)
    last = report.ranks[-1]
    # 12 B per parameter (fp32 master + two fp32 moments): dense over dp x cp = 8, experts over expert dp = 1
    expected = 12 * (2_399_236_096 / 8 + 704_643_072 / 1)
    assert last.bytes["optimizer"] == pytest.approx(expected, rel=1e-9)
    assert last.bytes["optimizer"] / GiB == pytest.approx(11.23, abs=0.005)
