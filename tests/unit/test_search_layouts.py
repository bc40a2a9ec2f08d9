"""`search_layouts` / `projection plan` (projection/perf/search.py, cli_plan.py) against a second path to the same
numbers: each layout loaded from the config with its --set overrides (the loader's own checks) and projected."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from projection import api
from projection.cli import main
from projection.errors import ConfigError, PlanError
from projection.perf import default_cost_model, project
from projection.perf.search import search_layouts

L70 = Path(__file__).resolve().parents[2] / "examples" / "llama3.1_70B-mi300x.yaml"  # tp 8 pp 4 vpp 5, 32 GPUs


@pytest.fixture(scope="module")
def found() -> list:
    return search_layouts(api.load(L70), tp=[2, 4, 8], pp=[1, 2, 4], vpp=[1, 5])


def test_each_fitting_layout_is_what_the_loader_and_projection_give(found: list) -> None:
    fits = [c for c in found if c.status == "fits"]
    assert len(fits) >= 4
    for c in fits:
        over = {"plan.tp": c.tp, "plan.pp": c.pp, "plan.vpp": c.vpp if c.vpp > 1 else None,
                "plan.schedule": c.scenario.plan.schedule}
        sc = api.load(L70, overrides=over)
        p = project(sc, default_cost_model(sc))
        assert c.projection.step_time_s == pytest.approx(p.step_time_s, rel=1e-12), over
        assert c.memory.peak_bytes == api.estimate_memory(sc).peak_bytes, over
    steps = [c.projection.step_time_s for c in fits]
    assert steps == sorted(steps)


def test_out_of_memory_layouts_are_not_projected_and_refused_ones_say_why(found: list) -> None:
    statuses = [c.status for c in found]  # projected ones (fits or at risk) fastest first, as projection plan ranks
    rank = {"fits": 0, "at risk": 0, "out of memory": 1, "refused": 2}
    assert statuses == sorted(statuses, key=rank.__getitem__)
    for c in found:
        if c.status == "out of memory":
            assert c.projection is None and c.memory.verdict == "out of memory"
            assert api.estimate_memory(api.load(L70, overrides={"plan.tp": c.tp, "plan.pp": c.pp, "plan.vpp": (
                c.vpp if c.vpp > 1 else None), "plan.schedule": c.scenario.plan.schedule})).verdict == "out of memory"
    # beside pipelines, pp 1 is searched at vpp 1 only (a virtual pipeline needs one): one pp-1 row per tp
    assert sorted((c.tp, c.vpp) for c in found if c.pp == 1) == [(2, 1), (4, 1), (8, 1)]
    (pp1_vpp5,) = search_layouts(api.load(L70), tp=[8], pp=[1], vpp=[5])  # asked alone, it is refused, saying why
    with pytest.raises(PlanError) as err:  # the loader refuses the same layout for the same reason
        api.load(L70, overrides={"plan.tp": 8, "plan.pp": 1, "plan.vpp": 5})
    assert pp1_vpp5.status == "refused"
    assert {p.message for p in pp1_vpp5.problems} <= {p.message for p in err.value.problems}


def test_a_layout_the_world_does_not_divide_lists_every_reason_as_the_loader_does() -> None:
    """tp 3 pp 3 on 32 GPUs: the loader lists six problems at once; the refused row used to show only the first."""
    (row,) = search_layouts(api.load(L70), tp=[3], pp=[3])
    assert row.status == "refused"
    with pytest.raises(PlanError) as err:
        api.load(L70, overrides={"plan.tp": 3, "plan.pp": 3})
    assert {p.message for p in row.problems} == {p.message for p in err.value.problems}
    assert len(row.problems) >= 5


def test_values_must_be_positive_whole_numbers() -> None:
    with pytest.raises(ConfigError, match="tp values must be positive whole numbers"):
        search_layouts(api.load(L70), tp=[0, 2])


def test_plan_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--config", str(L70), "--tp", "4,8", "--pp", "2,4", "--vpp", "5", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    rows = {(r["tp"], r["pp"]): r for r in doc["candidates"]}
    assert rows[(8, 4)]["step_time_s"] == pytest.approx(
        project(api.load(L70), default_cost_model(api.load(L70))).step_time_s, rel=1e-12)
    assert main(["plan", "--config", str(L70), "--tp", "4,8", "--pp", "4", "--vpp", "5"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("layouts of llama3.1_70B on 32 x mi300x, global batch 128: 2 fit")
    assert main(["plan", "--config", str(L70), "--tp", "x", "--top", "0"]) == 2
    err = capsys.readouterr().err
    assert "key '--tp'" in err and "key '--top'" in err and "Traceback" not in err


FIXTURES = Path(__file__).resolve().parents[3] / "shared" / "fixtures"


@pytest.mark.parametrize(("config", "nodes", "axis", "value", "overrides"), [
    ("megatron/mixtral_8x7b_tp1pp4ep8vpp8_release/model_config.yaml", 4, "ep", 4,
     {"expert_model_parallel_size": 4}),
    ("megatron/gpt3_mcore_te_tp2_pp2_resume_torch_dist/model_config.yaml", 1, "pp", 4,
     {"pipeline_model_parallel_size": 4}),
    ("primus/examples/megatron/configs/MI300X/llama3.1_8B-BF16-pretrain.yaml", 1, "tp", 2,
     {"tensor_model_parallel_size": 2}),
])
def test_other_formats_match_their_loader(config: str, nodes: int, axis: str, value: int,
                                          overrides: dict) -> None:
    path = FIXTURES / config
    if not path.is_file():
        pytest.skip(f"{path} is absent (the shared fixtures are not in a user's clone)")
    (c,) = search_layouts(api.load(path, nodes=nodes), **{axis: [value]})
    sc = api.load(path, nodes=nodes, overrides=overrides)
    assert c.status == "fits"
    assert c.projection.step_time_s == pytest.approx(project(sc, default_cost_model(sc)).step_time_s, rel=1e-12)
    assert c.memory.peak_bytes == api.estimate_memory(sc).peak_bytes


def test_layouts_whose_framework_rules_it_does_not_re_derive_are_refused_without_a_reload(tmp_path: Path) -> None:
    """TorchTitan derives SP, async TP, expert TP, its layer split, pipeline microbatch, resharding and DDP from tp,
    pp and ep; Primus's pipeline patches choose the schedule from pp: without a way to load the file again, refused
    rather than projected wrongly."""
    toml = tmp_path / "job.toml"
    toml.write_text('[model]\nname = "llama3"\nflavor = "8B"\n[parallelism]\ndata_parallel_shard_degree = -1\n')
    with pytest.raises(ConfigError, match="does not re-derive TorchTitan's layout rules"):
        search_layouts(api.load(toml), tp=[1, 2])
    primus = FIXTURES / "primus/examples/megatron/configs/MI300X/llama3.1_8B-BF16-pretrain.yaml"
    if primus.is_file():
        with pytest.raises(ConfigError, match="keeps a Primus experiment's pipeline") as err:
            search_layouts(api.load(primus), vpp=[2])
        assert err.value.problems[0].key == "--vpp"


TITAN_8B = FIXTURES / "torchtitan" / "llama3_8b.toml"  # tp 1, dp_shard -1, local batch 1, selective AC


def test_torchtitan_layouts_are_the_file_loaded_with_its_own_keys(capsys: pytest.CaptureFixture[str]) -> None:
    """With a reload, each TorchTitan layout is the TOML loaded with TorchTitan's keys, so its rules follow the
    layout: TP turns on sequence parallelism (TorchTitan always shards the sequence) and the DTensor style, FSDP
    covers the data-parallel ranks left over, and tp 8 on 8 GPUs leaves dp_shard 1: no FSDP, fp32 training. The
    command's rows equal `projection performance --set ...` of the same keys."""
    if not TITAN_8B.is_file():
        pytest.skip(f"{TITAN_8B} is absent (the shared fixtures are not in a user's clone)")

    def reload(over: dict) -> object:
        return api.load(TITAN_8B, overrides=over)

    found = {(c.tp, c.recompute): c for c in search_layouts(api.load(TITAN_8B), tp=[1, 2, 8],
                                                           recompute=["selective", "full"], reload=reload)}
    tp2 = found[(2, "full")].scenario.plan
    assert (tp2.sp, tp2.tp_style, tp2.sharding.zero_stage, tp2.dp_()) == (True, "dtensor", 3, 4)
    assert tp2.recompute.granularity == "full"
    assert found[(8, "selective")].projection.peak_dtype == "fp32"  # dp_shard 1: no FSDP mixed precision
    assert found[(1, "selective")].projection.peak_dtype == "bf16"
    for (tp, rc), c in found.items():
        assert c.status == "fits", (tp, rc)
        args = ["performance", "--config", str(TITAN_8B), "--format", "json",
                "--set", f"parallelism.tensor_parallel_degree={tp}", "--set", "training.global_batch_size=8",
                "--set", f"activation_checkpoint.mode={rc}"]
        assert main(args) == 0
        doc = json.loads(capsys.readouterr().out)
        assert c.projection.step_time_s == pytest.approx(doc["step_time_s"], rel=1e-12), (tp, rc)
    # with a pipeline, each DP rank's local batch is its share of the global 8 (the file's 1 would give one
    # pipeline microbatch, fewer than pp): tp 1 pp 2 is dp 4 with local batch 2, tp 2 pp 2 dp 2 with 4
    assert main(["plan", "--config", str(TITAN_8B), "--tp", "1,2", "--pp", "2", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)["candidates"]
    assert {r["status"] for r in rows} == {"fits"}
    for r in rows:
        assert main(["performance", "--config", str(TITAN_8B), "--format", "json",
                     "--set", f"parallelism.tensor_parallel_degree={r['tp']}",
                     "--set", "parallelism.pipeline_parallel_degree=2", "--set", "training.global_batch_size=8",
                     "--set", f"training.local_batch_size={8 // r['dp']}"]) == 0
        assert r["step_time_s"] == pytest.approx(json.loads(capsys.readouterr().out)["step_time_s"], rel=1e-12)


def test_primus_pipeline_layouts_follow_primus_rules() -> None:
    """A Primus experiment's pipeline is searched by loading it with Megatron's keys: pp 2 with 2 virtual stages
    per rank is what the loader makes of pipeline_model_parallel_size=2 and num_virtual_stages_per_pipeline_rank=2."""
    path = FIXTURES / "primus/examples/megatron/configs/MI300X/llama3.1_8B-BF16-pretrain.yaml"
    if not path.is_file():
        pytest.skip(f"{path} is absent (the shared fixtures are not in a user's clone)")
    base = api.load(path)
    found = search_layouts(base, pp=[2], vpp=[1, 2], reload=lambda over: api.load(path, overrides=over))
    for c in found:
        flags = {"pipeline_model_parallel_size": 2,
                 **({"num_virtual_stages_per_pipeline_rank": c.vpp} if c.vpp > 1 else {})}
        sc = api.load(path, overrides=flags)
        assert c.status == "fits" and c.scenario.plan == sc.plan
        assert c.projection.step_time_s == pytest.approx(project(sc, default_cost_model(sc)).step_time_s, rel=1e-12)
        assert c.memory.peak_bytes == api.estimate_memory(sc).peak_bytes
    assert sorted(c.scenario.plan.schedule for c in found) == ["1f1b", "interleaved_1f1b"]


def test_a_layout_whose_schedule_does_not_fit_is_refused_not_run_as_gpipe() -> None:
    """Megatron has no GPipe schedule: interleaved 1F1B at 70B's pp 4 vpp 5 with micro batch 64 (2 microbatches per
    rank, fewer than pp) is refused with the schedule's reason, as the loader refuses it."""
    (c,) = search_layouts(api.load(L70), micro_batch_size=[64])
    assert c.status == "refused" and "microbatch group size" in c.problems[0].message
    with pytest.raises(PlanError, match="microbatch group size"):
        api.load(L70, overrides={"training.micro_batch_size": 64})


def test_recompute_axis_is_what_the_loader_gives_for_the_same_keys() -> None:
    """The 70B example is selective (core_attn): 'none' and 'full' equal the file loaded with the keys a user would
    set (full: every layer, method uniform, num_layers 1); 'selective' keeps the file's own modules. Full recompute
    lowers the peak and raises the step, as it must."""
    found = {c.recompute: c for c in search_layouts(api.load(L70), recompute=["none", "selective", "full"])}
    keys = {"none": {"plan.recompute.granularity": "none", "plan.recompute.modules": []},
            "selective": {},
            "full": {"plan.recompute.granularity": "full", "plan.recompute.method": "uniform",
                     "plan.recompute.num_layers": 1, "plan.recompute.modules": []}}
    for name, over in keys.items():
        c, sc = found[name], api.load(L70, overrides=over)
        assert c.status == "fits", name
        assert c.scenario.plan.recompute == sc.plan.recompute, name
        assert c.projection.step_time_s == pytest.approx(project(sc, default_cost_model(sc)).step_time_s, rel=1e-12)
        assert c.memory.peak_bytes == api.estimate_memory(sc).peak_bytes, name
    assert found["full"].memory.peak_bytes < found["selective"].memory.peak_bytes
    assert found["full"].projection.step_time_s > found["none"].projection.step_time_s
    assert found["none"].projection.hardware_flops_per_step < found["full"].projection.hardware_flops_per_step


def test_recompute_axis_on_a_megatron_file_matches_its_command_line_flags() -> None:
    path = FIXTURES / "megatron/gpt3_mcore_te_tp2_pp2_resume_torch_dist/model_config.yaml"
    if not path.is_file():
        pytest.skip(f"{path} is absent (the shared fixtures are not in a user's clone)")
    base = api.load(path)
    assert base.plan.recompute.granularity == "none"
    for name, flags in (("selective", {"recompute_granularity": "selective"}),
                        ("full", {"recompute_granularity": "full", "recompute_method": "uniform",
                                  "recompute_num_layers": 1})):
        (c,) = search_layouts(base, recompute=[name])
        sc = api.load(path, overrides=flags)
        assert c.scenario.plan.recompute == sc.plan.recompute, name
        assert c.projection.step_time_s == pytest.approx(project(sc, default_cost_model(sc)).step_time_s, rel=1e-12)
        assert c.memory.peak_bytes == api.estimate_memory(sc).peak_bytes, name


def test_recompute_values_are_checked(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ConfigError, match="recompute values must be among none, selective, full"):
        search_layouts(api.load(L70), recompute=["partial"])
    assert main(["plan", "--config", str(L70), "--recompute", "none,fulll", "--tp", "0"]) == 2
    err = capsys.readouterr().err
    assert "key '--recompute'" in err and "'fulll'" in err and "key '--tp'" in err and "Traceback" not in err
    assert main(["plan", "--config", str(L70), "--recompute", "none,full", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)["candidates"]
    assert sorted(r["recompute"] for r in rows) == ["full", "none"]


def test_torchtitan_axes_it_cannot_set_are_refused_with_the_way_to_set_them() -> None:
    if not TITAN_8B.is_file():
        pytest.skip(f"{TITAN_8B} is absent (the shared fixtures are not in a user's clone)")
    (vpp2,) = search_layouts(api.load(TITAN_8B), vpp=[2], reload=lambda over: api.load(TITAN_8B, overrides=over))
    assert vpp2.status == "refused" and "pipeline_parallel_layers_per_stage" in vpp2.problems[0].fix
    (ep2,) = search_layouts(api.load(TITAN_8B), ep=[2], reload=lambda over: api.load(TITAN_8B, overrides=over))
    assert ep2.status == "refused" and "dense model" in ep2.problems[0].message


PRIMUS = FIXTURES / "primus/examples/megatron/configs/MI300X"


def test_a_set_key_that_holds_a_searched_axis_refuses_the_layout_rather_than_mislabel_it(
        capsys: pytest.CaptureFixture[str]) -> None:
    """`--set plan.tp=2` on a Primus experiment is applied after the search's tensor_model_parallel_size: the rows
    for tp 1 and tp 4 would be tp 2 under another label, so they are refused, saying which --set holds the axis."""
    path = PRIMUS / "llama3.1_8B-BF16-pretrain.yaml"
    if not path.is_file():
        pytest.skip(f"{path} is absent (the shared fixtures are not in a user's clone)")
    assert main(["plan", "--config", str(path), "--set", "plan.tp=2", "--tp", "1,2,4", "--format", "json"]) == 0
    rows = {r["tp"]: r for r in json.loads(capsys.readouterr().out)["candidates"]}
    assert rows[2]["status"] == "fits" and rows[2]["dp"] == 4
    for tp in (1, 4):
        assert rows[tp]["status"] == "refused" and "a --set override" in rows[tp]["problems"][0]


def test_primus_recompute_none_clears_moe_layer_recompute() -> None:
    path = PRIMUS / "mixtral_8x7B_v0.1-BF16-pretrain.yaml"
    if not path.is_file():
        pytest.skip(f"{path} is absent (the shared fixtures are not in a user's clone)")
    base = api.load(path, nodes=2, overrides={"moe_layer_recompute": True})
    assert base.plan.recompute.granularity == "selective"
    (none,) = search_layouts(base, recompute=["none"], reload=lambda over: api.load(
        path, nodes=2, overrides={"moe_layer_recompute": True, **over}))
    sc = api.load(path, nodes=2, overrides={"moe_layer_recompute": False})
    assert none.scenario.plan.recompute == sc.plan.recompute and sc.plan.recompute.granularity == "none"
    assert none.projection.step_time_s == pytest.approx(project(sc, default_cost_model(sc)).step_time_s, rel=1e-12)


def test_torchtitan_vpp_stands_where_torchtitan_derives_it_and_pipelines_get_their_local_batch() -> None:
    """DeepSeek-V3-16B's schedule (Interleaved1F1B) gives 2 stages per rank at pp 2 and 1 at pp 1: --vpp 1,2 keeps
    exactly those two layouts. Llama-3-70B at tp 2 pp 2 on 64 GPUs (dp 16, global batch 64) needs a local batch of
    4 per DP rank, not the file's 8 (8 x 16 > 64): what `--set training.local_batch_size=4` gives."""
    ds, l70 = FIXTURES / "torchtitan" / "deepseek_v3_16b.toml", FIXTURES / "torchtitan" / "llama3_70b.toml"
    if not (ds.is_file() and l70.is_file()):
        pytest.skip("the shared TorchTitan fixtures are absent (a user's clone)")
    found = search_layouts(api.load(ds, nodes=2), pp=[1, 2], vpp=[1, 2], ep=[8],
                           reload=lambda over: api.load(ds, nodes=2, overrides=over))
    assert sorted((c.pp, c.vpp) for c in found if c.status == "fits") == [(1, 1), (2, 2)]
    assert all("TorchTitan derives" in c.problems[0].message for c in found if c.status == "refused")
    (c,) = search_layouts(api.load(l70, nodes=8), tp=[2], pp=[2],
                          reload=lambda over: api.load(l70, nodes=8, overrides=over))
    sc = api.load(l70, nodes=8, overrides={"parallelism.tensor_parallel_degree": 2,
                                           "parallelism.pipeline_parallel_degree": 2,
                                           "training.local_batch_size": 4, "training.global_batch_size": 64})
    assert c.status == "fits" and c.scenario.plan == sc.plan and c.scenario.training == sc.training
    assert c.projection.step_time_s == pytest.approx(project(sc, default_cost_model(sc)).step_time_s, rel=1e-12)


def test_recompute_lists_are_read_like_the_numeric_ones(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--config", str(L70), "--recompute", "none,,full"]) == 2
    assert "an empty item" in capsys.readouterr().err
    assert main(["plan", "--config", str(L70), "--recompute", "full,full,none", "--tp", "8", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)["candidates"]
    assert [r["recompute"] for r in rows] == ["none", "full"]
    assert rows[1]["recompute_spec"]["granularity"] == "full" and rows[1]["recompute_spec"]["num_layers"] == 1


def test_torchtitan_micro_batch_is_the_local_batch_without_a_pipeline_and_the_pipeline_microbatch_with_one(
        capsys: pytest.CaptureFixture[str]) -> None:
    """--mbs sets training.local_batch_size at pp 1 and parallelism.pipeline_parallel_microbatch_size at pp 2 (with
    the local batch gbs / dp): each row equals `projection performance --set` of those keys."""
    if not TITAN_8B.is_file():
        pytest.skip(f"{TITAN_8B} is absent (the shared fixtures are not in a user's clone)")
    assert main(["plan", "--config", str(TITAN_8B), "--tp", "1,2", "--pp", "1,2", "--mbs", "1,2",
                 "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)["candidates"]
    fits = [r for r in rows if r["status"] == "fits"]
    assert {(r["pp"], r["micro_batch_size"]) for r in fits} >= {(1, 1), (2, 1), (2, 2)}
    for r in fits:
        keys = [f"parallelism.tensor_parallel_degree={r['tp']}", f"parallelism.pipeline_parallel_degree={r['pp']}",
                "training.global_batch_size=8"]
        keys += ([f"training.local_batch_size={r['micro_batch_size']}"] if r["pp"] == 1 else
                 [f"parallelism.pipeline_parallel_microbatch_size={r['micro_batch_size']}",
                  f"training.local_batch_size={8 // r['dp']}"])
        assert main(["performance", "--config", str(TITAN_8B), "--format", "json",
                     *[a for k in keys for a in ("--set", k)]]) == 0
        assert r["step_time_s"] == pytest.approx(json.loads(capsys.readouterr().out)["step_time_s"], rel=1e-12), r


def test_a_pipelined_torchtitan_file_on_another_dp_gets_the_local_batch_of_that_dp() -> None:
    """A TOML already at pp 2 (dp 4 on 8 GPUs, local batch 2 of global 8), searched at tp 2 (dp 2): the local batch
    becomes 4, what TorchTitan needs to hold the global batch with that many DP ranks."""
    if not TITAN_8B.is_file():
        pytest.skip(f"{TITAN_8B} is absent (the shared fixtures are not in a user's clone)")
    own = {"parallelism.pipeline_parallel_degree": 2, "training.local_batch_size": 2}
    base = api.load(TITAN_8B, overrides=own)
    (c,) = search_layouts(base, tp=[2], reload=lambda over: api.load(TITAN_8B, overrides={**own, **over}))
    assert c.status == "fits" and c.scenario.plan.dp_() == 2 and c.scenario.training.local_batch_size == 4


def test_a_primus_stage_split_fixed_for_its_own_pipeline_is_dropped_for_another() -> None:
    path = PRIMUS / "llama3.1_8B-BF16-pretrain.yaml"
    if not path.is_file():
        pytest.skip(f"{path} is absent (the shared fixtures are not in a user's clone)")
    own = {"pipeline_model_parallel_size": 2, "decoder_first_pipeline_num_layers": 12}
    base = api.load(path, overrides=own)
    assert base.plan.first_stage_layers == 12
    (c,) = search_layouts(base, pp=[4], reload=lambda over: api.load(path, overrides={**own, **over}))
    assert c.status == "fits" and c.scenario.plan.first_stage_layers is None
    sc = api.load(path, overrides={"pipeline_model_parallel_size": 4})
    assert c.projection.step_time_s == pytest.approx(project(sc, default_cost_model(sc)).step_time_s, rel=1e-12)


def test_torchtitan_without_a_pipeline_names_the_micro_batch_to_search() -> None:
    """Llama-3-70B TOML (local batch 8) at tp 4 on 64 GPUs is dp 16: 8 x 16 does not divide the global batch 64, and
    without a pipeline the local batch is the micro batch, which the search keeps unless --mbs is searched."""
    l70 = FIXTURES / "torchtitan" / "llama3_70b.toml"
    if not l70.is_file():
        pytest.skip(f"{l70} is absent (the shared fixtures are not in a user's clone)")
    base = api.load(l70, nodes=8)

    def reload(over: dict) -> object:
        return api.load(l70, nodes=8, overrides=over)

    (c,) = search_layouts(base, tp=[4], reload=reload)
    assert c.status == "refused" and c.problems[0].key == "--mbs" and "divisor of 4" in c.problems[0].fix
    (c,) = search_layouts(base, tp=[4], micro_batch_size=[4], reload=reload)
    sc = api.load(l70, nodes=8, overrides={"parallelism.tensor_parallel_degree": 4, "training.local_batch_size": 4,
                                           "training.global_batch_size": 64})
    assert c.status == "fits"
    assert c.projection.step_time_s == pytest.approx(project(sc, default_cost_model(sc)).step_time_s, rel=1e-12)


def test_a_layout_at_risk_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    """70B at tp 2 pp 4 vpp 5 without recompute: 173 GiB allocated, 183 GiB reserved of the MI300X's 192 GiB (above
    the 5 % headroom): projected, and marked as `projection memory` marks it."""
    assert main(["plan", "--config", str(L70), "--tp", "2", "--recompute", "none", "--format", "json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)["candidates"]
    mem = api.estimate_memory(api.load(L70, overrides={"plan.tp": 2, "plan.recompute.granularity": "none",
                                                       "plan.recompute.modules": []}))
    assert row["status"] == row["memory_verdict"] == mem.verdict == "at risk"
    assert row["reserved_gib"] == pytest.approx(mem.reserved_bytes / 2**30, rel=1e-12)
    assert main(["plan", "--config", str(L70), "--tp", "2", "--recompute", "none"]) == 0
    assert capsys.readouterr().out.rstrip().endswith("at risk")


def test_zero_axis_is_what_the_loader_gives_for_the_same_keys() -> None:
    """ZeRO stages on the 70B example (tp 4 here, dp 2, so every stage shards something): each equals the file loaded
    with the sharding a user would set (stage 0 also turns the parameter-gather overlap off, which Megatron refuses
    without sharded state); the peak falls as the stage rises, and stage 3 is PyTorch FSDP2."""
    found = {c.zero: c for c in search_layouts(api.load(L70), tp=[4], zero=[0, 1, 2, 3])}
    keys = {0: {"plan.sharding.zero_stage": 0, "plan.overlap.param_gather": False},
            1: {"plan.sharding.zero_stage": 1}, 2: {"plan.sharding.zero_stage": 2},
            3: {"plan.sharding.zero_stage": 3, "plan.sharding.fsdp": "torch_fsdp2"}}
    peaks = []
    for z, over in keys.items():
        c, sc = found[z], api.load(L70, overrides={"plan.tp": 4, **over})
        assert c.scenario.plan.sharding == sc.plan.sharding, z
        assert c.memory.peak_bytes == api.estimate_memory(sc).peak_bytes, z
        if c.status == "fits":
            assert c.projection.step_time_s == pytest.approx(project(sc, default_cost_model(sc)).step_time_s,
                                                             rel=1e-12), z
        peaks.append(c.memory.peak_bytes)
    assert peaks[0] > peaks[1] > peaks[2] > peaks[3]
    with pytest.raises(ConfigError, match="zero values must be among 0, 1, 2, 3"):
        search_layouts(api.load(L70), zero=[4])


def test_zero_axis_on_primus_and_torchtitan_uses_their_own_keys() -> None:
    """Primus: use_distributed_optimizer / Megatron-FSDP's optim_grads / use_torch_fsdp2; TorchTitan: FSDP over every
    data-parallel rank or DDP (data_parallel_replicate_degree); the stages a framework has no way to run are refused
    with the reason."""
    primus = FIXTURES / "primus/examples/megatron/configs/MI300X/llama3.1_8B-BF16-pretrain.yaml"
    if not primus.is_file():
        pytest.skip(f"{primus} is absent (the shared fixtures are not in a user's clone)")
    base = api.load(primus)
    found = {c.zero: c for c in search_layouts(base, zero=[0, 1, 2, 3],
                                               reload=lambda over: api.load(primus, overrides=over))}
    for z, flags in ((0, {"use_distributed_optimizer": False, "overlap_param_gather": False}),
                     (2, {"use_megatron_fsdp": True, "data_parallel_sharding_strategy": "optim_grads"}),
                     (3, {"use_distributed_optimizer": False, "use_torch_fsdp2": True})):
        sc = api.load(primus, overrides=flags)
        assert found[z].scenario.plan.sharding == sc.plan.sharding and sc.plan.sharding.zero_stage == z
        assert found[z].memory.peak_bytes == api.estimate_memory(sc).peak_bytes
    titan = FIXTURES / "torchtitan/llama3_8b.toml"
    tbase = api.load(titan, hardware="mi300x")
    tfound = {c.zero: c for c in search_layouts(tbase, zero=[0, 1, 3], reload=lambda over: api.load(
        titan, hardware="mi300x", overrides=over))}
    ddp = api.load(titan, hardware="mi300x", overrides={"parallelism.data_parallel_replicate_degree": 8,
                                                         "parallelism.data_parallel_shard_degree": 1})
    assert tfound[0].scenario.plan.sharding == ddp.plan.sharding and ddp.plan.sharding.zero_stage == 0
    assert tfound[0].memory.peak_bytes == api.estimate_memory(ddp).peak_bytes
    assert tfound[3].scenario.plan.sharding == tbase.plan.sharding
    assert tfound[1].status == "refused" and "TorchTitan" in tfound[1].problems[0].message


def test_zero_values_on_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--config", str(L70), "--zero", "0,4"]) == 2
    err = capsys.readouterr().err
    assert "key '--zero'" in err and "stages are 0, 1, 2 and 3" in err and "Traceback" not in err
    assert main(["plan", "--config", str(L70), "--zero", "one"]) == 2
    assert "not a non-negative whole number" in capsys.readouterr().err
    assert main(["plan", "--config", str(L70), "--tp", "4", "--zero", "1,3", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)["candidates"]
    assert sorted(r["zero"] for r in rows) == [1, 3] and all(r["status"] == "fits" for r in rows)


def test_zero_3_keeps_a_megatron_fsdp_job_on_megatron_fsdp() -> None:
    """A Megatron-FSDP job (optim_grads, stage 2) searched at stage 3 is Megatron-FSDP's optim_grads_params, not PyTorch
    FSDP2 (the README's "the config's implementation")."""
    path = FIXTURES / "megatron/gpt3_7b_tp4_pp1_memory_speed/model_config.yaml"
    if not path.is_file():
        pytest.skip(f"{path} is absent (the shared fixtures are not in a user's clone)")
    base = api.load(path, overrides={"use_megatron_fsdp": True, "data_parallel_sharding_strategy": "optim_grads"})
    (c,) = search_layouts(base, zero=[3])
    sc = api.load(path, overrides={"use_megatron_fsdp": True, "data_parallel_sharding_strategy": "optim_grads_params"})
    assert c.scenario.plan.sharding == sc.plan.sharding and sc.plan.sharding.fsdp == "megatron_fsdp"
    assert c.memory.peak_bytes == api.estimate_memory(sc).peak_bytes
    assert c.projection.step_time_s == pytest.approx(project(sc, default_cost_model(sc)).step_time_s, rel=1e-12)
