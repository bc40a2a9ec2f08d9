"""Host (CPU) time of Megatron-Core's own GPT layer, forward and backward, against the eager Hugging Face layer the
device YAMLs' `host_kernel_issue_s` was measured on: the framework host factor of calibrations/framework_host.json.

Run: pip install megatron-core   (not a dependency of projection; transformers comes with the test extras)
     python3 benchmarks/bench_megatron_host.py [--layers 1 3] [--rounds 15] [--per-round 30]
                                               [--out calibrations/framework_host.json]

Why: `host_kernel_issue_s` (31.6 us on the H100, 27.4 us on the MI300X) is a Hugging Face Qwen2 forward's host time
per kernel, read from a TraceLens profiler trace. Megatron's modules do more Python per kernel than that (their
layer is a handful of large custom modules, autograd functions and hooks). Both are measured here, on the same
host, at shapes so small that the time is host work (Python, dispatch, tiny CPU kernels); the CPU's speed cancels
out of their ratio, which is then applied to the trace's per-kernel figure.

* Reference: transformers' Qwen2ForCausalLM (the trace's architecture), eval, forward in inference mode, SDPA
  attention, hidden 64, 4 heads, FFN 256, timed inside a torch.profiler session with the trace's settings
  (record_shapes, profile_memory, with_stack, with_flops, with_modules: its metadata), since the 31.6 us carries that
  profiling overhead. Host seconds per kernel = seconds per layer / aten ops per layer that launch a kernel (views,
  reshapes and allocations excluded), counted with a TorchDispatchMode.
* Megatron: Megatron-Core's GPT layer, local spec (Transformer Engine needs a GPU), fp32, hidden 64, 4 heads,
  sequence 16, batch 1, dropout off, no gradient-accumulation fusion, one process (gloo). Three CUDA-only calls of
  the local path are bypassed for the CPU (the memory buffer's device, the CUDA RNG tracker's fork, the default
  causal mask: an explicit mask is passed). Host seconds per modelled kernel = seconds per layer / the kernels
  projection's own op list issues for that layer (the local spec's unfused attention; forward; backward with its
  gradient hooks).
* Per layer = (time at the deeper model - time at the shallower) / layer difference, so embeddings and the output
  layer cancel out (no loss: its scalar all-reduces would add gloo waits). The four models take turns, `--per-round`
  calls each per round, and each keeps its lowest round median over `--rounds` rounds, so the machine's load falls
  on all four alike.

Factor (forward, backward) = Megatron host seconds per modelled kernel / reference host seconds per kernel.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

# aten ops that launch no kernel on a GPU: views, reshapes, allocations, metadata
NO_KERNEL = {"view", "_unsafe_view", "t", "transpose", "expand", "expand_as", "reshape", "detach", "alias",
             "as_strided", "split", "split_with_sizes", "unsafe_split", "chunk", "narrow", "slice", "select",
             "unsqueeze", "squeeze", "permute", "unbind", "view_as", "lift_fresh", "_reshape_alias", "empty",
             "empty_like", "empty_strided", "new_empty", "new_empty_strided", "_local_scalar_dense", "is_same_size",
             "contiguous", "sym_size", "sym_stride", "sym_numel", "sym_storage_offset"}
HIDDEN, HEADS, FFN, SEQ, VOCAB = 64, 4, 256, 16, 128
MOE = (8, 2, 128)  # experts, top-k, expert FFN of the MoE cross-check


def setup_megatron_cpu() -> Any:
    """torch with one thread, a 1-rank gloo group and Megatron-Core's parallel state on the CPU (the CUDA-only calls
    of the local path bypassed); also used by benchmarks/host_transfer_check.py."""
    import torch

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", rank=0, world_size=1)
    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment,return-value]
    from megatron.core import parallel_state, tensor_parallel

    parallel_state.initialize_model_parallel(1, 1)
    tensor_parallel.get_cuda_rng_tracker().fork = lambda *a, **k: contextlib.nullcontext()
    return torch


def _megatron(torch: Any, layers: int, moe: bool = False) -> tuple[Callable[[], Any], Callable[[Any], None]]:
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig

    extra: dict[str, Any] = {}
    if moe:  # the CPU-runnable MoE path: allgather dispatcher, SequentialMLP, no biases, no load-balancing loss
        import megatron.core.transformer.moe.moe_utils as moe_utils

        moe_utils.te_general_gemm = None  # referenced without Transformer Engine installed
        extra = {"num_moe_experts": MOE[0], "moe_router_topk": MOE[1], "moe_ffn_hidden_size": MOE[2],
                 "moe_token_dispatcher_type": "allgather", "moe_router_load_balancing_type": "none",
                 "add_bias_linear": False}
    cfg = TransformerConfig(num_layers=layers, hidden_size=HIDDEN, num_attention_heads=HEADS, ffn_hidden_size=FFN,
                            use_cpu_initialization=True, hidden_dropout=0.0, attention_dropout=0.0,
                            params_dtype=torch.float32, gradient_accumulation_fusion=False, **extra)
    spec = get_gpt_layer_local_spec(num_experts=MOE[0], moe_grouped_gemm=False) if moe else get_gpt_layer_local_spec()
    model = GPTModel(config=cfg, transformer_layer_spec=spec, vocab_size=VOCAB, max_sequence_length=SEQ)
    ids = torch.randint(0, VOCAB, (1, SEQ))
    pos = torch.arange(SEQ).unsqueeze(0)
    mask = torch.triu(torch.ones(SEQ, SEQ), diagonal=1).bool()[None, None]
    # no labels: the vocab-parallel loss's scalar all-reduces (gloo here) would add their waits to both depths
    return (lambda: model(ids, pos, mask)), (lambda out: out.sum().backward())


def _reference(torch: Any, layers: int) -> Callable[[], Any]:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=layers, num_attention_heads=HEADS,
                      num_key_value_heads=HEADS, vocab_size=VOCAB, max_position_embeddings=SEQ,
                      attn_implementation="sdpa", use_cache=False)
    model = Qwen2ForCausalLM(cfg).eval()
    ids = torch.randint(0, VOCAB, (1, SEQ))

    def forward() -> Any:
        with torch.inference_mode():  # the trace's grad mode
            return model(ids)
    return forward


def _trace_profiler(torch: Any) -> Any:
    """A profiler session with the settings the TraceLens trace was taken with (its metadata: record_shapes,
    profile_memory, with_stack, with_flops, with_modules; CPU activity here), so the reference's host time per kernel
    carries the same profiling overhead as the 31.6 us it stands for."""
    from torch.profiler import ProfilerActivity, profile

    return profile(activities=[ProfilerActivity.CPU], record_shapes=True, profile_memory=True, with_stack=True,
                   with_flops=True, with_modules=True)


def _kernels(torch: Any, fn: Callable[[], Any]) -> int:
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            if func.overloadpacket.__name__ not in NO_KERNEL:
                Count.n += 1
            return func(*args, **(kwargs or {}))

    with Count():
        fn()
    return Count.n


def _timed(fn: Callable[[], Any], backward: Callable[[Any], None] | None, n: int) -> tuple[float, float]:
    """Median seconds of `fn` (and of `backward` on its output) over n calls."""
    f_times, b_times = [], []
    for _ in range(n):
        t0 = time.perf_counter()
        out = fn()
        t1 = time.perf_counter()
        if backward is not None:
            backward(out)
        b_times.append(time.perf_counter() - t1)
        f_times.append(t1 - t0)
    return statistics.median(f_times), statistics.median(b_times)


Run = tuple[Callable[[], Any], Callable[[Any], None] | None, Callable[[], Any] | None]  # fn, backward, session


def _round_robin(runs: dict[str, Run], rounds: int, per_round: int) -> dict[str, tuple[float, float]]:
    """Each run's (forward, backward) seconds: the runs take turns, `per_round` calls each per round (inside the
    run's session, e.g. a profiler, when it has one), so a change of the machine's load falls on all of them; the
    result is the lowest round median (the least disturbed)."""
    for fn, bwd, session in runs.values():  # warm-up
        with session() if session else contextlib.nullcontext():
            _timed(fn, bwd, 20)
    best = {name: (float("inf"), float("inf")) for name in runs}
    for _ in range(rounds):
        for name, (fn, bwd, session) in runs.items():
            with session() if session else contextlib.nullcontext():
                f, b = _timed(fn, bwd, per_round)
            best[name] = (min(best[name][0], f), min(best[name][1], b))
    return best


def modelled_kernels(layers: int, moe: bool = False) -> tuple[int, int]:
    """Kernels projection's op list issues for the benchmark's Megatron model (forward, backward with hooks)."""
    from projection.perf import default_cost_model
    from projection.perf.pricing import price_stages
    from projection.specs.hardware import load_device
    from projection.specs.scenario import Origin, RawScenario, build_scenario

    raw = RawScenario(source="bench_megatron_host", framework="megatron")
    here = Origin("bench_megatron_host.py")
    model = {"name": "bench", "num_layers": layers, "hidden_size": HIDDEN, "num_attention_heads": HEADS,
             "ffn_hidden_size": FFN, "gated_mlp": False, "activation": "gelu", "norm": "layernorm",
             "add_bias_linear": not moe, "add_qkv_bias": not moe, "position_embedding": "learned",
             "max_position_embeddings": SEQ, "tie_embeddings": True, "vocab_size": VOCAB}
    if moe:
        model["moe"] = {"num_experts": MOE[0], "top_k": MOE[1], "expert_ffn_hidden_size": MOE[2]}
    for k, v in model.items():
        raw.set(f"model.{k}", v, here)
    # the local spec's attention is Megatron's unfused DotProductAttention (as projection's Megatron loader reads it)
    for k, v in {"seq_length": SEQ, "micro_batch_size": 1, "global_batch_size": 1, "params_dtype": "fp32",
                 "gradient_accumulation_fusion": False, "check_for_nan_in_loss_and_grad": False,
                 "attention_backend": "unfused"}.items():
        raw.set(f"training.{k}", v, here)
    for k, v in {"transformer_impl": "local", "moe_token_dispatcher": "allgather", "moe_grouped_gemm": False}.items():
        raw.set(f"training.kernels.{k}", v, here)
    for k, v in {"hardware": "h100-sxm", "nodes": 1, "gpus_per_node": 1}.items():
        raw.set(f"cluster.{k}", v, here)
    sc = build_scenario(raw, load_device("h100-sxm"))
    stage = price_stages(sc, default_cost_model(sc)).stages[0]
    return stage.f.kernels, stage.b.kernels


def measure(layers: tuple[int, int], rounds: int, per_round: int) -> dict[str, Any]:
    torch = setup_megatron_cpu()
    lo, hi = layers
    n = hi - lo
    ref_lo, ref_hi = _reference(torch, lo), _reference(torch, hi)
    prof = (lambda: _trace_profiler(torch))  # noqa: E731
    t = _round_robin({"m_lo": (*_megatron(torch, lo), None), "m_hi": (*_megatron(torch, hi), None),
                      "r_lo": (ref_lo, None, prof), "r_hi": (ref_hi, None, prof),
                      "e_lo": (*_megatron(torch, lo, moe=True), None), "e_hi": (*_megatron(torch, hi, moe=True), None)},
                     rounds, per_round)
    mf, mb = (t["m_hi"][0] - t["m_lo"][0]) / n, (t["m_hi"][1] - t["m_lo"][1]) / n
    kf_lo, kb_lo = modelled_kernels(lo)
    kf_hi, kb_hi = modelled_kernels(hi)
    kf, kb = (kf_hi - kf_lo) / n, (kb_hi - kb_lo) / n
    rt = (t["r_hi"][0] - t["r_lo"][0]) / n
    rk = (_kernels(torch, ref_hi) - _kernels(torch, ref_lo)) / n
    ref_per_kernel = rt / rk
    # cross-check on an MoE layer (not used for the factor): its host seconds against what the dense factors give
    ef, eb = (t["e_hi"][0] - t["e_lo"][0]) / n, (t["e_hi"][1] - t["e_lo"][1]) / n
    ekf_lo, ekb_lo = modelled_kernels(lo, moe=True)
    ekf_hi, ekb_hi = modelled_kernels(hi, moe=True)
    ekf, ekb = (ekf_hi - ekf_lo) / n, (ekb_hi - ekb_lo) / n
    dense_f, dense_b = mf / kf / ref_per_kernel, mb / kb / ref_per_kernel
    moe_check = {"experts_topk_ffn": list(MOE), "layer_forward_s": ef, "layer_backward_s": eb,
                 "modelled_kernels_per_layer": {"forward": ekf, "backward": ekb},
                 "factor": {"forward": round(ef / ekf / ref_per_kernel, 3),
                            "backward": round(eb / ekb / ref_per_kernel, 3)},
                 "measured_over_dense_factors": round((ef + eb) / (ref_per_kernel * (dense_f * ekf + dense_b * ekb)),
                                                      3)}
    import megatron.core
    import transformers

    return {
        "megatron": {"forward": round(dense_f, 3), "backward": round(dense_b, 3)},
        "moe_check": moe_check,
        "measured": {
            "megatron_layer_forward_s": mf, "megatron_layer_backward_s": mb,
            "modelled_kernels_per_layer": {"forward": kf, "backward": kb},
            "reference_layer_forward_s": rt, "reference_kernels_per_layer": rk,
            "reference_s_per_kernel": ref_per_kernel},
        "provenance": {
            "command": "python3 benchmarks/bench_megatron_host.py " + " ".join(sys.argv[1:]),
            "date": datetime.date.today().isoformat(), "host": platform.processor() or platform.machine(),
            "python": platform.python_version(), "torch": torch.__version__,
            "megatron_core": megatron.core.__version__, "transformers": transformers.__version__,
            "layers": list(layers), "rounds": rounds, "calls_per_round": per_round},
    }


def main() -> int:
    ap = argparse.ArgumentParser(description="Framework host factor: Megatron-Core's layer against eager HF.")
    ap.add_argument("--layers", type=int, nargs=2, default=(1, 3))
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--per-round", type=int, default=30)
    ap.add_argument("--out", help="write the factors and measurements as JSON (calibrations/framework_host.json)")
    args = ap.parse_args()
    if args.layers[1] <= args.layers[0] or args.layers[0] < 1 or args.rounds < 1 or args.per_round < 1:
        print("error: --layers LO HI with 1 <= LO < HI, --rounds and --per-round >= 1", file=sys.stderr)
        return 2
    try:
        result = measure(tuple(args.layers), args.rounds, args.per_round)
    except ImportError as err:
        print(f"needs megatron-core and transformers ({err}); pip install megatron-core", file=sys.stderr)
        return 2
    m = result["measured"]
    print(f"Megatron-Core GPT layer (local spec, CPU): host {m['megatron_layer_forward_s'] * 1e3:.3f} ms forward, "
          f"{m['megatron_layer_backward_s'] * 1e3:.3f} ms backward per layer; "
          f"{m['modelled_kernels_per_layer']['forward']:.0f} + {m['modelled_kernels_per_layer']['backward']:.0f} "
          "modelled kernels")
    print(f"reference (HF Qwen2 layer forward, inference mode, under the trace's profiler settings): "
          f"{m['reference_layer_forward_s'] * 1e6:.0f} us over "
          f"{m['reference_kernels_per_layer']:.0f} kernels = {m['reference_s_per_kernel'] * 1e6:.2f} us per kernel")
    print(f"framework host factor, megatron: forward {result['megatron']['forward']:.2f}, "
          f"backward {result['megatron']['backward']:.2f}")
    e = result["moe_check"]
    print(f"cross-check, MoE layer ({e['experts_topk_ffn'][0]} experts, top-{e['experts_topk_ffn'][1]}): host "
          f"{e['layer_forward_s'] * 1e3:.3f} + {e['layer_backward_s'] * 1e3:.3f} ms over "
          f"{e['modelled_kernels_per_layer']['forward']:.0f} + {e['modelled_kernels_per_layer']['backward']:.0f} "
          f"modelled kernels = {e['measured_over_dense_factors']:.2f} x what the dense factors give")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
