"""Weights, gradients and optimizer state per rank (bytes), after model-parallel sharding (params.py) and
data-parallel sharding (distributed optimizer / ZeRO / FSDP).

Megatron mixed precision (megatron/core/distributed, optimizer): bf16/fp16 params (2 B), fp32 main grads in the DDP
grad buffer (4 B, bf16 with --grad-reduce-in-bf16), fp32 master params (4 B) and two fp32 Adam moments (8 B):
18 B/param without the distributed optimizer, 6 + 12/d with it (d = data-parallel x context-parallel shard group for
dense params, the expert-data-parallel group for expert params). ZeRO (Rajbhandari et al. 2020, §5): stage 2 also
shards gradients, stage 3 parameters. FSDP2 (TorchTitan): params stored sharded in main_params_dtype (fp32), the
compute-dtype copies of the units being run are unsharded on the fly.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from projection.specs.model import ModelSpec
from projection.specs.plan import ParallelPlan
from projection.specs.training import DTYPE_BYTES, Fp8Spec, TrainingSpec
from projection.workload.params import RankParams, Sharding, layer_params
from projection.workload.stages import split_stages


@dataclass(frozen=True)
class StateBytes:
    """Model-state bytes of one rank. `terms` names each addend (for --explain and tests)."""

    weights: int
    gradients: int
    optimizer: int
    cpu_optimizer: int
    terms: dict[str, int] = field(default_factory=dict)


def shard_groups(plan: ParallelPlan) -> tuple[int, int]:
    """(dense shard group, expert shard group) sizes for the optimizer / ZeRO sharding.

    Megatron shards dense params over the data-parallel group *with* context parallelism (dp*cp) and expert params
    over the expert-data-parallel group (world / (etp*ep*pp)); --num-distributed-optimizer-instances replicates the
    optimizer that many times inside that group; HSDP (dp_replicate) shards inside dp / dp_replicate."""
    inst = plan.sharding.distributed_optimizer_instances * plan.sharding.dp_replicate
    dense = max(1, plan.dp_() * plan.cp // inst)
    expert = max(1, plan.edp() // inst) if plan.dp is not None else 1
    return dense, expert


def model_state_bytes(model: ModelSpec, training: TrainingSpec, plan: ParallelPlan, rank: RankParams,
                      step_counter_bytes: int = 0) -> StateBytes:
    """Bytes of weights, main gradients and optimizer state on one rank of pipeline stage rank.pp_rank.

    step_counter_bytes: device bytes of the per-parameter-tensor step counter of torch.optim.Adam/AdamW (see
    `step_counter_bytes_total`); 0 (default) where the counters are not on the device."""
    opt = training.optimizer
    sh = plan.sharding
    expert_p = rank.by_component.get("experts", 0)
    dense_p = rank.params - expert_p
    g_dense, g_expert = shard_groups(plan)
    zero = sh.zero_stage
    pbytes = DTYPE_BYTES[training.params_dtype]
    mixed = training.params_dtype != "fp32"
    fsdp2 = zero == 3 and sh.fsdp == "torch_fsdp2"

    def sharded(n_dense: float, n_expert: float, stage_needed: int) -> float:
        if zero >= stage_needed:
            return n_dense / g_dense + n_expert / g_expert
        return n_dense + n_expert

    terms: dict[str, int] = {}
    # Weights. FSDP2 keeps the sharded master copy as the parameter (main_params_dtype); the compute-dtype unsharded
    # copies are counted in `unsharded_units`. Megatron keeps compute-dtype params (sharded only with ZeRO-3/FSDP).
    if fsdp2:
        store = DTYPE_BYTES[opt.main_params_dtype] if mixed else pbytes
        terms["weights.sharded"] = round(sharded(dense_p, expert_p, 3) * store)
        terms["weights.unsharded_units"] = unsharded_unit_bytes(model, training, plan, rank, output_unit=True)
    else:
        terms["weights.params"] = round(sharded(dense_p, expert_p, 3) * pbytes)
        if training.fp8 is not None and training.fp8.param_gather:
            # --fp8-param-gather: the linear weights themselves are fp8 (1 B) instead of the params dtype, except in
            # layers kept in bf16 (built outside fp8_model_init)
            bf16 = bf16_layer_params(model, plan, rank, training.fp8)
            gathered = sum(v - bf16.get(k, 0) for k, v in rank.by_component.items()
                           if training.fp8.gathers_in_fp8(k))
            terms["weights.params"] -= round(gathered * (pbytes - 1) / (g_dense if zero == 3 else 1))
        if zero == 3:
            terms["weights.unsharded_units"] = unsharded_unit_bytes(model, training, plan, rank)
    if training.fp8 is not None and training.fp8.caches_weights:
        terms["weights.fp8_copies"] = fp8_weight_bytes(model, training, plan, rank)
    # Gradients: Megatron's main_grad buffer (fp32 by default); FSDP2 reduce-scatters into sharded grads of the
    # parameter dtype.
    gbytes = DTYPE_BYTES[opt.main_grads_dtype] if mixed else pbytes
    if fsdp2:
        gbytes = DTYPE_BYTES[opt.main_params_dtype] if mixed else pbytes
    terms["gradients.main"] = round(sharded(dense_p, expert_p, 2) * gbytes)
    if fsdp2 and plan.pipelined_fsdp:
        # Gradient sync off until the stage's last backward (ParallelPlan.pipelined_fsdp): FSDP2 accumulates every
        # unsharded gradient in the reduce dtype (FSDPParam.to_accumulated_grad_if_needed upcasts it to
        # mixed_precision_reduce) and reduce-scatters only at the end, so the rank holds its stage's whole gradient
        reduce_b = DTYPE_BYTES[opt.main_grads_dtype] if mixed else pbytes
        terms["gradients.main"] = round((dense_p + expert_p) * reduce_b)
    # Optimizer: master params (mixed precision, unless FSDP2 where the param is the master) + moments.
    moments = [opt.exp_avg_dtype, opt.exp_avg_sq_dtype][: opt.num_moments]
    per_param = sum(DTYPE_BYTES[d] for d in moments)
    master = DTYPE_BYTES[opt.main_params_dtype] if (mixed and not fsdp2) else 0
    n_opt = sharded(dense_p, expert_p, 1)
    total_opt = n_opt * (per_param + master)
    off = plan.offload
    cpu_frac = off.optimizer_fraction if off.optimizer else 0.0
    if off.fsdp_params:
        cpu_frac = 1.0
    terms["optimizer.master"] = round(n_opt * master * (1 - cpu_frac))
    terms["optimizer.moments"] = round(n_opt * per_param * (1 - cpu_frac))
    if step_counter_bytes:
        terms["optimizer.step_counters"] = step_counter_bytes_total(model, plan, rank, step_counter_bytes)
    cpu = round(total_opt * cpu_frac)
    if off.fsdp_params:
        # the sharded parameters and gradients live on the host; a pipelined stage's unsharded accumulated
        # gradients stay on the device until the final reduce-scatter
        cpu += terms.pop("weights.sharded", 0)
        if not plan.pipelined_fsdp:
            cpu += terms.pop("gradients.main")
            terms["gradients.main"] = 0
    weights = sum(v for k, v in terms.items() if k.startswith("weights."))
    grads = terms["gradients.main"]
    optim = terms["optimizer.master"] + terms["optimizer.moments"] + terms.get("optimizer.step_counters", 0)
    return StateBytes(weights, grads, optim, cpu, terms)


def unsharded_unit_bytes(model: ModelSpec, training: TrainingSpec, plan: ParallelPlan, rank: RankParams,
                         output_unit: bool = False) -> int:
    """Compute-dtype copies of FSDP units (one per decoder layer) held unsharded at the peak.

    Reshard after forward: the unit being computed plus the one prefetched (FSDP2 default backward prefetch of one
    unit), i.e. the two largest layers. No reshard: every layer stays unsharded from its forward to its backward
    (the whole stage). The shard held by this rank is already counted in the sharded weights.
    `output_unit` (TorchTitan's FSDP2): the [norm, output] unit is not resharded after forward (its backward comes
    next; apply_fsdp passes reshard_after_forward only under the 'always' policy), so at the start of backward it is
    held together with the last layer's unit, which can outweigh two layers when the vocabulary is large. Without
    reshard (TorchTitan's default under PP) the embedding unit is held as well."""
    pbytes = DTYPE_BYTES[training.params_dtype]
    sh = Sharding(plan.tp, plan.ep, plan.etp_)
    # FP8 all-gather (torchao enable_fsdp_float8_all_gather / --fp8-param-gather): the GEMM weights are gathered and
    # held unsharded in fp8, 1 B per element (torchao fsdp_utils fsdp_post_all_gather); the rest in the params dtype.
    f8 = training.fp8 if training.fp8 is not None and training.fp8.param_gather else None

    def unit_bytes(i: int) -> float:
        parts = layer_params(model, i, sh)
        # a layer kept in bf16 (Fp8Spec.layer_in_fp8) has bf16 weights: gathered and held in the params dtype
        fp8 = f8 is not None and f8.layer_in_fp8(i, model.num_layers)
        linear = sum(v for k, v in parts.items() if f8.gathers_in_fp8(k)) if f8 is not None and fp8 else 0
        return linear * 1 + (sum(parts.values()) - linear) * pbytes

    sizes = sorted((unit_bytes(i) for i in rank.layers), reverse=True)
    # inside pipeline stages reshard-after-backward is off: after a backward every unit stays unsharded until the next
    # forward, so even with reshard after forward the whole stage is held at once
    whole = not plan.sharding.reshard_after_forward or plan.pipelined_fsdp
    held = sum(sizes) if whole else sum(sizes[:2])
    out = rank.by_component.get("output", 0)
    if output_unit and out:
        # the [final norm, output] unit: the output weight (fp8 when converted and gathered so) and the final norm
        final_norm = model.hidden_size * (2 if model.norm == "layernorm" else 1)
        out_b = out * (1 if f8 is not None and f8.gathers_in_fp8("output") else pbytes) + final_norm * pbytes
        held = (held + out_b) if whole else max(held, out_b + sum(sizes[:1]))
    if output_unit and whole:
        held += rank.by_component.get("embedding", 0) * pbytes  # the embedding unit is kept too (no reshard)
    if plan.sharding.fsdp == "torch_fsdp2":
        # FSDP2 gathers into a buffer of its own (FSDPParam's all-gather output, in the compute dtype); the shard
        # stays apart as the sharded parameter, so the unsharded copy is whole
        return round(held)
    g_dense, _ = shard_groups(plan)
    return round(held * (1 - 1 / g_dense))


def fp8_weight_bytes(model: ModelSpec, training: TrainingSpec, plan: ParallelPlan, rank: RankParams) -> int:
    """FP8 weight caches of the linear layers (Transformer Engine): an fp8 copy and its transpose (1 B each) per
    GEMM weight. With fp8 param gather the fp8 copy is the parameter itself (counted in weights.params at the params
    dtype), so only the transpose is extra; without the transpose cache (`Fp8Spec.weight_transpose_cache`, ROCm
    Megatron-LM / Primus) the transpose is not held. Norms, router and embeddings stay in high precision. torchao
    caches nothing (`Fp8Spec.caches_weights`): its per-GEMM casts are freed with the GEMM."""
    assert training.fp8 is not None
    copies = (0 if training.fp8.param_gather else 1) + (1 if training.fp8.weight_transpose_cache else 0)
    return _linear_params(model, plan, rank, training.fp8) * copies


def _linear_params(model: ModelSpec, plan: ParallelPlan, rank: RankParams, fp8: Fp8Spec) -> int:
    """GEMM weights of a rank the FP8 library converts (Fp8Spec.converts); norms and the router are not, nor the
    layers kept in bf16."""
    bf16 = bf16_layer_params(model, plan, rank, fp8)
    return sum(v - bf16.get(k, 0) for k, v in rank.by_component.items() if fp8.converts(k))


def bf16_layer_params(model: ModelSpec, plan: ParallelPlan, rank: RankParams, fp8: Fp8Spec) -> dict[str, int]:
    """Parameters by component of the rank's decoder layers that run in bf16 under fp8 (Fp8Spec.layer_in_fp8)."""
    out: dict[str, int] = {}
    sh = Sharding(plan.tp, plan.ep, plan.etp_)
    for i in rank.layers:
        if not fp8.layer_in_fp8(i, model.num_layers):
            for k, v in layer_params(model, i, sh).items():
                out[k] = out.get(k, 0) + v
    return out


def step_counter_bytes_total(model: ModelSpec, plan: ParallelPlan, rank: RankParams, bytes_each: int) -> int:
    """Adam's step counters on one rank.

    torch.optim.Adam/AdamW keep `state["step"]` as one 0-dim tensor per parameter tensor (float32,
    torch/optim/adam.py `_init_group`): on the parameter's device with fused=True or capturable=True (a CUDA
    caching-allocator block is at least 512 B), on the CPU otherwise, so a CPU training step holds 4 B per parameter
    tensor on its device. Measured exactly on a CPU step under MemTracker (tests/oracle/test_memory_vs_memtracker.py:
    the optimizer state exceeds the Adam moments by 4 B x parameter tensors). A sharded parameter (ZeRO/FSDP) keeps
    its own counter on every rank, so the count is not divided by the shard group."""
    return bytes_each * param_tensor_count(model, plan, rank)


def param_tensor_count(model: ModelSpec, plan: ParallelPlan, rank: RankParams) -> int:
    """Parameter tensors held by one rank of pipeline stage rank.pp_rank, in Megatron-core's module layout: fused
    QKV (linear_qkv) and fused gate/up (linear_fc1) weights, one weight per local expert per GEMM (Transformer
    Engine GroupedLinear weight0..weightN-1), LayerNorm weight + bias, RMSNorm weight, a bias tensor per linear
    with add_bias_linear (QKV also with add_qkv_bias), MLA with the projections and latent norms counted in
    workload/params.py."""
    norm = 2 if model.norm == "layernorm" else 1
    bias = 1 if model.add_bias_linear else 0

    def mlp() -> int:
        return 2 * (1 + bias)  # linear_fc1, linear_fc2

    def layer(i: int) -> int:
        n = 2 * norm  # input_layernorm, pre_mlp_layernorm
        if model.mla is not None:
            m = model.mla
            q = 2 + (norm if model.qk_norm else 0) if m.q_lora_rank else 1
            n += q + 2 + (norm if model.qk_norm else 0) + 1 + bias  # kv down/up, kv norm, linear_proj
        else:
            n += 1 + (1 if (model.add_bias_linear or model.add_qkv_bias) else 0) + 1 + bias
            n += 2 * norm if model.qk_norm else 0
        moe = model.moe
        if moe is not None and model.is_moe_layer(i):
            n += 1 + (1 if moe.router_bias else 0)
            n += (moe.num_experts // plan.ep) * mlp()
            if moe.shared_expert_ffn_hidden_size:
                n += mlp() + (1 if moe.shared_expert_gate else 0)
        else:
            n += mlp()
        return n

    slots = [s for s in split_stages(model, plan) if s.pp_rank == rank.pp_rank]
    count = sum(layer(i) for i in rank.layers)
    embedding = 1 + (1 if model.position_embedding == "learned" else 0)
    for slot in slots:
        if slot.embedding:
            count += embedding
        if slot.loss:
            count += norm + (0 if model.tie_embeddings and slot.embedding else 1)  # final norm, output layer
        if slot.mtp_layers:
            # enorm, hnorm, eh_proj, the transformer layer (like the last decoder layer), final norm
            count += slot.mtp_layers * (3 * norm + 1 + layer(model.num_layers - 1))
            if not slot.embedding:
                count += embedding
    return count
