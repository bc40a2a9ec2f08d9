"""--schedule on the Megatron family: Megatron-LM's runtime (schedules.py) runs 1F1B and interleaved 1F1B only, and a
Primus experiment runs its zero-bubble schedules through its own patches, whose start-up rules then apply
(specs/validate_schedule.py, formats/primus_set.schedule_overrides, api._primus_schedule)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from projection import api
from projection.cli import main
from projection.errors import ProjectionError

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT.parent / "shared" / "fixtures"
PRIMUS = FIXTURES / "primus" / "examples" / "megatron" / "configs" / "MI300X" / "llama2_7B-BF16-pretrain.yaml"
MEGATRON = FIXTURES / "megatron" / "gpt3_mcore_te_tp2_pp2_resume_torch_dist" / "model_config.yaml"
pytestmark = pytest.mark.skipif(not PRIMUS.exists() or not MEGATRON.exists(),
                                reason="../shared/fixtures is absent (a user's clone)")
PP4 = ["pipeline_model_parallel_size=4"]
ZB_READY = [*PP4, "overlap_grad_reduce=false", "overlap_param_gather=false", "gradient_accumulation_fusion=true"]


def _schedules_compared(capsys: pytest.CaptureFixture[str], config: Path, overrides: list[str]) -> list[str]:
    sets = [a for o in overrides for a in ("--set", o)]
    assert main(["performance", "--config", str(config), *sets, "--schedule", "all", "--format", "json"]) == 0
    return [p["schedule"] for p in json.loads(capsys.readouterr().out)["schedules"]]


def test_megatron_lm_refuses_a_schedule_its_runtime_lacks(capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("zb_h1", "gpipe", "zbv"):
        with pytest.raises(ProjectionError, match="Megatron-LM's pipeline runtime .* has no"):
            api.load(MEGATRON, hardware="h100-sxm", gpus_per_node=8, schedule=name)
    assert api.load(MEGATRON, hardware="h100-sxm", gpus_per_node=8, schedule="1f1b").plan.schedule == "1f1b"
    assert _schedules_compared(capsys, MEGATRON, []) == ["1f1b"]


def test_primus_zero_bubble_through_its_patch_and_its_rules() -> None:
    # the example overlaps gradient reduction and parameter gather with the distributed optimizer, and runs without
    # gradient-accumulation fusion: Primus's zero-bubble runtime refuses all three, as with patch_zero_bubble itself
    for name in ("zb_h1", "zb_h2", "zbv", "v_half", "v_min"):
        with pytest.raises(ProjectionError) as via_schedule:
            api.load(PRIMUS, overrides=PP4, schedule=name)
        keys = {p.key.rsplit(".", 1)[-1] for p in via_schedule.value.problems if p.key}
        assert keys == {"overlap_grad_reduce", "overlap_param_gather", "gradient_accumulation_fusion"}, name
    with pytest.raises(ProjectionError) as via_patch:
        api.load(PRIMUS, overrides=[*PP4, "patch_zero_bubble=true"])
    assert len(via_patch.value.problems) == 3
    # ready for it: the schedule Primus's keys pick, off Megatron's runtime, V schedules on two stages per rank
    for name, vpp in (("zb_h1", 1), ("zb_h2", 1), ("zbv", 2), ("v_half", 2), ("v_min", 2)):
        sc = api.load(PRIMUS, overrides=ZB_READY, schedule=name)
        assert (sc.plan.schedule, sc.plan.vpp_, sc.plan.pipeline_runtime) == (name, vpp, "actions"), name
        assert sc.origins.get("plan.schedule", "").startswith("<command line>")
    back = api.load(PRIMUS, overrides=[*ZB_READY, "patch_zero_bubble=true"], schedule="1f1b")
    assert (back.plan.schedule, back.plan.pipeline_runtime) == ("1f1b", "megatron")
    with pytest.raises(ProjectionError, match="has no gpipe schedule"):
        api.load(PRIMUS, overrides=ZB_READY, schedule="gpipe")


def test_primus_compares_what_primus_would_run(capsys: pytest.CaptureFixture[str]) -> None:
    assert _schedules_compared(capsys, PRIMUS, PP4) == ["1f1b"]
    assert sorted(_schedules_compared(capsys, PRIMUS, ZB_READY)) == sorted(
        ["1f1b", "zb_h1", "zb_h2", "zbv", "v_half", "v_min"])


def test_one_reason_for_a_schedule_megatron_lacks_at_a_virtual_pipeline() -> None:
    """At vpp > 1 the runtime's refusal stands alone: not beside ZB-H1's own one-stage-per-rank rule."""
    vpp = FIXTURES / "megatron" / "gpt3_7b_tp1_pp4_memory_speed" / "model_config.yaml"
    with pytest.raises(ProjectionError) as err:
        api.load(vpp, hardware="h100-sxm", gpus_per_node=8, schedule="zb_h1")
    assert [p.message.split(":")[0] for p in err.value.problems] == [
        "Megatron-LM's pipeline runtime (schedules.py) has no zb_h1 schedule"]
