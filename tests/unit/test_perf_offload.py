"""Offload traffic in the performance projection: Megatron fine-grained activation offloading copies each layer's
offloaded activations over the device's host link after its forward and back before its backward; an offloaded
optimizer moves its share's gradients and parameters over the same link. The host link is a spec-sheet number
(PCIe), checked here against the PCI-SIG arithmetic."""

from __future__ import annotations

import pytest

from projection.memory.offload import layer_offload_splits
from projection.perf import default_cost_model, optimizer_step_seconds, price_stages, project
from projection.specs.hardware import ClusterSpec, list_devices, load_device
from projection.specs.model import ModelSpec
from projection.specs.plan import ParallelPlan
from projection.specs.scenario import Scenario
from projection.specs.training import TrainingSpec
from projection.workload.stages import split_stages

H100 = load_device("h100-sxm")
MODULES = ("attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm")


def pcie_bytes_per_s(gen: int) -> float:
    """x16 link, one direction: transfer rate x lanes x 128b/130b encoding / 8 bits (PCIe 3.0 onwards)."""
    return {4: 16e9, 5: 32e9}[gen] * 16 * 128 / 130 / 8


@pytest.mark.parametrize("name", list_devices())
def test_host_link_is_the_pcie_x16_line_rate_of_its_generation(name: str) -> None:
    device = load_device(name)
    source = device.sources["host_link_bytes_per_s"]
    gen = 4 if "PCIe 4.0" in source else 5
    assert f"PCIe {gen}.0 x16" in source
    assert device.host_link_bytes_per_s == pytest.approx(pcie_bytes_per_s(gen), rel=1e-3)


def scenario(*, modules: tuple[str, ...] = MODULES, device: object = H100, optimizer: float = 0.0) -> Scenario:
    model = ModelSpec(num_layers=4, hidden_size=2048, num_attention_heads=16, ffn_hidden_size=8192, vocab_size=32000)
    training = TrainingSpec(seq_length=4096, micro_batch_size=2, global_batch_size=16)
    offload = {"activation_modules": modules, "optimizer": optimizer > 0, "optimizer_fraction": optimizer or 1.0}
    plan = ParallelPlan(tp=1, pp=2, dp=4, sharding={"zero_stage": 1}, offload=offload)
    return Scenario(model=model, training=training, plan=plan, framework="megatron",
                    cluster=ClusterSpec(device=device, nodes=1, gpus_per_node=8))


def test_activation_copies_cost_the_memory_estimate_bytes_over_the_host_link() -> None:
    quiet = H100.model_copy(update={"host_kernel_issue_s": None})  # no host issue: the bounds below are exact
    plain, off = scenario(modules=(), device=quiet), scenario(device=quiet)
    cm = default_cost_model(plain)
    before, after = price_stages(plain, cm), price_stages(off, cm)
    link = H100.host_link_bytes_per_s
    assert link is not None
    for slot, s0, s1 in zip(split_stages(off.model, off.plan), before.stages, after.stages, strict=True):
        moved = sum(o for _, _, o in layer_offload_splits(off, slot))
        assert moved > 0 or slot.loss  # the loss stage's last layer keeps its activations
        copy_s = moved / link
        # each copy runs on its own direction of the link and overlaps the compute after it; the action ends
        # when the last copy is done, so it takes at least the copies and at most compute + copies
        for a0, a1 in ((s0.f, s1.f), (s0.b, s1.b)):
            assert max(a0.seconds, copy_s) - 1e-12 <= a1.seconds <= a0.seconds + copy_s + 1e-6
            assert a1.comm_s.get("offload", 0.0) == pytest.approx(copy_s)
    p = project(off, cm)
    assert p.breakdown_s["offload"] > 0 and p.comm_total_s["offload"] > 0
    assert sum(p.breakdown_s.values()) == pytest.approx(p.step_time_s, rel=1e-6)
    assert p.step_time_s > project(plain, cm).step_time_s


def test_without_a_host_link_the_copies_are_not_priced_and_the_notes_say_so() -> None:
    bare = H100.model_copy(update={"host_link_bytes_per_s": None,
                                   "sources": {k: v for k, v in H100.sources.items() if k != "host_link_bytes_per_s"}})
    sc = scenario(device=bare)
    p = project(sc, default_cost_model(sc))
    assert p.breakdown_s["offload"] == 0.0
    assert any("host_link_bytes_per_s" in n for n in p.notes)


def test_optimizer_offload_moves_its_share_over_the_host_link() -> None:
    """The offloaded half of the rank's shard: its fp32 gradients go to the host and its fp32 parameters come back,
    one after the other, exactly bytes / link seconds on top of the GPU's half (no host issue time here)."""
    from projection.perf.stage_params import stage_params

    quiet = H100.model_copy(update={"host_kernel_issue_s": None})
    bare = quiet.model_copy(update={"host_link_bytes_per_s": None, "sources": {
        k: v for k, v in quiet.sources.items() if k not in ("host_link_bytes_per_s", "host_kernel_issue_s")}})
    half, unlinked = scenario(modules=(), optimizer=0.5, device=quiet), scenario(modules=(), optimizer=0.5,
                                                                                   device=bare)
    cm = default_cost_model(half)
    assert any("optimizer offload" in n for n in project(half, cm).notes)
    slots = [s for s in split_stages(half.model, half.plan) if s.pp_rank == 0]
    shard = sum(stage_params(half.model, half.plan, s).total for s in slots) / half.plan.dp_()
    link = quiet.host_link_bytes_per_s
    assert link is not None
    copies_s = 0.5 * shard * (4 + 4) / link
    extra = optimizer_step_seconds(half, cm)[0] - optimizer_step_seconds(unlinked, default_cost_model(unlinked))[0]
    assert extra == pytest.approx(copies_s, rel=1e-9)


def test_fsdp_cpu_offload_copies_each_shard_beside_its_collectives() -> None:
    """TorchTitan enable_cpu_offload (FSDP2 CPUOffloadPolicy): each unit's all-gather first brings the rank's fp32
    shard to the device, each reduce-scatter sends the fp32 gradient shard back; the host runs the optimizer (a note
    says it is not priced) and the GPU's optimizer step has no update work left."""
    from projection.perf.fsdp_sizes import FsdpSizes
    from projection.perf.stage_params import stage_params

    def fsdp(cpu: bool) -> Scenario:
        sc = scenario(modules=())
        plan = sc.plan.model_copy(update={"pp": 1, "dp": 8, "sharding": sc.plan.sharding.model_copy(
            update={"zero_stage": 3, "fsdp": "torch_fsdp2"}), "offload": sc.plan.offload.model_copy(
            update={"fsdp_params": cpu})})
        return sc.model_copy(update={"plan": plan, "framework": "torchtitan"})

    off, on_gpu = fsdp(True), fsdp(False)
    cm = default_cost_model(off)
    slot = split_stages(off.model, off.plan)[0]
    params = stage_params(off.model, off.plan, slot)
    names = [n for n, _, _ in params.components]
    (g1, r1, _), (g0, r0, _) = FsdpSizes(off, cm).unit_seconds(params, names), FsdpSizes(on_gpu, cm).unit_seconds(
        params, names)
    link = H100.host_link_bytes_per_s
    assert link is not None
    for (name, dense, _), a1, a0, s1, s0 in zip(params.components, g1, g0, r1, r0, strict=True):
        shard_s = dense / 8 * 4 / link  # fp32 master shard / fp32 gradient shard over one direction of the link
        assert a1[0] - a0[0] == pytest.approx(shard_s, rel=1e-9), name
        assert s1[0] - s0[0] == pytest.approx(shard_s, rel=1e-9), name
    p = project(off, cm)
    assert any("FSDP CPU offload" in n for n in p.notes)
    assert optimizer_step_seconds(off, cm)[0] < optimizer_step_seconds(on_gpu, cm)[0]


# ---- layer-level CPU offloading (--cpu-offloading --cpu-offloading-num-layers N) --------------------------------

def layer_scenario(n: int, **plan: object) -> Scenario:
    model = ModelSpec(num_layers=4, hidden_size=2048, num_attention_heads=16, ffn_hidden_size=8192, vocab_size=32000)
    training = TrainingSpec(seq_length=4096, micro_batch_size=2, global_batch_size=16)
    return Scenario(model=model, training=training, framework="megatron",
                    plan=ParallelPlan(tp=1, pp=1, dp=8, offload={"activation_layers": n}, **plan),  # type: ignore[arg-type]
                    cluster=ClusterSpec(device=H100, nodes=1, gpus_per_node=8))


def test_layer_offloading_moves_the_first_layers_whole() -> None:
    """Transformer Engine's group offload handler takes the first N layers' saved tensors off the GPU: the in-flight
    activations lose exactly those layers' saved bytes (activations.saved_layer_bytes, the unoffloaded inventory),
    one offloaded layer stays resident in transit, and the step pays the copies over the host link."""
    from projection.memory.activations import saved_layer_bytes
    from projection.memory.estimate import estimate_memory

    plain, off = layer_scenario(0), layer_scenario(2)
    (slot,) = split_stages(off.model, off.plan)
    splits = layer_offload_splits(off, slot)
    per_layer = [saved_layer_bytes(off.model, off.training, off.plan, i, False) for i in range(4)]
    assert [(i, r, o) for i, r, o in splits] == [(0, 0.0, per_layer[0]), (1, 0.0, per_layer[1]),
                                                (2, per_layer[2], 0.0), (3, per_layer[3], 0.0)]
    (r0,), (r1,) = estimate_memory(plain).ranks, estimate_memory(off).ranks
    assert r0.terms["activations.dense_layers"] - r1.terms["activations.dense_layers"] == pytest.approx(
        per_layer[0] + per_layer[1])
    assert r1.terms.get("working.offload_transit") == pytest.approx(per_layer[0])
    # the host holds what left the GPU: the two layers of the one microbatch in flight (pinned memory to size for)
    assert r0.cpu_bytes == 0 and r1.cpu_bytes == round(per_layer[0] + per_layer[1])
    assert project(off).step_time_s > project(plain).step_time_s


def test_layer_offloading_leaves_untagged_tensors_on_the_gpu() -> None:
    """Transformer Engine moves only tensors marked for offloading: with dropout and MoE, the bias-dropout-add masks
    and the router probabilities stay (activations.layer_tensors names them), and with GeLU experts without biases
    the activation output the `* probs` multiply keeps."""
    from projection.memory.activations import layer_tensors

    model = ModelSpec(num_layers=4, hidden_size=1024, num_attention_heads=16, ffn_hidden_size=4096, vocab_size=32000,
                      moe={"num_experts": 8, "top_k": 2, "expert_ffn_hidden_size": 512})
    training = TrainingSpec(seq_length=1024, micro_batch_size=1, global_batch_size=16, dropout=0.1)
    sc = Scenario(model=model, training=training, framework="megatron",
                  plan=ParallelPlan(tp=1, pp=1, dp=8, offload={"activation_layers": 1}),
                  cluster=ClusterSpec(device=H100, nodes=1, gpus_per_node=8))
    (slot,) = split_stages(model, sc.plan)
    tensors = layer_tensors(model, training, sc.plan, 0)
    stay = tensors["attn.out_dropout_mask"] + tensors["moe.dropout_mask"] + tensors["moe.router_probs"]
    (_, resident, off), *_ = layer_offload_splits(sc, slot)
    assert resident == pytest.approx(stay) and off == pytest.approx(sum(tensors.values()) - stay)
    gelu = model.model_copy(update={"gated_mlp": False, "activation": "gelu"})
    sc = sc.model_copy(update={"model": gelu})
    tensors = layer_tensors(gelu, training, sc.plan, 0)
    stay += tensors["moe.experts.act_out"]
    (_, resident, off), *_ = layer_offload_splits(sc, slot)
    assert resident == pytest.approx(stay) and off == pytest.approx(sum(tensors.values()) - stay)
