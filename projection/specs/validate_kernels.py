"""What the attention and MoE kernels of a Megatron-family job refuse at start-up (called by
specs/validate.layout_problems with its `bad`): context-parallel exchanges Transformer Engine does not run, the
DeepEP dispatcher with experts padded to capacity, and what Megatron-LM refuses beside PyTorch FSDP2. Other jobs
(TorchTitan's torch attention and dispatch, native and HF scenarios) have the exchange's name and its own arithmetic
checked (the hierarchical levels, Ulysses' whole heads per cp rank)."""

from __future__ import annotations

import math
from collections.abc import Callable

from projection.specs.model import ModelSpec
from projection.specs.plan import ParallelPlan
from projection.specs.scenario import RawScenario, runs_megatron
from projection.specs.training import Fp8Spec, TrainingSpec

CP_KINDS = ("p2p", "all_gather", "a2a", "a2a+p2p")  # megatron/core/transformer/transformer_config.py cp_comm_type


def kernel_problems(raw: RawScenario, model: ModelSpec, training: TrainingSpec, plan: ParallelPlan,
                    bad: Callable[[str, str, str], None]) -> None:
    kinds = plan.cp_comm.split()
    unknown = [k for k in kinds if k not in CP_KINDS]
    if unknown and plan.cp > 1:  # Megatron-Core and TE read the exchange only under context parallelism
        # TE attn_forward_func_with_cp: "Unsupported communication type"
        bad("plan.cp_comm", f"unknown context-parallel exchange {', '.join(unknown)} (Transformer Engine raises "
            "'Unsupported communication type')", f"use one of {', '.join(CP_KINDS)}")
    if len(kinds) > 1 and len(kinds) != model.num_layers and plan.cp > 1:
        # transformer_config.py __post_init__: a list of cp_comm_type has one entry per layer
        bad("plan.cp_comm", f"{len(kinds)} context-parallel exchange types for {model.num_layers} layers "
            "(Megatron-Core wants one type, or one per layer)", "give one type, or one per layer")
    elif len(kinds) > 1 and plan.cp > 1 and runs_megatron(raw.framework):
        # Megatron-Core 0.16.1 transformer_layer.py takes cp_comm_type[self.layer_number], the 1-based layer number:
        # layer i runs entry i + 1, and the last layer's index is past the list's end (an IndexError at start-up)
        bad("plan.cp_comm", f"a list of {len(kinds)} context-parallel exchange types: Megatron-Core indexes it by "
            "the 1-based layer number (TransformerLayer: cp_comm_type[self.layer_number]), so the last layer's "
            "entry is out of range and the job stops at start-up", "give one type for every layer")
    levels = plan.cp_hierarchy
    if levels is not None and math.prod(levels) != plan.cp:
        # megatron/training/arguments.py validate_args and parallel_state.py: the product of the levels is cp
        # two levels of 2 or more where cp has them (an all-to-all group of at most 8, one node)
        inner = max((d for d in range(2, min(plan.cp - 1, 8) + 1) if plan.cp % d == 0), default=plan.cp)
        bad("plan.cp_hierarchy", f"hierarchical context-parallel sizes {list(levels)} multiply to "
            f"{math.prod(levels)}, not cp = {plan.cp} (Megatron asserts they equal)",
            f"give sizes whose product is {plan.cp}, e.g. [{inner}, {plan.cp // inner}]")
    if plan.cp > 1 and "a2a+p2p" in kinds:
        _hierarchical(model, plan, bad)  # TE's rules, whoever names the exchange
    if plan.cp > 1 and "a2a" in kinds:
        _ulysses_heads(model, plan, bad)  # the exchange's own arithmetic, whoever names it
    if training.fp8 is not None and (training.fp8.bf16_first_layers or training.fp8.bf16_last_layers):
        _bf16_layers(model, training.fp8, plan, bad)
    if not runs_megatron(raw.framework):  # Transformer Engine's and Megatron-Core's rules
        return
    if plan.cp > 1:
        _cp(model, training, plan, kinds, bad)
    if raw.framework == "megatron" and plan.sharding.fsdp == "torch_fsdp2":
        _fsdp2(model, training, plan, bad)
    k = training.kernels
    if model.moe is not None and k.moe_token_dispatcher == "flex" and k.moe_flex_backend == "deepep" \
            and model.moe.pad_to_capacity:
        # megatron/core/transformer/transformer_config.py __post_init__: DeepEP does not pad experts to capacity
        bad("model.moe.pad_to_capacity", "the flex dispatcher's DeepEP backend with experts padded to their capacity "
            "(Megatron-Core TransformerConfig refuses it)", "drop --moe-pad-expert-input-to-capacity, or use "
            "--moe-flex-dispatcher-backend hybridep or the alltoall dispatcher")


def _fsdp2(model: ModelSpec, training: TrainingSpec, plan: ParallelPlan,
           bad: Callable[[str, str, str], None]) -> None:
    """megatron/training/arguments.py validate_args under --use-torch-fsdp2 (Megatron-LM's own launches; Primus wraps
    FSDP2 in its own class, Megatron-Bridge its own checks)."""
    for ok, key, what, fix in (
            (plan.pp == 1, "plan.pp", "pipeline parallelism", "use --pipeline-model-parallel-size 1"),
            (plan.ep == 1, "plan.ep", "expert parallelism", "use --expert-model-parallel-size 1"),
            (not training.gradient_accumulation_fusion, "training.gradient_accumulation_fusion",
             "gradient accumulation fusion (on by default)", "add --no-gradient-accumulation-fusion"),
            (not model.tie_embeddings, "model.tie_embeddings", "tied embeddings (the default)",
             "add --untie-embeddings-and-output-weights"),
            (training.params_dtype != "fp16", "training.params_dtype", "fp16", "train in bf16")):
        if not ok:
            bad(key, f"--use-torch-fsdp2 is not supported with {what} (Megatron-LM validate_args)", fix)


def _cp(model: ModelSpec, training: TrainingSpec, plan: ParallelPlan, kinds: list[str],
        bad: Callable[[str, str, str], None]) -> None:
    if training.kernels.transformer_impl == "local" or training.attention_backend == "unfused":
        # megatron/core/transformer/dot_product_attention.py: "Context parallelism is only supported by
        # TEDotProductAttention!"; TE disables its unfused backend under context parallelism
        bad("plan.cp", f"context parallelism (cp = {plan.cp}) needs Transformer Engine's fused or flash attention "
            "(Megatron's own attention and TE's unfused one do not run it)",
            "use --transformer-impl transformer_engine with a fused or flash attention backend, or cp 1")
    if model.sliding_window and ("p2p" in kinds or "a2a+p2p" in kinds):
        # TE attn_forward_func_with_cp: sliding window attention only with cp_comm_type a2a or all_gather
        bad("plan.cp_comm", "a sliding window with the p2p context-parallel ring (Transformer Engine runs sliding "
            "windows under context parallelism with a2a or all_gather only)", "use --cp-comm-type a2a or all_gather")


def _ulysses_heads(model: ModelSpec, plan: ParallelPlan, bad: Callable[[str, str, str], None]) -> None:
    """The Ulysses all-to-all (a2a) gives each cp rank whole heads of its TP rank's, the full sequence of
    heads / cp of them (Jacobs et al. 2023, DeepSpeed-Ulysses), so cp must divide the heads and the KV heads a TP
    rank holds; TE AttnFuncWithCPAndQKVOA2A asserts it ("The number of attention heads needs to be divisible by CP
    size!")."""
    heads = model.num_attention_heads // plan.tp
    kv = heads if model.mla is not None else max(1, model.kv_heads // plan.tp)
    if heads % plan.cp or kv % plan.cp:
        bad("plan.cp_comm", f"the Ulysses all-to-all (a2a) splits heads over cp = {plan.cp}: a tensor-parallel "
            f"rank holds {heads} heads and {kv} KV heads, and each cp rank needs whole ones of both (Transformer "
            "Engine asserts both divide by cp)", "use p2p or all_gather, or a cp that divides the heads and KV "
            "heads of a TP rank")


def _bf16_layers(model: ModelSpec, fp8: Fp8Spec, plan: ParallelPlan, bad: Callable[[str, str, str], None]) -> None:
    """Megatron-Core's first/last layers in bf16 (TransformerConfig.__post_init__ under fp8): not with delayed
    scaling ("Delayed scaling does not support first / last layer in BF16."), each count in [0, num_layers / pp];
    and only Transformer Engine (or Primus-Turbo under Primus's fp8 context) runs layers outside the fp8 context:
    torchao converts modules, not layers."""
    if fp8.recipe == "delayed":
        bad("training.fp8.bf16_first_layers", "bf16 first/last layers with delayed scaling (Megatron-Core refuses "
            "it: 'Delayed scaling does not support first / last layer in BF16.')",
            "use a tensorwise, mxfp8 or blockwise recipe, or drop the bf16 first/last layers")
    if fp8.library == "torchao":
        bad("training.fp8.bf16_first_layers", "bf16 first/last layers are Megatron-Core's (its per-layer fp8 "
            "context); torchao converts modules, so a TorchTitan job keeps them through its filter_fqns",
            "drop bf16_first_layers / bf16_last_layers")
    most = model.num_layers // plan.pp
    for key, n in (("bf16_first_layers", fp8.bf16_first_layers), ("bf16_last_layers", fp8.bf16_last_layers)):
        if n > most:
            bad(f"training.fp8.{key}", f"{n} bf16 layers: Megatron-Core wants 0 to num_layers / pp = "
                f"{model.num_layers} / {plan.pp} = {most}", f"give 0 to {most}")


def _hierarchical(model: ModelSpec, plan: ParallelPlan, bad: Callable[[str, str, str], None]) -> None:
    """a2a+p2p (TE AttnFuncWithCPAndKVP2P over cp_group = [a2a group, p2p group]): Megatron asserts the sizes are
    given ("--hierarchical-context-parallel-sizes must be set when a2a+p2p is used in cp comm"), TE that there are
    two levels ("CP implementation a2a+p2p requires cp_group = [a2a_cp_group, p2p_cp_group]!"), and its all-to-all
    views each TP rank's heads and KV heads as [a, heads / a] (a reshape error where a does not divide them)."""
    levels = plan.cp_hierarchy
    if levels is None:
        bad("plan.cp_comm", "a2a+p2p needs the hierarchical context-parallel sizes (Megatron asserts "
            "--hierarchical-context-parallel-sizes is set)", "give --hierarchical-context-parallel-sizes A B with "
            f"A * B = cp = {plan.cp} (A: the all-to-all group, B: the p2p ring)")
        return
    if len(levels) != 2:
        bad("plan.cp_hierarchy", f"a2a+p2p runs two levels, an all-to-all group and a p2p ring; {len(levels)} sizes "
            f"given (Transformer Engine asserts cp_group = [a2a_cp_group, p2p_cp_group])",
            "give two sizes: the all-to-all group, then the p2p ring")
        return
    heads = model.num_attention_heads // plan.tp
    kv = heads if model.mla is not None else max(1, model.kv_heads // plan.tp)
    if heads % levels[0] or kv % levels[0]:
        bad("plan.cp_hierarchy", f"a2a+p2p's all-to-all splits heads over its group of {levels[0]}: a tensor-parallel "
            f"rank holds {heads} heads and {kv} KV heads (Transformer Engine's reshape needs both to divide)",
            "use an all-to-all group size that divides the heads and KV heads of a TP rank")
