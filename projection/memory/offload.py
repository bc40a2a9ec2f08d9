"""What each decoder layer keeps on the GPU, and what it moves to the CPU, under activation offloading.

Megatron fine-grained activation offloading (--fine-grained-activation-offloading --offload-modules ...,
megatron/core/pipeline_parallel/fine_grained_activation_offload.py): the tensors a listed module saves for backward
(saved-tensor hooks inside the module's offload group) are copied to pinned CPU memory on a side stream when the group
commits, and their GPU blocks are released once the copy is done (record_stream); tensors under
min_offloaded_tensor_size = 2**20 elements stay. Backward reloads a group ahead of use. The last layer of a chunk whose
backward comes right after its forward (the chunk with the loss on the last stage) is not offloaded
(ChunkOffloadHandler.should_bulk_offload). So an in-flight microbatch keeps only the tensors of modules not listed;
one layer's offloaded tensors are resident at any time (copy in progress, or reload prefetched).

Megatron's layer-level CPU offloading (--cpu-offloading --cpu-offloading-num-layers N, Transformer Engine's
get_cpu_offload_context; pp 1 and no recompute only, transformer_config.py): Transformer Engine's group offload
handler offloads the saved activations of the first N decoder layers (one offload group per layer, counted from the
first, while its current group is below N) and reloads them ahead of their backward: the tensors marked for
offloading (`_not_tagged_for_offload` names the ones that stay), with one layer's resident at any time like the
fine-grained path.
"""

from __future__ import annotations

from projection.memory.activations import (
    dims,
    layer_input_bytes,
    layer_tensors,
    recomputed_layers,
    saved_layer_bytes,
    selective_saved,
)
from projection.memory.buffers import is_megatron
from projection.specs.scenario import Scenario
from projection.workload.stages import StageSlot

# Megatron --offload-modules group -> the saved tensors of the layer inventory (activations.py) it moves to the CPU.
# The attention output is saved by the output projection (attn_proj) and, with flash/fused attention, by the
# attention kernel too (core_attn): it leaves the GPU only when every module saving it offloads.
_OFFLOAD_GROUPS: dict[str, tuple[str, ...]] = {
    "attn_norm": ("attn.norm_in",),
    "qkv_linear": ("attn.linear_in",),
    "core_attn": ("attn.qkv", "attn.softmax", "attn.dropout_mask", "attn.dropout", "attn.lse"),
    "attn_proj": (),  # attn.core_out, see _offloaded_names
    "mlp_norm": ("mlp.norm_in", "moe.norm_in"),
    "expert_fc1": ("moe.dispatched",),
    "moe_act": ("moe.experts.act_in",),
}
MIN_OFFLOADED_ELEMENTS = 1024 * 1024  # ChunkOffloadHandler min_offloaded_tensor_size default


def _offloaded_names(sc: Scenario) -> set[str]:
    mods = set(sc.plan.offload.activation_modules)
    names = {n for mod in mods for n in _OFFLOAD_GROUPS.get(mod, ())}
    if "attn_proj" in mods and (sc.training.attention_backend == "unfused" or "core_attn" in mods):
        names.add("attn.core_out")
    return names


def _not_tagged_for_offload(name: str) -> bool:
    """Saved tensors Transformer Engine's layer-level offload leaves on the GPU: it moves only tensors marked
    `activation_offloading` (TE modules' saves, Megatron's linear inputs, bias_swiglu's input), not the fused
    bias-dropout-add masks, the router's probabilities, the activation output an unfused expert activation's
    `* probs` multiply keeps, or an unpermute's expert outputs."""
    return "dropout" in name or name in ("moe.router_probs", "moe.experts.act_out", "moe.expert_out")


def _saved_tensors(sc: Scenario, i: int, full: bool, chunk_head: bool) -> dict[str, float]:
    """Named tensors decoder layer i keeps per microbatch after recompute; mirrors activations.saved_layer_bytes
    (whose sum it must equal)."""
    m, t, p = sc.model, sc.training, sc.plan
    if full:
        return {"layer.input": layer_input_bytes(m, t, p) if chunk_head else 0.0}
    tensors = layer_tensors(m, t, p, i)
    if p.recompute.granularity == "selective":
        tensors = selective_saved(m, t, p, i, tensors)
    return tensors


def _offloads(sc: Scenario) -> bool:
    """Whether the plan's activation offloading runs: Megatron-Core's two mechanisms, in a Megatron-family job or a
    native / HF scenario (whose plan fields are Megatron's, checked by Megatron-Core's rules, specs/validate.py);
    TorchTitan has neither."""
    return is_megatron(sc) or "torchtitan" not in sc.framework


def offload_split(sc: Scenario, i: int, full: bool = False, chunk_head: bool = True) -> tuple[float, float]:
    """(resident, offloaded) bytes layer i keeps per in-flight microbatch under Megatron fine-grained activation
    offloading (module docstring); (saved, 0) without it."""
    m, t, p = sc.model, sc.training, sc.plan
    total = saved_layer_bytes(m, t, p, i, full, chunk_head=chunk_head)
    if _offloads(sc) and i < p.offload.activation_layers:  # layer-level CPU offloading of the first N layers
        tensors = _saved_tensors(sc, i, full, chunk_head)
        stay = sum(v for k, v in tensors.items() if _not_tagged_for_offload(k))
        return stay, total - stay
    names = _offloaded_names(sc) if _offloads(sc) else set()
    if not names:
        return total, 0.0
    tensors = _saved_tensors(sc, i, full, chunk_head)
    if abs(sum(tensors.values()) - total) > 1e-6 * max(total, 1.0):
        return total, 0.0  # inventory changed shape: stay conservative (nothing offloaded)
    e = dims(m, t, p).e
    off = sum(v for k, v in tensors.items() if k in names and v / e >= MIN_OFFLOADED_ELEMENTS)
    return total - off, off


def layer_offload_splits(sc: Scenario, slot: StageSlot,
                         memo: dict[tuple[object, ...], tuple[float, float]] | None = None
                         ) -> list[tuple[int, float, float]]:
    """(layer, resident, offloaded) bytes per in-flight microbatch for each decoder layer of virtual stage `slot`
    (offload_split; the chunk's last layer keeps everything when the loss follows it, module docstring)."""
    memo = {} if memo is None else memo
    m, p = sc.model, sc.plan
    full = recomputed_layers(p, slot.layers)
    chunk = max(1, p.recompute.num_layers or 1) if p.recompute.method == "uniform" else 1
    keep_last = slot.loss and not slot.mtp_layers  # backwarded right after its forward: not offloaded
    out = []
    for n, i in enumerate(slot.layers):
        fp8 = sc.training.fp8
        key = (m.is_moe_layer(i), i in full, n % chunk == 0, p.recompute.every_nth_checkpoints(i),
               i < p.offload.activation_layers, fp8 is not None and fp8.layer_in_fp8(i, m.num_layers))
        if key not in memo:
            memo[key] = offload_split(sc, i, i in full, chunk_head=(n % chunk == 0))
        resident, off = memo[key]
        if keep_last and n == len(slot.layers) - 1:
            resident, off = resident + off, 0.0
        out.append((i, resident, off))
    return out
