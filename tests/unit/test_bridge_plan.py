"""`projection plan` and the layout rules on Megatron-Bridge files (the third audit's leftovers, each failing before
its fix): a logged ConfigContainer searched on another pipeline, the search's vpp axis beside pp 1, problems spelled
as Bridge's fields, and the origin of a field the file writes as null."""

from __future__ import annotations

from pathlib import Path

import pytest

from projection import api
from projection.errors import ProjectionError
from projection.formats.detect import load_raw
from projection.perf import default_cost_model, project
from projection.perf.search import search_layouts
from tests.unit.test_bridge_loader import CLUSTER, RUN, SMALL, write

PP2_VPP2 = {"model.pipeline_model_parallel_size": 2, "model.virtual_pipeline_model_parallel_size": 2}


def _reload(path: Path):  # type: ignore[no-untyped-def]
    return lambda ov: api.load(path, overrides=ov, **CLUSTER)  # type: ignore[arg-type]


def test_a_logged_config_searched_on_another_pipeline_takes_that_pipelines_group_size() -> None:
    """The logged run (pp 1) holds microbatch_group_size_per_vp_stage 1, which Megatron-Core set from its own pp
    (ModelParallelConfig: None -> pp). An interleaved pp 4 row is what the same file gives with the group size
    unset, not a refusal for a group size of 1. (pp 4: at pp 2 interleaving needs overlapped p2p, which the run
    logged off.)"""
    (cand,) = search_layouts(api.load(RUN, **CLUSTER), pp=[4], vpp=[2], reload=_reload(RUN))
    assert cand.status == "fits", [p.render() for p in cand.problems]
    sc = api.load(RUN, overrides={"model.pipeline_model_parallel_size": 4,
                                  "model.virtual_pipeline_model_parallel_size": 2,
                                  "model.microbatch_group_size_per_vp_stage": None}, **CLUSTER)
    assert (sc.plan.pp, sc.plan.vpp_, sc.plan.schedule) == (4, 2, "interleaved_1f1b")
    assert cand.projection is not None
    assert cand.projection.step_time_s == pytest.approx(project(sc, default_cost_model(sc)).step_time_s, rel=1e-12)


def test_beside_pipelines_pp_1_is_searched_without_a_virtual_pipeline() -> None:
    """`--pp 1,4 --vpp 2`: pp 1 (vpp 1) and pp 4 interleaved, no refusals of a virtual pipeline without one; pp 2
    interleaved is refused for the run's own reason (it logged overlap_p2p_comm off, which interleaving at pp 2
    needs on), not for the virtual pipeline."""
    found = search_layouts(api.load(RUN, **CLUSTER), pp=[1, 2, 4], vpp=[2], reload=_reload(RUN))
    assert sorted((c.pp, c.vpp, c.status) for c in found) == [(1, 1, "fits"), (2, 2, "refused"), (4, 2, "fits")]
    (two,) = [c for c in found if c.pp == 2]
    assert [p.key for p in two.problems] == ["model.overlap_p2p_comm"], [p.render() for p in two.problems]


def test_the_layout_rules_name_bridges_fields_not_megatron_lm_flags() -> None:
    """The rules shared with Megatron-LM (formats/megatron.py, specs/validate.py) speak of its flags; on a Bridge
    file each problem names the Bridge field that sets the value."""
    with pytest.raises(ProjectionError) as e:
        api.load(RUN, overrides={"model.virtual_pipeline_model_parallel_size": 2}, **CLUSTER)
    text = "\n".join(p.render() for p in e.value.problems)
    assert "model.pipeline_model_parallel_size" in text and "--pipeline-model-parallel-size" not in text, text
    with pytest.raises(ProjectionError) as e:  # the logged group size 1 kept by hand on pp 2: refused at its line
        api.load(RUN, overrides=PP2_VPP2, **CLUSTER)
    # with the run's logged overlap_p2p_comm: false, which interleaving at pp 2 also needs on (specs/validate_schedule)
    p, p2p = sorted(e.value.problems, key=lambda x: x.key != "model.microbatch_group_size_per_vp_stage")
    assert p2p.key == "model.overlap_p2p_comm" and p2p.line is not None, p2p.render()
    assert p.key == "model.microbatch_group_size_per_vp_stage" and p.line is not None
    assert "model.microbatch_group_size_per_vp_stage" in (p.fix or "") and "--" not in (p.fix or ""), p.render()


def test_a_field_written_as_null_is_the_files_not_a_default(tmp_path: Path) -> None:
    """`q_lora_rank: null` is the file's choice (MLA without query compression): its origin is the file's line."""
    mla = "  multi_latent_attention: true\n  q_lora_rank: null\n  kv_lora_rank: 512\n"
    text = SMALL.replace("  vocab_size: 128256\n", "  vocab_size: 128256\n" + mla)
    # SMALL's num_query_groups beside MLA: every MLA run_config.yaml holds one (TransformerConfig sets it to the
    # head count), which MLA never reads: the same model as without it
    with_groups = api.load(write(tmp_path, text, "groups.yaml"), **CLUSTER)
    text = text.replace("  num_query_groups: 8\n", "")
    path = write(tmp_path, text)
    assert with_groups.model == api.load(path, **CLUSTER).model.model_copy(update={"name": "groups"})
    raw = load_raw(path)
    o = raw.origins["model.mla.q_lora_rank"]
    line = text.splitlines().index("  q_lora_rank: null") + 1
    assert (o.file, o.line, raw.get("model.mla.q_lora_rank")) == (str(path), line, 0)
    # a null beside a value of the same setting elsewhere (tokenizer.vocab_size) does not take its origin
    assert raw.origins["model.num_layers"].file == str(path)
    # a flag written as null is off (the code tests `if config.<flag>:`); a null where Megatron-LM's default is not
    # None is not shown as the file's value
    nulls = text.replace("  num_layers: 32\n", "  num_layers: 32\n  gradient_accumulation_fusion: null\n"
                         "  hidden_dropout: null\n").replace("ddp:\n", "ddp:\n  check_for_nan_in_grad: null\n")
    raw = load_raw(write(tmp_path, nulls, "nulls.yaml"))
    assert raw.get("training.gradient_accumulation_fusion") is False
    assert raw.get("training.check_for_nan_in_loss_and_grad") is False
    assert raw.origins["training.gradient_accumulation_fusion"].line is not None
    assert raw.origins["training.dropout"].file != str(tmp_path / "nulls.yaml")


def test_the_loss_nan_checks_are_the_rerun_state_machines_apart_from_the_grad_buckets(tmp_path: Path) -> None:
    """Bridge's loss function checks isnan and isinf of every microbatch's loss with
    rerun_state_machine.check_for_nan_in_loss (default True), whatever ddp.check_for_nan_in_grad (default False) says
    of the gradient buckets: the loss stage's forward holds the 2 checks' host reads (4 kernel issues) only with it."""
    from projection.perf.pricing import price_stages

    default = api.load(write(tmp_path, SMALL), **CLUSTER)
    assert (default.training.check_for_nan_in_loss, default.training.check_for_nan_in_loss_and_grad) == (True, False)
    off_text = SMALL + "rerun_state_machine:\n  check_for_nan_in_loss: false\n"
    off = api.load(write(tmp_path, off_text, "off.yaml"), **CLUSTER)
    assert off.training.check_for_nan_in_loss is False
    assert api.load(write(tmp_path, SMALL), overrides={"rerun_state_machine.check_for_nan_in_loss": "false"},
                    **CLUSTER).training.check_for_nan_in_loss is False
    cm = default_cost_model(default)
    on_stages, off_stages = price_stages(default, cm).stages, price_stages(off, cm).stages
    assert [a.f.kernels - b.f.kernels for a, b in zip(on_stages, off_stages, strict=True)] == \
        [4 if i == len(on_stages) - 1 else 0 for i in range(len(on_stages))]
    null = api.load(write(tmp_path, SMALL + "rerun_state_machine:\n  check_for_nan_in_loss: null\n", "null.yaml"),
                    **CLUSTER)
    assert null.training.check_for_nan_in_loss is False  # a None the loss function's `if` reads as off
    with pytest.raises(ProjectionError, match="rerun_state_machine.check_for_nan_in_loss"):
        api.load(write(tmp_path, SMALL + "rerun_state_machine:\n  check_for_nan_in_loss: maybe\n", "bad.yaml"),
                 **CLUSTER)


def test_a_group_size_of_the_users_own_is_kept_on_another_pipeline(tmp_path: Path) -> None:
    """A group size that is not the file's own pp was chosen by the user: plan keeps it on every layout (and the
    interleaved schedule's rule checks it), where one equal to the file's pp, Megatron-Core's default, is dropped."""
    text = RUN.read_text(encoding="utf-8")
    text = text.replace("  microbatch_group_size_per_vp_stage: 1\n", "  microbatch_group_size_per_vp_stage: 8\n")
    text = text.replace("  pipeline_model_parallel_size: 1\n", "  pipeline_model_parallel_size: 2\n")
    text = text.replace("  virtual_pipeline_model_parallel_size: null\n", "  virtual_pipeline_model_parallel_size: 2\n")
    text = text.replace("  overlap_p2p_comm: false\n", "  overlap_p2p_comm: true\n")  # interleaving at pp 2 needs it
    path = write(tmp_path, text, "run_config.yaml")
    found = search_layouts(api.load(path, **CLUSTER), pp=[2, 4], vpp=[2, 4], reload=_reload(path))
    assert {(c.pp, c.vpp): c.scenario.plan.microbatch_group_size for c in found if c.scenario is not None} == {
        (2, 2): 8, (2, 4): 8, (4, 2): 8, (4, 4): 8}


def test_pp_1_beside_pipelines_is_loaded_without_the_files_virtual_pipeline() -> None:
    """--pp 1,2 without --vpp on a file with vpp 2: the pp-1 row is pp 1 without a virtual pipeline, loaded as such
    (not the file's vpp, refused as a virtual pipeline without one)."""
    # overlapped p2p: interleaving at pp 2 needs it (the run logged false, for its pp 1)
    path_overrides = PP2_VPP2 | {"model.microbatch_group_size_per_vp_stage": None, "model.overlap_p2p_comm": True}
    base = api.load(RUN, overrides=path_overrides, **CLUSTER)
    found = search_layouts(base, pp=[1, 2], reload=lambda ov: api.load(RUN, overrides={**path_overrides, **ov},
                                                                        **CLUSTER))
    (one,) = [c for c in found if c.pp == 1]
    assert (one.vpp, one.status) == (1, "fits"), [p.render() for p in one.problems]
    assert one.scenario is not None and one.scenario.plan.vpp_ == 1


def test_vocabulary_fixes_name_what_bridge_reads(tmp_path: Path) -> None:
    """A Bridge file without a vocabulary size is told to `--set model.vocab_size=N` (which the loader takes), a
    NullTokenizer to give tokenizer.vocab_size (Bridge builds it from TokenizerConfig.vocab_size), and keys are
    Bridge's."""
    text = SMALL.replace("  vocab_size: 128256\n", "")
    with pytest.raises(ProjectionError) as e:
        api.load(write(tmp_path, text), **CLUSTER)
    (p,) = e.value.problems
    assert p.key == "model.vocab_size" and "--set model.vocab_size=N" in (p.fix or ""), p.render()
    assert "Megatron pads it itself" not in (p.fix or "")
    assert api.load(write(tmp_path, text), overrides={"model.vocab_size": 128256}, **CLUSTER).model.vocab_size == 128256
    null = text + "tokenizer:\n  tokenizer_type: NullTokenizer\n"
    with pytest.raises(ProjectionError) as e:
        api.load(write(tmp_path, null, "null.yaml"), **CLUSTER)
    text_of = "\n".join(q.render() for q in e.value.problems)
    assert "tokenizer.vocab_size" in text_of and "model.vocab_size" not in text_of, text_of
