"""Worker for tests/oracle/test_memory_megatron_core_layers.py: builds one real Megatron-Core decoder layer (local
spec, no Transformer Engine) on the CPU, runs its forward once in fp32 under a dispatch mode that keeps a weak
reference to the storage of every tensor an op creates, and prints, as JSON, the storages still alive afterwards.
MODEL_CASES do the same for a whole one-layer GPTModel run with labels (embeddings, final norm, output layer and
Megatron's vocab_parallel_cross_entropy besides the layer).

Run in a fresh interpreter (`python3 -m tests.oracle.megatron_core_layers CASE...`): it initializes a one-rank gloo
group and Megatron's parallel state and patches process-wide CUDA-only calls, none of which may leak into the pytest
process. The CPU setup replicates `setup_megatron_cpu` / `_megatron` of benchmarks/bench_megatron_host.py (not
imported: benchmarks/ is no test dependency): `torch.cuda.current_device` returns "cpu" (the global memory buffer's
device), the CUDA RNG tracker's fork is a null context, an explicit causal mask is passed (the default mask is built
on the GPU), and moe_utils.te_general_gemm is set to None (referenced without Transformer Engine installed). Beyond
the benchmark, the alltoall dispatcher's CUDA side stream for the device-to-host copies of its split sizes is bypassed
(those copies are no-ops on the CPU).

Dropout: on the CPU, `F.dropout` decomposes into bernoulli_ / div_ / mul and keeps an activation-dtype noise tensor;
on a GPU it is the fused `native_dropout`, which keeps a 1-byte bool mask. The worker routes `F.dropout` to
`torch.native_dropout` (it has a CPU kernel and the same autograd formula), so the measurement keeps what the GPU
keeps.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import os
import sys
import tempfile
import weakref
from pathlib import Path
from typing import Any

HIDDEN, HEADS, FFN, SEQ, MICRO_BATCH = 256, 8, 1024, 256, 2
MOE = (8, 2, 128)  # experts, top-k, expert FFN

# name -> settings: moe (else dense), dispatcher, load balancing ("lb"), experts / topk / ffn (default MOE's),
# dropout (hidden and attention), gated (SwiGLU with no biases, else GeLU with Megatron's default biases on dense
# layers, none on MoE layers), fusion (bias_activation_fusion; default: Megatron-LM's default, on, where Megatron
# allows it: its GeLU fusion needs the fc1 bias, so the GeLU experts run unfused)
CASES: dict[str, dict[str, Any]] = {
    "dense": {"moe": False, "dropout": 0.0, "gated": False},
    "dense-drop0.1": {"moe": False, "dropout": 0.1, "gated": False},
    "dense-swiglu": {"moe": False, "dropout": 0.0, "gated": True},
    "moe-allgather": {"moe": True, "dispatcher": "allgather", "lb": "none", "dropout": 0.0},
    "moe-allgather-aux": {"moe": True, "dispatcher": "allgather", "lb": "aux_loss", "dropout": 0.0},
    "moe-allgather-drop0.1": {"moe": True, "dispatcher": "allgather", "lb": "none", "dropout": 0.1},
    "moe-alltoall": {"moe": True, "dispatcher": "alltoall", "lb": "none", "dropout": 0.0},
    "moe-alltoall-aux": {"moe": True, "dispatcher": "alltoall", "lb": "aux_loss", "dropout": 0.0},
    "moe-swiglu-allgather": {"moe": True, "dispatcher": "allgather", "lb": "none", "dropout": 0.0, "gated": True},
    "moe-swiglu-alltoall-aux": {"moe": True, "dispatcher": "alltoall", "lb": "aux_loss", "dropout": 0.0,
                                "gated": True},
    # the Megatron functional tests' MoE layer (gpt3_mcore_tp2_pp2_ep2_te_4experts2parallel: local spec, unfused
    # attention, 4 experts, GeLU with --disable-bias-linear --no-bias-gelu-fusion, expert FFN = FFN (4 h), sinkhorn
    # top-1, the allgather dispatcher, dropout 0.1, all Megatron's defaults there) at tp = ep = 1
    "moe-functional-test": {"moe": True, "dispatcher": "allgather", "lb": "sinkhorn", "experts": 4, "topk": 1,
                            "ffn": FFN, "dropout": 0.1},
    # GQA (2 query groups): DotProductAttention repeats K and V to the query heads
    "gqa-swiglu": {"moe": False, "dropout": 0.0, "gated": True, "groups": 2},
}
# Tensor-parallel layers, one gloo process per TP rank (`main_tp`), with fewer query groups than TP ranks (Megatron
# all-gathers linear_qkv's output over TP: attention.py get_query_key_value_tensors), and with sequence parallelism.
TP_CASES: dict[str, dict[str, Any]] = {
    "gqa-g2-tp4": {"moe": False, "dropout": 0.0, "gated": True, "groups": 2, "tp": 4},
    "mqa-tp2": {"moe": False, "dropout": 0.0, "gated": True, "groups": 1, "tp": 2},
    # sequence parallelism (`_SPLayerNorm` in place of the local spec's norm, which refuses it only because its
    # weight gradients would need Megatron's TP all-reduce after the step: nothing in one layer's forward/backward)
    "gpt-tp2-sp": {"moe": False, "dropout": 0.0, "gated": False, "tp": 2, "sp": True},
    "gqa-g4-tp2-sp": {"moe": False, "dropout": 0.0, "gated": True, "groups": 4, "tp": 2, "sp": True},
}


def _setup(rank: int = 0, world: int = 1) -> Any:
    """A gloo group of `world` ranks (tensor parallel over all) and Megatron's parallel state on the CPU
    (bench_megatron_host.py setup_megatron_cpu)."""
    import torch

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29541")  # the test passes a free port
    torch.set_num_threads(4 if world == 1 else 1)
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment,return-value]
    from megatron.core import parallel_state, tensor_parallel

    parallel_state.initialize_model_parallel(world, 1)
    tensor_parallel.get_cuda_rng_tracker().fork = lambda *a, **k: contextlib.nullcontext()
    import megatron.core.transformer.moe.moe_utils as moe_utils

    moe_utils.te_general_gemm = None
    # the alltoall dispatcher's device-to-host copies of its split sizes run on a CUDA side stream; on the CPU
    # they are no-ops (maybe_move_tensor_to_cpu returns CPU tensors as they are), so only the stream is bypassed
    from megatron.core.transformer.moe.token_dispatcher import MoEAlltoAllTokenDispatcher as A2A

    A2A.cuda_dtoh_stream = object()
    A2A._maybe_dtoh_and_synchronize = lambda self, point, tokens_per_expert=None: tokens_per_expert
    import torch.nn.functional as F

    def native_dropout(input: Any, p: float = 0.5, training: bool = True, inplace: bool = False) -> Any:
        if not training or p == 0.0:
            return input  # aten::dropout returns its input as is then, on every device
        return torch.native_dropout(input, p, training)[0]

    F.dropout = native_dropout  # nn.Dropout calls F.dropout through the module attribute
    return torch


def _layer(torch: Any, case: dict[str, Any]) -> Any:
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.spec_utils import build_module
    from megatron.core.transformer.transformer_config import TransformerConfig

    extra: dict[str, Any] = {}
    if case["moe"]:
        extra = {"num_moe_experts": case.get("experts", MOE[0]), "moe_router_topk": case.get("topk", MOE[1]),
                 "moe_ffn_hidden_size": case.get("ffn", MOE[2]),
                 "moe_token_dispatcher_type": case["dispatcher"], "moe_router_load_balancing_type": case["lb"],
                 "add_bias_linear": False, "moe_grouped_gemm": False}
        if case["lb"] == "aux_loss":
            extra["moe_aux_loss_coeff"] = 1e-2
    gated = case.get("gated", False)
    fusion = case.get("fusion", gated or not case["moe"])
    assert not (fusion and case["moe"] and not gated), "Megatron fuses GeLU only with a bias"
    if gated:
        # LayerNorm kept: torch's RMSNorm decomposes on the CPU (it keeps the normalized x besides the input) where
        # the GPU runs the fused _fused_rms_norm, which keeps the input and rstd, as LayerNorm does on both
        extra.update(gated_linear_unit=True, activation_func=torch.nn.functional.silu, add_bias_linear=False)
    cfg = TransformerConfig(num_layers=1, hidden_size=HIDDEN, num_attention_heads=HEADS, ffn_hidden_size=FFN,
                            use_cpu_initialization=True, hidden_dropout=case["dropout"],
                            attention_dropout=case["dropout"], params_dtype=torch.float32,
                            gradient_accumulation_fusion=False, bias_activation_fusion=fusion,
                            num_query_groups=case.get("groups"), tensor_model_parallel_size=case.get("tp", 1),
                            sequence_parallel=case.get("sp", False), **extra)
    spec = get_gpt_layer_local_spec(num_experts=extra.get("num_moe_experts"), moe_grouped_gemm=False)
    if case.get("sp"):
        norm = _sp_layer_norm(torch)
        spec = dataclasses.replace(spec, submodules=dataclasses.replace(spec.submodules, input_layernorm=norm,
                                                                        pre_mlp_layernorm=norm))
    return build_module(spec, config=cfg, layer_number=1)


def _sp_layer_norm(torch: Any) -> type:
    """torch's LayerNorm built as a Megatron norm module (config, hidden_size, eps), over a sequence-parallel shard."""

    class SPLayerNorm(torch.nn.LayerNorm):  # type: ignore[misc,name-defined]
        def __init__(self, config: Any, hidden_size: int, eps: float = 1e-5, **_: Any) -> None:
            super().__init__(hidden_size, eps=eps)

    return SPLayerNorm


def _alive_mode(torch: Any) -> Any:
    """A dispatch mode keeping a weak reference to the storage of every tensor an op creates (and the tensor bytes
    of every c10d collective)."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    class Alive(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.refs: list[tuple[Any, str, list[int], str]] = []
            self.collectives: list[tuple[str, list[int]]] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            out = func(*args, **(kwargs or {}))
            if func.namespace == "c10d":  # a collective: the bytes of its tensor arguments (output, input)
                self.collectives.append((str(func), [t.nbytes for t in tree_flatten(args)[0]
                                                     if isinstance(t, torch.Tensor)]))
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor):
                    self.refs.append((weakref.ref(t.untyped_storage()), str(func), list(t.shape), str(t.dtype)))
            return out

    return Alive()


def _alive(mode: Any) -> dict[int, dict[str, Any]]:
    """Storage -> the op that created it (the first op returning it), for the storages still alive."""
    gc.collect()
    first: dict[int, dict[str, Any]] = {}
    for ref, op, shape, dtype in mode.refs:
        st = ref()
        if st is not None and st._cdata not in first:
            first[st._cdata] = {"op": op, "shape": shape, "dtype": dtype, "bytes": st.nbytes()}
    return first


def measure(torch: Any, name: str, cases: dict[str, dict[str, Any]] = CASES) -> dict[str, Any]:
    from megatron.core import parallel_state

    case = cases[name]
    torch.manual_seed(0)
    layer = _layer(torch, case)
    layer.train()
    rows = SEQ // case["tp"] if case.get("sp") else SEQ  # sequence parallelism: this rank's shard of the sequence
    x = torch.randn(rows, MICRO_BATCH, HIDDEN, requires_grad=True)  # [s, b, h]
    mask = torch.triu(torch.ones(SEQ, SEQ), diagonal=1).bool()[None, None]
    mode = _alive_mode(torch)
    with mode:
        y, _ = layer(x, attention_mask=mask)
    if torch.distributed.get_world_size() > 1:
        # a collective's work object can hold its tensors a moment after the call returns (a full CI run once
        # counted a row-parallel output, 0.5 MiB, alive on one rank): every rank past its collectives, then collected
        torch.distributed.barrier()
    first = _alive(mode)
    excluded = [y, x, mask, *layer.parameters(), *layer.buffers()]
    # persistent buffers, not per microbatch: Megatron's global memory buffer (baddbmm's beta=0 input)
    excluded += list(parallel_state.get_global_memory_buffer().buffer.values())
    dropped = []
    for t in excluded:
        d = first.pop(t.untyped_storage()._cdata, None)
        if d is not None and t is not y and t is not x:
            dropped.append(d)
    kept = list(first.values())
    total = sum(d["bytes"] for d in kept) + x.untyped_storage().nbytes()
    forward_collectives, mode.collectives = mode.collectives, []
    with mode:
        y.sum().backward()  # the layer is a real, differentiable one
    assert x.grad is not None
    out = {"bytes": total, "input": x.untyped_storage().nbytes(), "tensors": kept, "excluded_buffers": dropped}
    if "tp" in case:
        out.update(collectives={"F": forward_collectives, "B": mode.collectives},
                   params=sum(p.numel() for p in layer.parameters()),
                   qkv_weight=list(layer.self_attention.linear_qkv.weight.shape), flop=_flops(torch, layer, x, mask))
    return out


def _flops(torch: Any, layer: Any, x: Any, mask: Any) -> dict[str, int]:
    """FlopCounterMode's totals of one more forward and backward of the layer (mm, baddbmm, bmm)."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as fwd:
        y, _ = layer(x, attention_mask=mask)
    with FlopCounterMode(display=False) as bwd:
        y.sum().backward()
    return {"F": fwd.get_total_flops(), "B": bwd.get_total_flops()}


# Whole GPTModels of one local-spec layer (learned positions, untied output layer, Megatron's unfused
# vocab_parallel_cross_entropy), for the first and last stage's own tensors: the embedding's and the loss's
MODEL_VOCAB = 1280  # a multiple of 128 (Megatron pads to it), unlike FFN: the logits are told by their shape
MODEL_CASES: dict[str, dict[str, Any]] = {
    "gpt": {"moe": False, "dropout": 0.0, "gated": False, "layer": "dense"},  # layer: its layer's own case
    "gpt-drop0.1": {"moe": False, "dropout": 0.1, "gated": False, "layer": "dense-drop0.1"},
}


def measure_model(torch: Any, name: str) -> dict[str, Any]:
    """Bytes a one-layer GPTModel keeps for its backward after a training forward with labels (the loss): the
    storages alive once the caller has dropped its token ids, position ids and labels (made under the mode, so those
    the embeddings and the loss save are counted), less parameters, buffers, the loss itself, the attention mask and
    Megatron's global memory buffer."""
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig

    case = MODEL_CASES[name]
    torch.manual_seed(0)
    cfg = TransformerConfig(num_layers=1, hidden_size=HIDDEN, num_attention_heads=HEADS, ffn_hidden_size=FFN,
                            use_cpu_initialization=True, hidden_dropout=case["dropout"],
                            attention_dropout=case["dropout"], params_dtype=torch.float32,
                            gradient_accumulation_fusion=False, bias_activation_fusion=True)
    model = GPTModel(cfg, get_gpt_layer_local_spec(), vocab_size=MODEL_VOCAB, max_sequence_length=SEQ,
                     position_embedding_type="learned_absolute", share_embeddings_and_output_weights=False)
    model.train()
    mask = torch.triu(torch.ones(SEQ, SEQ), diagonal=1).bool()[None, None]
    mode = _alive_mode(torch)
    with mode:
        ids = torch.randint(0, MODEL_VOCAB, (MICRO_BATCH, SEQ))
        labels = torch.randint(0, MODEL_VOCAB, (MICRO_BATCH, SEQ))
        positions = torch.arange(SEQ).expand(MICRO_BATCH, SEQ).contiguous()
        loss = model(ids, positions, mask, labels=labels)
    del ids, labels, positions
    first = _alive(mode)
    excluded = [loss, mask, *model.parameters(), *model.buffers(),
                *parallel_state.get_global_memory_buffer().buffer.values()]
    for t in excluded:
        first.pop(t.untyped_storage()._cdata, None)
    kept = list(first.values())
    loss.sum().backward()  # the model is a real, differentiable one
    return {"bytes": sum(d["bytes"] for d in kept), "tensors": kept}


def _tp_rank(rank: int, world: int, port: int, names: list[str], out: str) -> None:
    """One spawned TP rank of `main_tp`: measure TP cases `names` (all of tp `world`) in turn, each written as JSON
    to `out/<name>.<rank>`. The cases share one process group and Megatron's parallel state (set up once: the
    spawns and imports are most of the time); each builds its own layer."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch = _setup(rank, world)
    try:
        for name in names:
            Path(f"{out}/{name}.{rank}").write_text(json.dumps(measure(torch, name, TP_CASES)))
            torch.distributed.barrier()
    finally:
        torch.distributed.destroy_process_group()


def main_tp(names: list[str]) -> None:
    """The TP cases, those of one tp together on `tp` spawned gloo processes; prints every rank's measurement."""
    import torch
    import torch.multiprocessing as mp

    from projection.calibrate.bench_collective import free_port

    out: dict[str, Any] = {"torch": torch.__version__, "cases": {}}
    by_world: dict[int, list[str]] = {}
    for n in names:
        by_world.setdefault(TP_CASES[n]["tp"], []).append(n)
    with tempfile.TemporaryDirectory() as tmp:
        for world, group in by_world.items():
            mp.start_processes(_tp_rank, args=(world, free_port(), group, tmp), nprocs=world, start_method="spawn")
        for n in names:
            out["cases"][n] = [json.loads(Path(f"{tmp}/{n}.{r}").read_text()) for r in range(TP_CASES[n]["tp"])]
    print("@@JSON@@" + json.dumps(out))


def main(names: list[str]) -> None:
    torch = _setup()
    import megatron.core

    out = {"megatron_core": megatron.core.__version__, "torch": torch.__version__,
           "cases": {n: measure_model(torch, n) if n in MODEL_CASES else measure(torch, n) for n in names}}
    print("@@JSON@@" + json.dumps(out))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--tp"]:
        main_tp(sys.argv[2:] or list(TP_CASES))
    else:
        main(sys.argv[1:] or list(CASES))
