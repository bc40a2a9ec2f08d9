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
