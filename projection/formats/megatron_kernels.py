"""Megatron-LM flags that choose kernels and code paths without changing the model: the attention backend, and
CUDA-graph capture (recorded, not modelled: the performance notes say so)."""

from __future__ import annotations

from projection.formats.megatron_args import to_list
from projection.formats.megatron_model import MegatronArgs
from projection.specs.scenario import Origin, RawScenario


def cuda_graphs(a: MegatronArgs, raw: RawScenario) -> None:
    """CUDA-graph capture (not modelled; the performance notes say so): --cuda-graph-impl, or the deprecated
    --enable-cuda-graph (local) and --external-cuda-graph (transformer_engine) that Megatron-Core maps onto it
    (TransformerConfig.__post_init__)."""
    impl = str(a.get("cuda_graph_impl") or "none")
    dest = "cuda_graph_impl"
    if impl == "none" and a.get("enable_cuda_graph"):
        impl, dest = "local", "enable_cuda_graph"
    elif impl == "none" and a.get("external_cuda_graph"):
        impl, dest = "transformer_engine", "external_cuda_graph"
    if impl not in ("none", "local", "transformer_engine"):
        a.problem("cuda_graph_impl", f"unknown CUDA graph implementation {impl!r}", "use none, local or "
                  "transformer_engine")
        return
    raw.set("training.kernels.cuda_graph_impl", impl, a.origin(dest))
    scope = a.get("cuda_graph_scope")
    if impl != "none" and scope is not None:
        # "full" is the whole layer, as an empty list is (Megatron-Core turns it into [])
        raw.set("training.kernels.cuda_graph_scope", tuple(s for s in to_list(scope) if s != "full"),
                a.origin("cuda_graph_scope"))


def attention_backend(a: MegatronArgs) -> tuple[str, Origin]:
    backend = a.get("attention_backend")
    if backend != "auto":
        return ("unfused" if backend == "local" else backend), a.origin("attention_backend")
    if a.get("use_flash_attn"):  # older flag: flash attention; an explicit 'auto' (Primus's default) does not hide it
        return "flash", a.origin("use_flash_attn")
    if a.get("transformer_impl") == "local":  # Megatron's own DotProductAttention stores the score matrix
        return "unfused", a.origin("transformer_impl")
    return "auto", a.origin("attention_backend")


def unmodelled_options(a: MegatronArgs, raw: RawScenario) -> None:
    """Options the job sets that projection reads but prices as their defaults (training.kernels.unmodelled, said
    in the performance notes): Megatron's fused kernels turned off (each then runs as several kernels; priced
    fused), and MoE overlaps that are not priced. Unfused RoPE is priced as Megatron-Core runs it
    (training.kernels.rope_fusion)."""
    out: list[tuple[str, str]] = []  # (dest, what it is priced as)
    rope = a.get("position_embedding_type") == "rope" or a.get("use_rotary_position_embeddings")
    if rope and a.get("apply_rope_fusion") is False:  # priced: Megatron-Core's unfused chain (ops_eager)
        raw.set("training.kernels.rope_fusion", False, a.origin("apply_rope_fusion"))
    act = "bias_swiglu_fusion" if a.get("swiglu") else "bias_gelu_fusion"
    off = next((d for d in (act, "bias_activation_fusion") if a.given(d) and a.get(d) is False), None)
    if off is not None:  # priced: Megatron-Core's unfused chain (ops_eager.megatron_activation)
        raw.set("training.kernels.bias_activation_fusion", False, a.origin(off))
    if a.get("bias_dropout_fusion") is False:
        out.append(("bias_dropout_fusion", "bias, dropout and residual add priced as one fused kernel"))
    if a.get("masked_softmax_fusion") is False and a.get("transformer_impl") == "local":
        out.append(("masked_softmax_fusion", "the unfused attention's scale, mask and softmax priced as one fused "
                    "kernel"))
    if a.get("moe_shared_expert_overlap") and a.get("num_experts"):
        out.append(("moe_shared_expert_overlap", "the shared experts priced in sequence with the token dispatch, not "
                    "overlapped with it"))
    if a.get("delay_wgrad_compute"):
        out.append(("delay_wgrad_compute", "weight gradients priced where they run without it"))
    if out:
        raw.set("training.kernels.unmodelled", tuple(f"{a.key(d)} ({text})" for d, text in out), a.origin(out[0][0]))
