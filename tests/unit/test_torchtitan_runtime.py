"""TorchTitan settings that change how a job runs rather than what it is: torch.compile and Primus-Turbo's attention
(what is saved for backward), async TP's need for compile, and weak scaling at a fixed global batch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from projection.errors import ConfigError
from projection.formats.torchtitan import load_torchtitan
from tests.unit.test_torchtitan_loader import V01, _cfg, _llama8b_job, _raw, _write


def test_async_tp_without_compile_is_refused(tmp_path: Path) -> None:
    """TorchTitan's parallelize raises "Async TP requires torch.compile" when TP is on, async TP asked for and the
    model not compiled; it used to be accepted with the overlap silently dropped."""
    with pytest.raises(ConfigError) as err:
        load_torchtitan(_write(tmp_path, V01.replace("compile = true", "compile = false")))
    assert "parallelism.enable_async_tensor_parallel" in str(err.value) and "requires torch.compile" in str(err.value)


def test_target_nodes_keeps_the_global_batch_by_shrinking_the_local_batch(tmp_path: Path) -> None:
    """Weak scaling at a fixed global batch: TorchTitan runs gbs / (local x dp) accumulation steps and refuses a
    global batch that is not a multiple of local x dp, so where a rank's share gbs / dp is no longer a multiple of
    the local batch, the local batch becomes the share (every file without a global batch used to be refused at
    twice its node count, with a fix that raised the global batch). Under PP the pipeline microbatch is kept."""
    from projection import api
    from projection.errors import PlanError
    from projection.perf.scaling import extrapolate

    flat = api.load(_llama8b_job(tmp_path, parallelism="tensor_parallel_degree = 1"), nodes=1, hardware="h100-sxm",
                    overrides={"training.local_batch_size": 4})
    assert flat.training.resolved_global_batch(flat.plan.dp_()) == 32
    for nodes, local in ((2, 2), (4, 1)):
        moved = extrapolate(flat, nodes)
        assert (moved.training.local_batch_size, moved.training.micro_batch_size) == (local, local)
        assert moved.training.resolved_global_batch(moved.plan.dp_()) == 32
        assert moved.training.num_microbatches(moved.plan.dp_()) == 1
    # a share that is not a multiple of the local batch: its largest divisor not above it, never a larger batch
    wide = api.load(_llama8b_job(tmp_path, "global_batch_size = 96", "tensor_parallel_degree = 1"), nodes=1,
                    hardware="h100-sxm", overrides={"training.local_batch_size": 4})
    moved = extrapolate(wide, 2)  # dp 16: 6 sequences per rank as 2 steps of 3
    assert (moved.training.local_batch_size, moved.training.num_microbatches(16)) == (3, 2)
    with pytest.raises(PlanError) as err:  # dp 64: half a sequence per rank
        extrapolate(flat, 8)
    assert any("--set training.global_batch_size=64" in (p.fix or "") for p in err.value.problems)

    path = _llama8b_job(tmp_path, "global_batch_size = 32", "pipeline_parallel_degree = 2")
    piped = api.load(path, nodes=2, hardware="h100-sxm", overrides={"training.local_batch_size": 4})
    moved = extrapolate(piped, 4)  # dp 16: 2 sequences per rank, 2 pipeline microbatches of 1
    assert (moved.training.local_batch_size, moved.training.micro_batch_size) == (2, 1)
    assert moved.training.num_microbatches(moved.plan.dp_()) == 2
    with pytest.raises(PlanError) as err:  # dp 64
        extrapolate(piped, 16)
    # 64 would leave each rank one pipeline microbatch, fewer than torch's Schedule1F1B takes on pp 2; 128 gives 2
    assert any("--set training.global_batch_size=128" in (p.fix or "") for p in err.value.problems)


@pytest.mark.parametrize(("sections", "model", "loss"), [
    ({}, False, False),
    ({"compile": {"enable": True}}, True, True),  # components default to ["model", "loss"]
    ({"compile": {"enable": True, "components": ["loss"]}}, False, True),
    ({"compile": {"enable": True, "components": ["model"]}}, True, False),
    ({"training": {"compile": True}}, True, True),  # v0.1: the model and the loss
])
def test_compile_components(sections: dict[str, Any], model: bool, loss: bool) -> None:
    """What torch.compile changes in memory (tests/oracle/test_memory_torchtitan_compile.py): the compiled blocks'
    saved set (kernels.compiled) and the compiled loss's 16-bit logits (fused_loss)."""
    raw = _raw(_cfg(**sections))
    assert bool(raw.get("training.kernels.compiled")) is model
    assert bool(raw.get("training.fused_loss")) is loss


def test_primus_turbo_attention_takes_kv_without_repeat() -> None:
    """Primus's turbo attention patch replaces Llama 3 / 4 attention with a GQA-native kernel (no repeat_kv); on by
    default once Primus-Turbo is, off without it or for other models."""
    on = {"primus_turbo": {"enable_primus_turbo": True}}
    assert _raw(_cfg(**on)).get("training.kernels.gqa_native_attention") is True
    assert not _raw(_cfg(primus_turbo={"enable_primus_turbo": True, "use_turbo_attention": False})).get(
        "training.kernels.gqa_native_attention")
    assert not _raw(_cfg()).get("training.kernels.gqa_native_attention")
    qwen = _cfg(**on)
    qwen["model"] = {"name": "qwen3", "flavor": "0.6B"}
    assert not _raw(qwen).get("training.kernels.gqa_native_attention")


@pytest.mark.parametrize(("norm_type", "kernel", "norm"), [
    (None, None, "rmsnorm"),  # releases without the key: nn.RMSNorm, PyTorch's fused kernel
    ("rmsnorm", "composite", "rmsnorm"),  # TorchTitan's own eager RMSNorm of 2024
    ("RMSNorm", "composite", "rmsnorm"),  # build_norm lower-cases the name
    ("fused_rmsnorm", None, "rmsnorm"),  # its Triton kernel
    ("np_layernorm", None, "layernorm"),
])
def test_norm_type_of_the_2024_releases(norm_type: str | None, kernel: str | None, norm: str) -> None:
    """[model] norm_type (torchtitan/models/norms.py build_norm of 2024) is read, not refused as an unknown key: the
    eager 'rmsnorm' runs the composite chain of kernels (projection/workload/ops_eager.py)."""
    raw = _raw(_cfg(model={"norm_type": norm_type}) if norm_type else _cfg())
    assert raw.get("training.kernels.rms_norm_kernel") == kernel
    assert raw.get("model.norm") == norm


def test_unknown_norm_type_is_refused() -> None:
    with pytest.raises(ConfigError) as err:
        _raw(_cfg(model={"norm_type": "batchnorm"}))
    assert "model.norm_type" in str(err.value) and "fused_rmsnorm" in str(err.value)


@pytest.mark.parametrize(("optimizer", "implementation"), [
    ({}, None),  # today's default: implementation = "fused"
    ({"implementation": "foreach"}, "foreach"),
    ({"implementation": "for-loop"}, "for-loop"),
    ({"fused": False}, "foreach"),  # the 2024 releases: foreach = not fused
    ({"fused": True}, "fused"),
])
def test_optimizer_implementation(optimizer: dict[str, Any], implementation: str | None) -> None:
    """build_optimizers passes fused / foreach from [optimizer] implementation, or the 2024 optimizer.fused; the
    foreach passes are priced one by one (projection/perf/optimizer.py foreach_adam)."""
    raw = _raw(_cfg(optimizer=optimizer))
    assert raw.get("training.optimizer.implementation") == implementation


def test_fsdp2_optimizer_reads_fp32_gradients_whatever_the_reduce_dtype(tmp_path: Path) -> None:
    """FSDP2 reduce-scatters in mixed_precision_reduce and casts the shard back to the sharded parameter's dtype
    (fp32; _fsdp_collectives.foreach_reduce `_to_dtype_if_needed(reduce_output, orig_dtype)`): the optimizer step is
    priced the same for a bf16 and an fp32 reduce, foreach or fused (it read 2 B gradients under a bf16 reduce)."""
    from projection import api
    from projection.perf.costmodel import default_cost_model
    from projection.perf.optimizer import optimizer_step_seconds

    steps = {}
    for reduce in ("float32", "bfloat16"):
        for way in ("foreach", "fused"):
            path = _write(tmp_path, f"""
                [model]
                name = "llama3"
                flavor = "8B"
                [optimizer]
                implementation = "{way}"
                [training]
                local_batch_size = 1
                seq_len = 1024
                mixed_precision_reduce = "{reduce}"
                [parallelism]
                data_parallel_shard_degree = 8
            """)
            sc = api.load(path, overrides=["cluster.hardware=h100-sxm", "cluster.nodes=1", "cluster.gpus_per_node=8"])
            steps[reduce, way] = optimizer_step_seconds(sc, default_cost_model(sc))
    assert steps["float32", "foreach"] == steps["bfloat16", "foreach"]
    assert steps["float32", "fused"] == steps["bfloat16", "fused"]
