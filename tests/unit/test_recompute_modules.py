"""Selective recompute modules: what is accepted, and 'layer:N' meaning the same layers to the memory estimate and
to the op list (TorchTitan's every-N-th block, its wrap counter starting at 1)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from projection.memory.activations import layer_input_bytes, saved_layer_bytes
from projection.specs.model import ModelSpec
from projection.specs.plan import ParallelPlan, RecomputeSpec
from projection.specs.training import TrainingSpec
from projection.workload.ops import _recompute_mode

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_layer_n_checkpoints_the_same_layers_in_memory_and_in_the_op_list(n: int) -> None:
    model = ModelSpec(num_layers=10, hidden_size=512, num_attention_heads=8, ffn_hidden_size=2048, vocab_size=1024)
    training = TrainingSpec(seq_length=256, micro_batch_size=1, global_batch_size=8)
    plan = ParallelPlan(recompute={"granularity": "selective", "modules": (f"layer:{n}",)})
    full_in_memory = {i for i in range(10) if saved_layer_bytes(model, training, plan, i, False)
                      == layer_input_bytes(model, training, plan)}
    full_in_ops = {i for i in range(10) if _recompute_mode(model, plan, i) == "full"}
    assert full_in_memory == full_in_ops == {i for i in range(10) if (i + 1) % n == 0}


@pytest.mark.parametrize("bad", ["layer:0", "layer:x", "layer:-1", "attn", "foo"])
def test_unknown_or_impossible_modules_are_refused(bad: str) -> None:
    with pytest.raises(ValidationError, match="unknown recompute module"):
        RecomputeSpec(granularity="selective", modules=(bad,))
    res = subprocess.run([sys.executable, "-m", "projection", "memory", "--config",
                          str(REPO / "examples" / "llama3_8b_inline.yaml"), "--set",
                          "plan.recompute.granularity=selective", "--set", f"plan.recompute.modules=[{bad}]"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "Traceback" not in res.stderr and "plan.recompute.modules" in res.stderr


def test_cluster_given_as_a_scalar_is_refused() -> None:
    res = subprocess.run([sys.executable, "-m", "projection", "memory", "--config",
                          str(REPO / "examples" / "llama3_8b_inline.yaml"), "--set", "cluster=x"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "Traceback" not in res.stderr and "--set cluster.nodes=4" in res.stderr


@pytest.mark.parametrize("n", [2, 3])
def test_the_per_stage_memo_keeps_every_nth_layers_apart(n: int, tmp_path: Path) -> None:
    """layer_offload_splits caches by layer kind: a layer:N-checkpointed layer must not share a cache entry with one
    that is not (the stage's bytes equal the layer-by-layer ones)."""
    from projection import api
    from projection.memory.offload import layer_offload_splits, offload_split
    from projection.workload.stages import split_stages

    path = tmp_path / "exp.yaml"
    path.write_text("model: {num_layers: 10, hidden_size: 512, num_attention_heads: 8, ffn_hidden_size: 2048, "
                    "vocab_size: 1024}\ntraining: {seq_length: 256, micro_batch_size: 1, global_batch_size: 8}\n"
                    f"plan: {{recompute: {{granularity: selective, modules: ['layer:{n}']}}}}\n"
                    "cluster: {hardware: h100-sxm, nodes: 1, gpus_per_node: 1}\n")
    sc = api.load(path)
    (slot,) = split_stages(sc.model, sc.plan)
    got = [(i, r + o) for i, r, o in layer_offload_splits(sc, slot)[:-1]]  # the last layer keeps its loss-side bytes
    assert got == [(i, sum(offload_split(sc, i))) for i, _ in got]
