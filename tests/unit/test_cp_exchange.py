"""Context parallelism's exchanges as each implementation runs them (workload/ops_attention.py `_cp_pieces`,
perf/items.py): the sizes are checked against the tensors written out here from the shapes, and the exposure
against the rule each source states (Transformer Engine's all-gather "is exposed"; its all-to-all has nothing to hide
behind; the ring's steps and torch's all-gather hide behind attention)."""

from __future__ import annotations

from pathlib import Path

import pytest

from projection import api
from projection.perf import project
from projection.workload.ops import layer_ops

B, S, H, HEADS, KV, D, CP = 1, 8192, 4096, 32, 8, 128, 4
ARGS = (f"--num-layers 4 --hidden-size {H} --ffn-hidden-size 14336 --num-attention-heads {HEADS} "
        f"--group-query-attention --num-query-groups {KV} --swiglu --normalization RMSNorm --disable-bias-linear "
        f"--position-embedding-type rope --seq-length {S} --max-position-embeddings {S} --micro-batch-size {B} "
        f"--global-batch-size 8 --vocab-size 32000 --context-parallel-size {CP} --bf16 --use-flash-attn")


def load(tmp_path: Path, comm: str):  # type: ignore[no-untyped-def]
    path = tmp_path / f"args_{comm}.txt"
    path.write_text(f"{ARGS} --cp-comm-type {comm}\n", encoding="utf-8")
    return api.load(path, hardware="h100-sxm", nodes=1, gpus_per_node=CP, fmt="megatron")


def colls(sc) -> dict[str, tuple[str, str, int, int]]:  # type: ignore[no-untyped-def]
    ops = layer_ops(sc.model, sc.training, sc.plan, 0)
    return {o.name: (o.phase, o.coll, o.coll_bytes, o.count) for o in ops if o.group == "cp"}


def attention(sc):  # type: ignore[no-untyped-def]
    return [o for o in layer_ops(sc.model, sc.training, sc.plan, 0) if o.kind == "attention"]


def test_sizes_of_each_exchange(tmp_path: Path) -> None:
    local = B * S // CP  # this rank's tokens
    kv_chunk = local * KV * 2 * D * 2  # its K and V, bf16
    assert colls(load(tmp_path, "p2p")) == {"attn.cp_ring": ("F", "send_recv", kv_chunk, CP - 1),
                                            "attn.cp_ring.bwd": ("I", "send_recv", 2 * kv_chunk, CP - 1)}
    assert colls(load(tmp_path, "all_gather")) == {
        "attn.cp_ag": ("F", "all_gather", CP * kv_chunk, 1),  # every rank's K/V gathered (the output)
        "attn.cp_ag.bwd": ("I", "all_gather", CP * kv_chunk, 1),
        "attn.cp_rs.bwd": ("I", "reduce_scatter", CP * kv_chunk, 1)}  # the full dK/dV reduced to this rank's
    qkv, out = local * (HEADS * D + 2 * KV * D) * 2, local * HEADS * D * 2  # the send buffers
    assert colls(load(tmp_path, "a2a")) == {"attn.cp_a2a.qkv": ("F", "all_to_all", qkv, 1),
                                            "attn.cp_a2a.out": ("F", "all_to_all", out, 1),
                                            "attn.cp_a2a.dout": ("I", "all_to_all", out, 1),
                                            "attn.cp_a2a.dqkv": ("I", "all_to_all", qkv, 1)}


def test_order_around_the_attention(tmp_path: Path) -> None:
    sc = load(tmp_path, "a2a")
    names = [o.name for o in layer_ops(sc.model, sc.training, sc.plan, 0) if "core" in o.name or "cp_" in o.name]
    assert names == ["attn.cp_a2a.qkv", "attn.core", "attn.cp_a2a.out", "attn.cp_a2a.dout", "attn.core.bwd",
                     "attn.cp_a2a.dqkv"]
    sc = load(tmp_path, "all_gather")
    names = [o.name for o in layer_ops(sc.model, sc.training, sc.plan, 0) if "core" in o.name or "cp_" in o.name]
    assert names == ["attn.cp_ag", "attn.core", "attn.cp_ag.bwd", "attn.core.bwd", "attn.cp_rs.bwd"]


def test_ulysses_attention_has_the_rings_flops_on_heads_over_cp(tmp_path: Path) -> None:
    (f_ring, b_ring), (f_a2a, b_a2a) = attention(load(tmp_path, "p2p")), attention(load(tmp_path, "a2a"))
    assert (f_a2a.flop, b_a2a.flop) == pytest.approx((f_ring.flop, b_ring.flop))
    assert (f_a2a.heads, f_a2a.kv_heads, f_a2a.m, f_a2a.n) == (HEADS // CP, KV // CP, S, S)
    assert (f_ring.heads, f_ring.m, f_ring.n) == (HEADS, S // CP, S)


def test_exposure(tmp_path: Path) -> None:
    for comm in ("all_gather", "a2a"):
        r = project(load(tmp_path, comm))
        assert r.comm_total_s["cp"] > 0
        assert r.breakdown_s["comm.cp"] == pytest.approx(r.comm_total_s["cp"], rel=1e-9), comm
        assert not [n for n in r.notes if n.startswith("context parallelism")]
    ring = project(load(tmp_path, "p2p"))
    assert ring.breakdown_s["comm.cp"] < ring.comm_total_s["cp"]


def test_hierarchical_a2a_p2p(tmp_path: Path) -> None:
    """a2a+p2p over [A, B] = [2, 2] (TE AttnFuncWithCPAndKVP2P with cp_group = [a2a, p2p]): Q/K/V all-to-all over
    the A group before the ring, output after; the ring's B - 1 steps move a K/V as large as this rank's own (heads
    / A of A x the local rows), forward K/V, backward K/V with dK/dV; attention on heads / A of A x the local queries
    against every key: the ring's FLOPs."""
    a, ring = 2, CP // 2
    path = tmp_path / "hier.txt"
    path.write_text(f"{ARGS} --cp-comm-type a2a+p2p --hierarchical-context-parallel-sizes {a} {ring}\n",
                    encoding="utf-8")
    sc = api.load(path, hardware="h100-sxm", nodes=1, gpus_per_node=CP, fmt="megatron")
    assert sc.plan.cp_hierarchy == (a, ring)
    ops = layer_ops(sc.model, sc.training, sc.plan, 0)
    got = {o.name: (o.group, o.phase, o.coll, o.coll_bytes, o.count) for o in ops if o.kind == "collective"
           and o.group and o.group.startswith("cp")}
    local = B * S // CP
    kv_chunk = local * KV * 2 * D * 2
    qkv, out = local * (HEADS * D + 2 * KV * D) * 2, local * HEADS * D * 2
    assert got == {"attn.cp_a2a.qkv": ("cp_a2a", "F", "all_to_all", qkv, 1),
                   "attn.cp_ring": ("cp_ring", "F", "send_recv", kv_chunk, ring - 1),
                   "attn.cp_a2a.out": ("cp_a2a", "F", "all_to_all", out, 1),
                   "attn.cp_a2a.dout": ("cp_a2a", "I", "all_to_all", out, 1),
                   "attn.cp_ring.bwd": ("cp_ring", "I", "send_recv", 2 * kv_chunk, ring - 1),
                   "attn.cp_a2a.dqkv": ("cp_a2a", "I", "all_to_all", qkv, 1)}
    names = [o.name for o in ops if "core" in o.name or "cp_" in o.name]
    assert names == ["attn.cp_a2a.qkv", "attn.cp_ring", "attn.core", "attn.cp_a2a.out", "attn.cp_a2a.dout",
                     "attn.core.bwd", "attn.cp_ring.bwd", "attn.cp_a2a.dqkv"]
    (f_ring, b_ring), (f, b) = attention(load(tmp_path, "p2p")), attention(sc)
    assert (f.flop, b.flop) == pytest.approx((f_ring.flop, b_ring.flop))
    assert (f.heads, f.kv_heads, f.m, f.n) == (HEADS // a, KV // a, a * S // CP, S)
    r = project(sc)  # the all-to-alls exposed, the ring's steps behind attention
    assert 0 < r.breakdown_s["comm.cp"] < r.comm_total_s["cp"]
    assert not [n for n in r.notes if n.startswith("context parallelism")]


def test_a_degenerate_hierarchy_is_the_plain_exchange(tmp_path: Path) -> None:
    """TE runs a2a+p2p with an all-to-all group of 1 as the ring, with a ring of 1 as the all-to-all."""
    for sizes, plain in (((1, CP), "p2p"), ((CP, 1), "a2a")):
        path = tmp_path / "deg.txt"
        path.write_text(f"{ARGS} --num-query-groups {CP} --cp-comm-type a2a+p2p --hierarchical-context-parallel-sizes "
                        f"{sizes[0]} {sizes[1]}\n", encoding="utf-8")
        sc = api.load(path, hardware="h100-sxm", nodes=1, gpus_per_node=CP, fmt="megatron")
        path.write_text(f"{ARGS} --num-query-groups {CP} --cp-comm-type {plain}\n", encoding="utf-8")
        ref = api.load(path, hardware="h100-sxm", nodes=1, gpus_per_node=CP, fmt="megatron")
        assert layer_ops(sc.model, sc.training, sc.plan, 0) == layer_ops(ref.model, ref.training, ref.plan, 0)


def test_a_per_layer_list_prices_each_layers_exchange(tmp_path: Path) -> None:
    """A per-layer exchange list (a native scenario's plan.cp_comm, one type per decoder layer, 0-based) prices each
    layer's own exchange, in the ops and in the stage pricing (not the first layer's for all). Megatron-Core cannot
    run one: it indexes the list by the 1-based layer number, past the end at the last layer
    (test_what_transformer_engine_refuses_under_context_parallelism)."""
    base = load(tmp_path, "p2p")
    sc = base.model_copy(update={"plan": base.plan.model_copy(update={"cp_comm": "a2a p2p all_gather a2a"})})
    kinds = [{o.name for o in layer_ops(sc.model, sc.training, sc.plan, i) if o.group == "cp"} for i in range(4)]
    for i, comm in enumerate(("a2a", "p2p", "all_gather", "a2a")):
        assert kinds[i] == set(colls(load(tmp_path, comm))), i
    mixed = project(sc)
    # the step's cp traffic is a quarter of each uniform job's per layer
    total = {c: project(load(tmp_path, c)).comm_total_s["cp"] for c in ("a2a", "p2p", "all_gather")}
    assert mixed.comm_total_s["cp"] == pytest.approx((2 * total["a2a"] + total["p2p"] + total["all_gather"]) / 4,
                                                     rel=1e-9)


def refused(tmp_path: Path, extra: str, nodes_gpus: tuple[int, int] = (1, CP)) -> str:
    from projection.errors import ProjectionError

    path = tmp_path / "refused.txt"
    path.write_text(f"{ARGS} {extra}\n", encoding="utf-8")
    with pytest.raises(ProjectionError) as e:
        api.load(path, hardware="h100-sxm", nodes=nodes_gpus[0], gpus_per_node=nodes_gpus[1], fmt="megatron")
    return "\n".join(p.render() for p in e.value.problems)


def test_what_transformer_engine_refuses_under_context_parallelism(tmp_path: Path) -> None:
    """Ulysses needs the heads and KV heads of a TP rank divisible by cp (TE asserts it); an unknown exchange, a
    per-layer list of the wrong length, a sliding window on the ring, and attention TE does not run are refused."""
    assert "8 KV heads, and each cp rank needs whole ones of both (Transformer Engine asserts" in refused(
        tmp_path, "--cp-comm-type a2a --context-parallel-size 16", (2, 8))
    assert "unknown context-parallel exchange ring" in refused(tmp_path, "--cp-comm-type ring")
    assert "2 context-parallel exchange types for 4 layers" in refused(tmp_path, "--cp-comm-type a2a p2p")
    assert "3 context-parallel exchange types for 4 layers" in refused(tmp_path, "--cp-comm-type p2p p2p p2p")
    assert "the last layer's entry is out of range" in refused(tmp_path, "--cp-comm-type a2a p2p a2a p2p")
    # a2a+p2p: Megatron wants the sizes, their product cp; TE two levels, and heads the all-to-all group divides
    assert "needs the hierarchical context-parallel sizes" in refused(tmp_path, "--cp-comm-type a2a+p2p")
    assert "multiply to 8, not cp = 4" in refused(
        tmp_path, "--cp-comm-type a2a+p2p --hierarchical-context-parallel-sizes 2 4")
    assert "multiply to 8, not cp = 4" in refused(tmp_path, "--hierarchical-context-parallel-sizes 2 4")
    assert "runs two levels" in refused(tmp_path, "--cp-comm-type a2a+p2p --hierarchical-context-parallel-sizes 2 2 1")
    assert "splits heads over its group of 4: a tensor-parallel rank holds 8 heads and 2 KV heads" in refused(
        tmp_path, "--cp-comm-type a2a+p2p --hierarchical-context-parallel-sizes 4 1 --tensor-model-parallel-size 4",
        (2, 8))
    assert "sliding window with the p2p" in refused(
        tmp_path, "--cp-comm-type a2a+p2p --hierarchical-context-parallel-sizes 2 2 --window-size 4096,0")
    assert "sliding window with the p2p" in refused(tmp_path, "--cp-comm-type p2p --window-size 4096,0")
    assert "needs Transformer Engine's fused or flash attention" in refused(tmp_path, "--transformer-impl local")
    path = tmp_path / "ok.txt"  # a sliding window under all_gather runs
    path.write_text(f"{ARGS} --cp-comm-type all_gather --window-size 4096,0\n", encoding="utf-8")
    # --window-size 4096 0: the 4096 keys before a query and itself (TransformerConfig.window_size)
    assert api.load(path, hardware="h100-sxm", nodes=1, gpus_per_node=CP, fmt="megatron").model.sliding_window == 4097
    assert "only a causal window" in refused(tmp_path, "--cp-comm-type a2a --window-size 4096 16")
    assert "full-attention layers among sliding-window ones" in refused(
        tmp_path, "--cp-comm-type a2a --window-size 4096 0 --window-attn-skip-freq 4")


def test_deepep_with_padded_experts_is_refused_and_hybridep_padded_reads_no_counts(tmp_path: Path) -> None:
    from projection.errors import ProjectionError
    from projection.perf import checks

    moe = ("--num-layers 2 --hidden-size 512 --num-attention-heads 8 --seq-length 1024 --max-position-embeddings 1024 "
           "--micro-batch-size 1 --global-batch-size 8 --vocab-size 32000 --bf16 --num-experts 8 --moe-router-topk 2 "
           "--expert-model-parallel-size 2 --moe-token-dispatcher-type flex --moe-expert-capacity-factor 1.0 "
           "--moe-pad-expert-input-to-capacity")
    path = tmp_path / "moe.txt"
    path.write_text(moe + "\n", encoding="utf-8")
    with pytest.raises(ProjectionError) as e:
        api.load(path, hardware="h100-sxm", nodes=1, gpus_per_node=2, fmt="megatron")
    assert "DeepEP backend with experts padded" in e.value.problems[0].render()
    path.write_text(moe + " --moe-flex-dispatcher-backend hybridep\n", encoding="utf-8")
    sc = api.load(path, hardware="h100-sxm", nodes=1, gpus_per_node=2, fmt="megatron")
    assert sc.training.kernels.moe_flex_backend == "hybridep" and checks.token_count_syncs(sc) == frozenset()


def test_window_size_spellings_and_exchange_names_outside_cp(tmp_path: Path) -> None:
    """Megatron's --window-size is one tuple argument ("4096,0" or "(4096,0)"); TE's (-1, 0) is no window. An
    exchange name or per-layer list is read only under context parallelism (at cp 1 nothing uses it)."""
    for spelling, window in (("(4096,0)", 4097), ("4096,0", 4097), ("-1,0", None)):
        path = tmp_path / "w.txt"
        path.write_text(f"{ARGS} --cp-comm-type a2a --window-size {spelling}\n", encoding="utf-8")
        sc = api.load(path, hardware="h100-sxm", nodes=1, gpus_per_node=CP, fmt="megatron")
        assert sc.model.sliding_window == window, spelling
    cp1 = ARGS.replace(f"--context-parallel-size {CP}", "--context-parallel-size 1")
    path = tmp_path / "cp1.txt"
    path.write_text(f"{cp1} --cp-comm-type allgather p2p\n", encoding="utf-8")
    assert api.load(path, hardware="h100-sxm", nodes=1, gpus_per_node=1, fmt="megatron").plan.cp == 1


def test_other_flex_backends_load_and_read_their_counts(tmp_path: Path) -> None:
    from projection.perf import checks

    moe = ("--num-layers 2 --hidden-size 512 --num-attention-heads 8 --seq-length 1024 --max-position-embeddings 1024 "
           "--micro-batch-size 1 --global-batch-size 8 --vocab-size 32000 --bf16 --num-experts 8 --moe-router-topk 2 "
           "--expert-model-parallel-size 2 --moe-token-dispatcher-type flex --moe-flex-dispatcher-backend ncclep\n")
    path = tmp_path / "moe.txt"
    path.write_text(moe, encoding="utf-8")
    sc = api.load(path, hardware="h100-sxm", nodes=1, gpus_per_node=2, fmt="megatron")
    assert sc.training.kernels.moe_flex_backend == "ncclep" and checks.token_count_syncs(sc) == {"moe.router.topk"}


def test_a_native_scenario_naming_a2a_p2p_gets_tes_rules() -> None:
    """TE's hierarchical exchange has its rules whoever names it: without two sizes whose product is cp a native
    scenario is refused (it used to reach pricing without the groups' placements)."""
    from projection.errors import ProjectionError

    native = Path(__file__).resolve().parents[2] / "examples" / "llama3_8b_inline.yaml"
    for extra, text in (({}, "needs the hierarchical context-parallel sizes"),
                        ({"plan.cp_hierarchy": [4, 1]}, "multiply to 4, not cp = 2")):
        with pytest.raises(ProjectionError) as e:
            api.load(native, hardware="h100-sxm", overrides={"plan.cp": 2, "plan.cp_comm": "a2a+p2p", **extra})
        assert text in e.value.problems[0].message
    sc = api.load(native, hardware="h100-sxm", overrides={"plan.cp": 2, "plan.cp_comm": "a2a+p2p",
                                                          "plan.cp_hierarchy": [1, 2]})
    assert project(sc).step_time_s > 0


def test_a_native_scenario_naming_ulysses_needs_whole_heads_per_cp_rank() -> None:
    """The Ulysses all-to-all gives each cp rank whole heads: a native scenario with 8 KV heads at cp 16 was priced
    (fuzz audit); it is refused like Megatron's, at plan.cp_comm. cp 8 divides both and runs."""
    from projection.errors import ProjectionError

    native = Path(__file__).resolve().parents[2] / "examples" / "llama3_8b_inline.yaml"
    over = {"plan.cp_comm": "a2a", "plan.tp": 1, "plan.pp": 1}
    with pytest.raises(ProjectionError) as e:
        api.load(native, hardware="h100-sxm", nodes=2, overrides={**over, "plan.cp": 16})
    (problem,) = e.value.problems
    assert problem.key == "plan.cp_comm" and "holds 32 heads and 8 KV heads" in problem.message, problem
    assert project(api.load(native, hardware="h100-sxm", nodes=1, overrides={**over, "plan.cp": 8})).step_time_s > 0


def test_plan_keeps_the_all_to_all_group_on_another_cp(tmp_path: Path) -> None:
    """`plan --cp` on an a2a+p2p file: each cp keeps the file's all-to-all group and rings over the rest, as the
    same file loaded with those sizes gives."""
    from projection.perf.search import search_layouts

    path = tmp_path / "hier.txt"
    path.write_text(f"{ARGS} --cp-comm-type a2a+p2p --hierarchical-context-parallel-sizes 2 2\n", encoding="utf-8")
    sc = api.load(path, hardware="h100-sxm", nodes=1, gpus_per_node=8, fmt="megatron")
    found = {c.cp: c for c in search_layouts(sc, cp=[2, 4, 8])}
    for cp in (2, 4, 8):
        c = found[cp]
        assert c.status == "fits" and c.scenario is not None, [p.render() for p in c.problems]
        assert c.scenario.plan.cp_hierarchy == (2, cp // 2)
        ref = api.load(path, hardware="h100-sxm", nodes=1, gpus_per_node=8, fmt="megatron",
                       overrides={"context_parallel_size": cp, "hierarchical_context_parallel_sizes": f"2 {cp // 2}"})
        assert c.projection is not None
        assert c.projection.step_time_s == pytest.approx(project(ref).step_time_s, rel=1e-12)
