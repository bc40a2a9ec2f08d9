"""Published memory formulas and values reproduced (shared/reference/validation-public.md §5):
Korthikanti et al. 2022 per-layer activation formulas and Figure 1 per-GPU values; the ZeRO paper's model-state
example (Rajbhandari et al. 2020, Figure 1). The expected values are typed in from the paper / reference tables."""

from __future__ import annotations

import pytest

from projection.memory.activations import saved_layer_bytes
from projection.memory.model_states import model_state_bytes
from projection.specs.model import ModelSpec
from projection.specs.plan import ParallelPlan
from projection.specs.training import TrainingSpec
from projection.workload.params import RankParams

GiB = 2**30


def gpt(h: int, a: int, layers: int, vocab: int = 51200) -> ModelSpec:
    return ModelSpec(num_layers=layers, hidden_size=h, num_attention_heads=a, ffn_hidden_size=4 * h, gated_mlp=False,
                     activation="gelu", vocab_size=vocab, norm="layernorm", add_bias_linear=True, tie_embeddings=True,
                     position_embedding="learned", max_position_embeddings=2048)


# Korthikanti §4 (16-bit activations, unfused attention with dropout): bytes per layer.
S, B, H, A, T = 2048, 1, 12288, 96, 8
FORMULAS = {
    ("none", False, False): S * B * H * (34 + 5 * A * S / H),                   # no parallelism
    ("tp", False, False): S * B * H * (10 + 24 / T + 5 * A * S / (H * T)),     # TP only
    ("tp", True, False): S * B * H * (34 + 5 * A * S / H) / T,                 # TP + SP
    ("tp", False, True): S * B * H * (10 + 24 / T),                            # TP + selective
    ("tp", True, True): 34 * S * B * H / T,                                    # TP + SP + selective
}


@pytest.mark.parametrize(("par", "sp", "selective"), list(FORMULAS), ids=lambda x: str(x))
def test_korthikanti_per_layer(par: str, sp: bool, selective: bool) -> None:
    training = TrainingSpec(seq_length=S, micro_batch_size=B, params_dtype="fp16", dropout=0.1,
                            attention_backend="unfused")
    tp = 1 if par == "none" else T
    rec = {"granularity": "selective", "modules": ("core_attn",)} if selective else {}
    plan = ParallelPlan(tp=tp, sp=sp, dp=1, recompute=rec)
    assert saved_layer_bytes(gpt(H, A, 4), training, plan, 0, False) == pytest.approx(FORMULAS[(par, sp, selective)],
                                                                                     rel=1e-12)


def test_korthikanti_full_recompute_keeps_layer_input() -> None:
    training = TrainingSpec(seq_length=S, micro_batch_size=B, params_dtype="fp16", dropout=0.1)
    plan = ParallelPlan(tp=1, dp=1, recompute={"granularity": "full", "method": "uniform", "num_layers": 1})
    assert saved_layer_bytes(gpt(H, A, 4), training, plan, 0, True) == 2 * S * B * H


# Korthikanti Figure 1 (GiB per GPU), Table 3 configs: (h, a, layers, tp, pp, vpp, mbs, gbs,
#   params+optimizer, activations TP-only, activations SP+selective).
FIGURE1 = {
    "22B": (6144, 64, 48, 8, 1, 1, 4, 4, 45.5625, 59.25, 9.5625),
    "175B": (12288, 96, 96, 8, 8, 3, 1, 64, 45.5625, 66.84375, 12.3515625),
    "530B": (20480, 128, 105, 8, 35, 3, 1, 280, 31.640625, 114.0234375, 23.076171875),
    "1T": (25600, 160, 128, 8, 64, 1, 1, 512, 32.958984375, 131.25, 26.5625),
}


@pytest.mark.parametrize("name", list(FIGURE1))
def test_korthikanti_figure1(name: str) -> None:
    """First pipeline stage: in-flight microbatches from the schedule's action lists (1F1B or Megatron interleaved)
    times the per-layer formula; transformer layers only, as in the figure (no embedding / logits)."""
    from projection.schedule.inflight import inflight_timeline
    from projection.schedule.registry import build_schedule

    h, a, layers, tp, pp, vpp, mbs, gbs, states_gib, act_tp_gib, act_sel_gib = FIGURE1[name]
    model = gpt(h, a, layers)
    training = TrainingSpec(seq_length=2048, micro_batch_size=mbs, global_batch_size=gbs, params_dtype="fp16",
                            dropout=0.1, attention_backend="unfused")
    sched = build_schedule("interleaved_1f1b" if vpp > 1 else "1f1b", pp, gbs // mbs, vpp)
    peak_rank0 = max(sum(c.values()) for c in inflight_timeline(sched)[0])
    layers_per_chunk = layers // (pp * vpp)
    for sp, rec, expect in ((False, {}, act_tp_gib),
                            (True, {"granularity": "selective", "modules": ("core_attn",)}, act_sel_gib)):
        plan = ParallelPlan(tp=tp, sp=sp, pp=pp, vpp=vpp if vpp > 1 else None, dp=1, recompute=rec,
                            schedule="interleaved_1f1b" if vpp > 1 else "1f1b")
        per_layer = saved_layer_bytes(model, training, plan, 0, False)
        assert peak_rank0 * layers_per_chunk * per_layer / GiB == pytest.approx(expect, rel=1e-9)
    # Model states: 18 B per parameter (fp16 weight, fp32 grad, fp32 master, Adam) over the figure's parameter count
    # per GPU, 12·l·h² / (t·p) (weight matrices only).
    n = 12 * layers * h * h // (tp * pp)
    rank = RankParams(0, n, {"attention": n}, (), vpp)
    st = model_state_bytes(model, training, ParallelPlan(tp=tp, pp=pp, dp=1), rank)
    assert (st.weights + st.gradients + st.optimizer) / GiB == pytest.approx(states_gib, rel=1e-12)


# ZeRO (Rajbhandari et al. 2020, Figure 1): Ψ = 7.5B, N_d = 64, K = 12, fp16 params and gradients.
@pytest.mark.parametrize(("stage", "gb"), [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.875)])
def test_zero_model_states(stage: int, gb: float) -> None:
    psi = 7_500_000_000
    model = gpt(4096, 32, 4)
    training = TrainingSpec(seq_length=2048, params_dtype="fp16",
                            optimizer={"main_grads_dtype": "fp16"})
    plan = ParallelPlan(dp=64, sharding={"zero_stage": stage, "fsdp": "megatron_fsdp" if stage == 3 else "none"})
    st = model_state_bytes(model, training, plan, RankParams(0, psi, {"attention": psi}, (), 1))
    assert round((st.weights + st.gradients + st.optimizer) / 1e9, 3 if stage == 3 else 1) == gb
