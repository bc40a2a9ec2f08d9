"""FP8 with the first and last decoder layers in bf16 (Megatron-Core --first-last-layers-bf16, Megatron-Bridge's
current-scaling recipes): a job with k of its L layers in bf16 is the fp8 job plus k / L of the way to the same job
without fp8, in every per-layer quantity (GEMM seconds, weights, fp8 weight caches, layer activations), because
Megatron-Core builds and runs those layers with no fp8 context at all (fp8_utils.is_first_last_bf16_layer). The
three jobs are priced along their own paths: the fp8 one and the bf16 one never consult the per-layer rule."""

from __future__ import annotations

from pathlib import Path

import pytest

from projection import api
from projection.errors import ProjectionError
from projection.perf import project
from projection.perf.costmodel import default_cost_model
from projection.perf.pricing import price_stages
from tests.unit.test_bridge_loader import CLUSTER, SMALL, write

L = 8
ARGS = (f"--num-layers {L} --hidden-size 2048 --ffn-hidden-size 5632 --num-attention-heads 16 "
        "--group-query-attention --num-query-groups 4 --swiglu --normalization RMSNorm --disable-bias-linear "
        "--position-embedding-type rope --seq-length 4096 --max-position-embeddings 4096 --micro-batch-size 1 "
        "--global-batch-size 16 --vocab-size 32000 --bf16 --use-distributed-optimizer --tensor-model-parallel-size 2 "
        "--sequence-parallel")
FP8 = "--fp8-format hybrid --fp8-recipe tensorwise --fp8-param-gather"


def load(tmp_path: Path, extra: str, name: str = "job.txt"):  # type: ignore[no-untyped-def]
    path = tmp_path / name
    path.write_text(f"{ARGS} {extra}\n", encoding="utf-8")
    return api.load(path, hardware="h100-sxm", nodes=1, fmt="megatron")


def problems(tmp_path: Path, extra: str) -> str:
    with pytest.raises(ProjectionError) as e:
        load(tmp_path, extra)
    return "\n".join(p.render() for p in e.value.problems)


@pytest.mark.parametrize(("flags", "k"), [("--first-last-layers-bf16", 2),
                                          ("--first-last-layers-bf16 --num-layers-at-start-in-bf16 2 "
                                           "--num-layers-at-end-in-bf16 1", 3)])
def test_k_bf16_layers_are_k_over_l_of_the_way_to_the_job_without_fp8(tmp_path: Path, flags: str, k: int) -> None:
    bf16, fp8, mixed = load(tmp_path, "", "a.txt"), load(tmp_path, FP8, "b.txt"), load(tmp_path, f"{FP8} {flags}")
    assert (mixed.training.fp8.bf16_first_layers, mixed.training.fp8.bf16_last_layers) == (k - 1, 1)

    def between(a: float, b: float) -> float:
        return a + k / L * (b - a)

    gemm = {n: project(sc).breakdown_s["compute.gemm"] for n, sc in (("bf16", bf16), ("fp8", fp8), ("mixed", mixed))}
    assert gemm["mixed"] == pytest.approx(between(gemm["fp8"], gemm["bf16"]), rel=1e-9)
    terms = {n: api.estimate_memory(sc).ranks[0].terms for n, sc in (("bf16", bf16), ("fp8", fp8), ("mixed", mixed))}
    for term in ("weights.params", "activations.dense_layers"):
        assert terms["mixed"][term] == pytest.approx(between(terms["fp8"][term], terms["bf16"][term]), rel=1e-9)
    assert terms["mixed"]["weights.fp8_copies"] == pytest.approx((L - k) / L * terms["fp8"]["weights.fp8_copies"])
    # the stages' priced layers: the first and last as the bf16 job's, the rest as the fp8 job's
    cm = default_cost_model(mixed)
    (stage,) = price_stages(mixed, cm).stages
    (plain,) = price_stages(bf16, cm).stages
    (quant,) = price_stages(fp8, cm).stages
    assert stage.f.seconds == pytest.approx(quant.f.seconds + k / L * (plain.f.seconds - quant.f.seconds), rel=1e-9)


def test_what_megatron_core_refuses(tmp_path: Path) -> None:
    """TransformerConfig.__post_init__: not with delayed scaling, and each count within [0, num_layers / pp]."""
    assert "delayed scaling" in problems(tmp_path, "--fp8-format hybrid --fp8-recipe delayed --first-last-layers-bf16")
    assert "Megatron-Core wants 0 to num_layers / pp = 8 / 2 = 4" in problems(
        tmp_path, f"{FP8} --first-last-layers-bf16 --num-layers-at-end-in-bf16 5 --pipeline-model-parallel-size 2")
    # and for every layout plan searches: 3 + 3 bf16 layers fit pp 2 (4 layers a rank), not pp 4 (2)
    from projection.perf.search import search_layouts

    sc = load(tmp_path, f"{FP8} --first-last-layers-bf16 --num-layers-at-start-in-bf16 3 --num-layers-at-end-in-bf16 3")
    rows = {c.pp: c for c in search_layouts(sc, tp=[1], pp=[2, 4])}
    assert rows[2].status != "refused" and rows[4].status == "refused"
    assert "num_layers / pp = 8 / 4 = 2" in rows[4].problems[0].message
    # without --first-last-layers-bf16 the counts do nothing; without fp8 the flag does nothing
    assert load(tmp_path, f"{FP8} --num-layers-at-start-in-bf16 3").training.fp8.bf16_first_layers == 0
    assert load(tmp_path, "--first-last-layers-bf16").training.fp8 is None


def test_bridge_recipes_and_their_override(tmp_path: Path) -> None:
    """Megatron-Bridge's MixedPrecisionConfig (defaults False, 0, 0) is copied over the model: the current-scaling
    recipe keeps 1 + 1 layers in bf16, the Nemotron ones 2 + 2, the subchannel (blockwise) one none; the perf
    scripts' table with first_last_layers_bf16 false none."""
    def fp8_of(mp: str):  # type: ignore[no-untyped-def]
        text = SMALL.replace("mixed_precision: bf16_mixed\n", "") + mp
        return api.load(write(tmp_path, text), **CLUSTER).training.fp8

    def counts(mp: str) -> tuple[int, int]:
        f = fp8_of(mp)
        return f.bf16_first_layers, f.bf16_last_layers

    assert counts("mixed_precision: bf16_with_fp8_current_scaling_mixed\n") == (1, 1)
    assert counts("mixed_precision: nemotron_h_bf16_with_fp8_current_scaling_mixed\n") == (2, 2)
    assert counts("mixed_precision: bf16_with_fp8_subchannel_scaling_mixed\n") == (0, 0)
    table = ("mixed_precision:\n  bf16: true\n  fp8: hybrid\n  fp8_recipe: tensorwise\n  fp8_param_gather: true\n"
             "  first_last_layers_bf16: false\n  num_layers_at_start_in_bf16: 1\n  num_layers_at_end_in_bf16: 1\n")
    assert counts(table) == (0, 0)
    # a table that turns it on without counts changes no layer (MixedPrecisionConfig's counts default to 0)
    assert counts(table.replace("first_last_layers_bf16: false", "first_last_layers_bf16: true").replace(
        "  num_layers_at_start_in_bf16: 1\n  num_layers_at_end_in_bf16: 1\n", "")) == (0, 0)


def test_megatron_fsdp_holds_the_bf16_layers_units_at_two_bytes(tmp_path: Path) -> None:
    """Megatron-FSDP with fp8 parameter gather: a unit (one decoder layer) is gathered and held in fp8, but the
    layers kept in bf16 are bf16 parameters. With the first and last layer in bf16 the two largest units, which
    reshard-after-forward holds, are those two: the held bytes are the bf16 job's."""
    fsdp = ("--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params --ckpt-format fsdp_dtensor "
            "--no-gradient-accumulation-fusion")
    held = {name: api.estimate_memory(load(tmp_path, f"{fsdp} {extra}", f"{name}.txt")).ranks[0].terms[
        "weights.unsharded_units"] for name, extra in (("bf16", ""), ("fp8", FP8),
                                                        ("mixed", f"{FP8} --first-last-layers-bf16"))}
    assert held["fp8"] < held["bf16"]
    assert held["mixed"] == held["bf16"]


def test_mtp_stays_in_fp8_and_explain_shows_each_layers_formula(tmp_path: Path) -> None:
    """MTP runs in Megatron-Core's global fp8 context whatever the last decoder layer does: its activations are the
    fp8 job's. `memory --explain` prints a formula for the bf16 layers apart, each equal to the estimator's."""
    from projection.memory.activations import layer_tensors
    from projection.memory.explain import layer_formula

    mtp = "--mtp-num-layers 1"
    fp8 = api.estimate_memory(load(tmp_path, f"{FP8} {mtp}", "fp8.txt")).ranks[-1].terms["activations.mtp"]
    sc = load(tmp_path, f"{FP8} {mtp} --first-last-layers-bf16")
    assert api.estimate_memory(sc).ranks[-1].terms["activations.mtp"] == pytest.approx(fp8, rel=1e-12)
    for i in range(L):
        expr, subs = layer_formula(sc, i)
        assert float(expr.subs(subs)) == pytest.approx(sum(layer_tensors(sc.model, sc.training, sc.plan, i).values()))
