"""The `Op` record and the primitives the per-layer op lists are built from (linears, memory-bound ops, collectives).

Conventions (stated once, used by every builder):
- GEMMs use the BLAS / hipBLASLt / cuBLAS column-major convention, the one hipblaslt-bench prints and
  projection/calibrate/calibration.py stores: D[m, n] = op(A)[m, k] op(B)[k, n], layout = transA + transB,
  FLOP = 2*m*n*k per batch entry (Narayanan et al. 2021, appendix: an m x k by k x n product takes 2mnk FLOPs).
  A `Linear` with weight W[out, in] on x[T, in] (PyTorch y = x W^T) is, for T tokens:
  forward                    (m, n, k) = (out, T, in), layout "TN";
  input gradient (phase I)   dx = dy W     -> (in, T, out), layout "NN";
  weight gradient (phase W)  dW = dy^T x   -> (in, out, T), layout "NT".
- Collective sizes (`coll_bytes`) follow nccl-tests' `size` column: the whole buffer one rank holds, i.e. the output
  of an all-gather, the input of a reduce-scatter, the buffer of an all-reduce, the send buffer of an all-to-all, and
  one message of a send/recv.
- Memory-bound ops carry bytes only (flop = 0): their arithmetic is not counted, as neither Megatron's model-FLOPs
  formula nor PyTorch's FlopCounterMode counts it. Those that stand for one library kernel name it in `fn`
  (`layernorm`, `rmsnorm`, an activation such as `gelu` or `silu_glu`, `cross_entropy`, `softmax`; the backward op
  is the same `fn` in phase I) with its shape: m = rows, n = row length of the output (a gated activation reads
  2n per row). A calibration can time that kernel at that shape (`projection calibrate memory --config`), which
  matters where such kernels are not bandwidth-bound (transcendentals on a CPU); the rest are priced by bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from projection.specs.model import ModelSpec
from projection.specs.plan import ParallelPlan
from projection.specs.training import DTYPE_BYTES, TrainingSpec

OpKind = Literal["gemm", "grouped_gemm", "attention", "memory_bound", "collective"]
_ACTIVATIONS = ("silu", "gelu", "relu", "squared_relu", "quick_gelu")  # ModelSpec.activation
KERNEL_FNS = ("layernorm", "rmsnorm", "cross_entropy", "softmax", *_ACTIVATIONS, *(f"{a}_glu" for a in _ACTIVATIONS))


def kernel_fn(key: str) -> str:
    """The kernel a calibration key names (`gelu` for `gelu` and `gelu.bwd`), or '' for any other op name."""
    fn = key.removesuffix(".bwd")
    return fn if fn in KERNEL_FNS else ""
Phase = Literal["F", "I", "W"]
CollKind = Literal["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv", "broadcast"]
GroupAxis = Literal["tp", "cp", "cp_a2a", "cp_ring", "ep", "etp", "etp_ep", "dp", "pp"]
"""etp_ep: Megatron's tensor-and-expert-parallel group (etp x ep innermost ranks of the expert grid), over which the
allgather MoE token dispatcher gathers and reduce-scatters. cp_a2a and cp_ring: the two levels of a hierarchical
context-parallel group (ParallelPlan.cp_hierarchy): consecutive cp ranks, and the ranks of stride cp_a2a."""


@dataclass(frozen=True)
class Op:
    """One kernel (or collective) that one rank runs `count` times back to back for one microbatch.

    Shapes: gemm / grouped_gemm use BLAS (m, n, k) with `batch` = batched-GEMM count or number of groups (local
    experts; n = token rows per group); attention uses batch = sequences, m = query length, n = key length,
    k = q/k head dim, `head_dim_v`, `heads` / `kv_heads` on this rank and `causal`. `flop`, `bytes_read`,
    `bytes_written` and `coll_bytes` are per invocation. `recompute` marks a forward op re-run before the backward
    pass (phase F); `tag` names the module (recompute selects by it)."""

    name: str
    kind: OpKind
    phase: Phase
    dtype: str = "bf16"
    flop: float = 0.0
    bytes_read: float = 0.0
    bytes_written: float = 0.0
    m: int = 0
    n: int = 0
    k: int = 0
    batch: int = 1
    layout: str = ""
    heads: int = 0
    kv_heads: int = 0
    head_dim_v: int = 0
    causal: bool = False
    window: int = 0  # attention: the sliding window (keys per query at most; 0 = none)
    coll: CollKind | None = None
    coll_bytes: int = 0
    group: GroupAxis | None = None
    count: int = 1
    recompute: bool = False
    tag: str = ""
    fn: str = ""

    @property
    def kernel(self) -> str:
        """The calibration key of a named memory-bound kernel: `fn`, `fn.bwd` in backward; '' when unnamed."""
        return "" if not self.fn else self.fn if self.phase == "F" else f"{self.fn}.bwd"

    @property
    def total_flop(self) -> float:
        return self.flop * self.count

    @property
    def total_bytes(self) -> float:
        """HBM traffic of all invocations (reads + writes)."""
        return (self.bytes_read + self.bytes_written) * self.count


@dataclass(frozen=True)
class Piece:
    """Forward ops of one module and the backward ops that undo it (in the order the backward runs them)."""

    tag: str
    fwd: tuple[Op, ...]
    bwd: tuple[Op, ...]


@dataclass(frozen=True)
class Dims:
    """Per-rank sizes of one microbatch. tokens: rows of every TP-sharded GEMM (b*s/cp, gathered over TP under
    sequence parallelism); tokens_sp: rows of norms, residuals and the MoE router (tokens/tp with SP)."""

    b: int
    s: int
    h: int
    tp: int
    cp: int
    sp: bool
    ep: int
    etp: int
    tokens: int
    tokens_sp: int
    act: str
    act_bytes: int
    gemm: str
    main_grad_bytes: int
    fused_wgrad: bool
    flash: bool
    dropout: bool  # hidden dropout (residual)
    norm: str = "rmsnorm"
    act_fn: str = "silu"
    expert_gemm: str = "bf16"  # dtype of the routed experts' grouped GEMMs
    # Which FP8 casts a linear runs (Fp8Spec.library; `_fp8_casts`), and whether FSDP gathered its weight in fp8
    fp8_library: str = ""
    fp8_weight_gathered: bool = False
    fp8_weight_transposed: bool = True  # TE holds each fp8 weight's transpose (else made again in every backward)
    fp8_tp_gather: bool = False  # an fp8 linear's TP all-gathers move 1 B per element (Fp8Spec.tp_gathers_in_fp8)
    fp8_tp_gather_bwd: bool = False  # ... and its backward's (Fp8Spec.tp_backward_gathers_in_fp8)
    fp8_tp_plan: bool = False  # TorchTitan's float8 TP plan: attention and dense-MLP gathers in fp8 (ops._layer_pieces)
    # Sequence-parallel TP entry (ParallelPlan.tp_style): whether backward re-gathers the sharded input for the weight
    # gradient (Megatron) or kept the gathered one (TorchTitan's DTensor TP)
    tp_regather: bool = True
    allgather_dispatch: bool = False  # Megatron's allgather MoE token dispatcher (else all-to-all)
    # Megatron's all-to-all dispatcher, which exchanges routing metadata beside the tokens (ops_mlp._dispatch_metadata);
    # not TorchTitan's own token exchange nor DeepEP's (flex)
    alltoall_metadata: bool = False
    sequential_experts: bool = False  # Megatron SequentialMLP: each local expert's GEMMs launched on their own
    unfused_permute: bool = False  # Megatron without --moe-permute-fusion: moe_utils' unfused permute / unpermute
    attn_dropout: bool = False  # dropout of the attention probabilities (a kernel of its own without flash)
    # how context parallelism exchanges K/V (ops_attention._cp_pieces): "p2p" (Megatron/TE's ring), "p2p_torch"
    # (torch's ring), "all_gather" (Transformer Engine's, exposed), "all_gather_torch" (torch's allgather rotater),
    # "a2a" (Ulysses all-to-all of Q, K, V, O), "a2a+p2p" (TE's hierarchical: all-to-all over groups of cp_a2a
    # consecutive cp ranks, then the ring over the cp / cp_a2a groups)
    cp_exchange: str = "p2p"
    cp_a2a: int = 1
    # eager TorchTitan copies K and V to every query head before SDPA (torchtitan models/llama3/model/model.py
    # `repeat_kv`), unless an attention kernel takes GQA as it is (KernelSpec.gqa_native_attention)
    repeat_kv: bool = False
    # TorchTitan's modules (separate linears, complex RoPE, cross_entropy on upcast logits), and whether they run
    # eagerly, each elementwise aten call a kernel (ops_eager); with the composite RMSNorm of PyTorch < 2.8
    torchtitan: bool = False
    eager: bool = False
    rms_composite: bool = False
    rope_unfused: bool = False  # Megatron-Core's RoPE without its fused kernel (--no-rope-fusion; ops_eager)
    act_unfused: bool = False  # Megatron-Core's MLP activation without its fused bias-activation kernel (ops_eager)
    linear_bias: bool = False  # the linears carry biases (Megatron's add_bias_linear)


def dims(model: ModelSpec, training: TrainingSpec, plan: ParallelPlan) -> Dims:
    tokens = training.micro_batch_size * training.seq_length // plan.cp
    sp = plan.sp_
    act = training.params_dtype
    fp8 = training.fp8
    titan = training.kernels.transformer_impl == "torchtitan"
    eager = titan and not training.kernels.compiled  # TorchTitan's blocks not compiled: aten call by call
    return Dims(b=training.micro_batch_size, s=training.seq_length, h=model.hidden_size, tp=plan.tp, cp=plan.cp,
                sp=sp, ep=plan.ep, etp=plan.etp_, tokens=tokens, tokens_sp=tokens // plan.tp if sp else tokens,
                act=act, act_bytes=DTYPE_BYTES[act], gemm="fp8" if fp8 is not None else act,
                # torchao's float8 / MX linear converters swap nn.Linear only; TorchTitan's grouped experts keep the
                # activation dtype unless a grouped-GEMM converter is listed (Fp8Spec.experts_in_fp8)
                expert_gemm="fp8" if fp8 is not None and fp8.experts_in_fp8 else act,
                fp8_library=fp8.library if fp8 is not None else "",
                fp8_weight_gathered=fp8 is not None and fp8.gathers_in_fp8("attention"),
                fp8_weight_transposed=fp8 is None or fp8.weight_transpose_cache,
                fp8_tp_gather=fp8 is not None and fp8.tp_gathers_in_fp8,
                fp8_tp_gather_bwd=fp8 is not None and fp8.tp_backward_gathers_in_fp8,
                fp8_tp_plan=fp8 is not None and fp8.tp_float8,
                tp_regather=plan.tp_style == "megatron",
                main_grad_bytes=DTYPE_BYTES[training.optimizer.main_grads_dtype],
                fused_wgrad=training.gradient_accumulation_fusion,
                flash=training.attention_backend != "unfused", dropout=training.dropout > 0,
                attn_dropout=training.attention_dropout_ > 0, norm=model.norm,
                act_fn=f"{model.activation}_glu" if model.gated_mlp else model.activation,
                allgather_dispatch=training.kernels.moe_token_dispatcher == "allgather",
                alltoall_metadata=training.kernels.moe_token_dispatcher == "alltoall"
                and training.kernels.transformer_impl != "torchtitan",
                sequential_experts=training.kernels.moe_grouped_gemm is False,
                unfused_permute=training.kernels.moe_permute_fusion is False, cp_exchange=cp_exchange(plan),
                cp_a2a=cp_a2a_size(plan),
                repeat_kv=titan and not training.kernels.gqa_native_attention,
                torchtitan=titan, eager=eager,
                rms_composite=training.kernels.eager_rms_norm and not training.kernels.compiled,
                rope_unfused=not titan and not training.kernels.rope_fusion,
                act_unfused=not titan and not training.kernels.bias_activation_fusion,
                linear_bias=model.add_bias_linear)


def cp_a2a_size(plan: ParallelPlan, layer_index: int = 0) -> int:
    """The all-to-all group of a hierarchical a2a+p2p exchange (Dims.cp_a2a), 1 for the other exchanges."""
    levels = plan.cp_levels
    return levels[0] if levels is not None and cp_exchange(plan, layer_index) == "a2a+p2p" else 1


def cp_exchange(plan: ParallelPlan, layer_index: int = 0) -> str:
    """The priced context-parallel exchange of decoder layer `layer_index` (Dims.cp_exchange): one type, or a native
    scenario's one per layer (0-based; Megatron-Core's list, indexed by the 1-based layer number, is refused:
    specs/validate_kernels.py).
    a2a+p2p with an all-to-all group of 1 is TE's plain ring, with a ring of 1 its plain all-to-all (TE
    attn_forward_func_with_cp falls back to either)."""
    kinds = plan.cp_comm.split()
    if plan.cp == 1 or not kinds:
        return "p2p"
    kind, torch = kinds[layer_index % len(kinds)], plan.tp_style == "dtensor"  # specs/validate_kernels: 1 or all
    if kind == "a2a+p2p" and plan.cp_levels is not None:
        a, ring = plan.cp_levels
        kind = "p2p" if a == 1 else "a2a" if ring == 1 else kind
    if kind == "all_gather":  # TorchTitan runs torch's context parallel, Megatron TE's
        return "all_gather_torch" if torch else "all_gather"
    if kind in ("a2a", "a2a+p2p"):
        return kind
    return "p2p_torch" if torch else "p2p"


def gemm(name: str, phase: Phase, m: int, n: int, k: int, dtype: str, out_bytes: float, *, layout: str,
         batch: int = 1, acc_bytes: float = 0.0, tag: str = "") -> Op:
    """A (batched) GEMM: reads A and B once, writes C (`acc_bytes` > 0: C accumulates into a buffer of that width,
    read and written, as a fused fp32 main-grad accumulation does)."""
    b_in = DTYPE_BYTES.get(dtype, 2)
    out = acc_bytes or out_bytes
    return Op(name, "gemm", phase, dtype=dtype, m=m, n=n, k=k, batch=batch, layout=layout,
              flop=2.0 * batch * m * n * k, bytes_read=batch * ((m * k + k * n) * b_in + m * n * acc_bytes),
              bytes_written=batch * m * n * out, tag=tag)


def mem(name: str, phase: Phase, read_bytes: float, written_bytes: float, dtype: str = "bf16", tag: str = "",
        count: int = 1, *, fn: str = "", rows: int = 0, width: int = 0) -> Op:
    """A memory-bound op; `fn` names the kernel it stands for, of `rows` x `width` (module docstring)."""
    return Op(name, "memory_bound", phase, dtype=dtype, bytes_read=read_bytes, bytes_written=written_bytes,
              tag=tag, count=count, fn=fn, m=rows if fn else 0, n=width if fn else 0)


def coll(name: str, phase: Phase, kind: CollKind, size_bytes: float, group: GroupAxis, count: int = 1,
         tag: str = "") -> Op:
    return Op(name, "collective", phase, coll=kind, coll_bytes=int(size_bytes), group=group, count=count, tag=tag)


def linear(name: str, d: Dims, tokens: int, n_out: int, k_in: int, *, dtype: str | None = None,
           tag: str = "") -> Piece:
    """A Linear layer (BLAS shapes in the module docstring): forward GEMM, then in backward the input-gradient GEMM
    (I) and the weight-gradient GEMM (W, accumulating into the main-grad buffer when gradient accumulation is fused).
    FP8 GEMMs also cast their inputs: x (and its transpose for wgrad) in F, dy (and its transpose) in I (Transformer
    Engine's fused cast-transpose); torchao's and Primus-Turbo's are `_fp8_casts`."""
    dt = dtype or d.gemm
    ab = d.act_bytes
    acc = d.main_grad_bytes if d.fused_wgrad else 0
    fwd = [gemm(name, "F", n_out, tokens, k_in, dt, ab, layout="TN", tag=tag)]
    bwd = [gemm(f"{name}.dgrad", "I", k_in, tokens, n_out, dt, ab, layout="NN", tag=tag),
           gemm(f"{name}.wgrad", "W", k_in, n_out, tokens, dt, ab, layout="NT", acc_bytes=acc, tag=tag)]
    if dt == "fp8" and d.fp8_library in ("torchao", "primus_turbo"):
        fwd[:0], bwd[1:1], bwd[:0] = _fp8_casts(name, d, tokens, n_out, k_in, tag)
    elif dt == "fp8":
        fwd.insert(0, mem(f"{name}.cast", "F", tokens * k_in * ab, 2 * tokens * k_in, "fp8", tag))
        bwd.insert(0, mem(f"{name}.dgrad.cast", "I", tokens * n_out * ab, 2 * tokens * n_out, "fp8", tag))
        if not d.fp8_weight_transposed:  # no transpose cache: the fp8 weight (1 B) is transposed for the dgrad
            bwd.insert(1, mem(f"{name}.weight.transpose", "I", n_out * k_in, n_out * k_in, "fp8", tag))
    return Piece(tag, tuple(fwd), tuple(bwd))


def _fp8_casts(name: str, d: Dims, tokens: int, n_out: int, k_in: int,
               tag: str) -> tuple[list[Op], list[Op], list[Op]]:
    """The fp8 casts of one linear that casts on the fly (tensorwise). torchao Float8Linear (torchao 0.18
    float8_linear.py; dispatched ops checked in tests/oracle/test_fp8_torchao.py): forward casts x and the weight;
    backward casts dy for dgrad (I), the weight again, then dy again and the saved 16-bit x for wgrad (W). Primus-Turbo
    (FP8GemmTensorFunction) saves the fp8 x and weight, so backward casts dy only. With FSDP's fp8 all-gather the
    weight arrives in fp8 and is not cast. Each cast is priced as torch.compile fuses it: an amax pass and a cast pass
    over the 16-bit tensor (2 reads), one fp8 write. Returns (forward, before wgrad, start of backward)."""
    ab, w = d.act_bytes, n_out * k_in

    def cast(suffix: str, phase: Phase, n: int) -> Op:
        return mem(f"{name}{suffix}", phase, 2 * n * ab, n, "fp8", tag)

    weights = not d.fp8_weight_gathered
    fwd = [cast(".cast", "F", tokens * k_in)] + ([cast(".weight.cast", "F", w)] if weights else [])
    if d.fp8_library == "primus_turbo":
        return fwd, [], [cast(".dgrad.cast", "I", tokens * n_out)]
    start = [cast(".dgrad.cast", "I", tokens * n_out)] + ([cast(".dgrad.weight.cast", "I", w)] if weights else [])
    wgrad = [cast(".wgrad.dy.cast", "W", tokens * n_out), cast(".wgrad.x.cast", "W", tokens * k_in)]
    return fwd, wgrad, start


def column_linear(name: str, d: Dims, tokens: int, n_out: int, k_in: int, *, dtype: str | None = None,
                  tag: str = "") -> Piece:
    """A column-parallel linear with its TP entry (`tp_enter` over the k_in-wide input), in Megatron's backward
    order (LinearWithGradAccumulationAndAsyncCommunication): re-gather the input (SP), dgrad, reduce the input
    gradient (launched before the wgrad, which hides it), wgrad. TorchTitan's DTensor TP (no re-gather) computes
    dgrad and wgrad in the linear's one autograd node, and the input gradient's reduce-scatter (Partial -> Shard at
    PrepareModuleInput) follows both, waited for by the norm's backward."""
    enter = tp_enter(name, d, k_in, tag, gather_bytes=_gather_bytes(d, dtype),
                     regather_bytes=_gather_bytes(d, dtype, backward=True))
    lin = linear(name, d, tokens, n_out, k_in, dtype=dtype, tag=tag)
    gathers = tuple(o for o in enter.bwd if o.phase == "W")
    reduces = tuple(o for o in enter.bwd if o.phase != "W")
    if d.sp and not d.tp_regather:
        return Piece(tag, enter.fwd + lin.fwd, lin.bwd + reduces)
    return Piece(tag, enter.fwd + lin.fwd, gathers + lin.bwd[:-1] + reduces + lin.bwd[-1:])


def row_linear(name: str, d: Dims, tokens: int, n_out: int, k_in: int, *, dtype: str | None = None,
               tag: str = "") -> Piece:
    """A row-parallel linear followed by its TP exit (reduce-scatter with SP, all-reduce without)."""
    return join(tag, linear(name, d, tokens, n_out, k_in, dtype=dtype, tag=tag),
                tp_exit(name, d, n_out, tag, gather_bytes=_gather_bytes(d, dtype, backward=True)))


def _gather_bytes(d: Dims, dtype: str | None, backward: bool = False) -> int:
    """Bytes per element of the TP all-gathers around a linear of `dtype`: 1 where it runs in fp8 and the library
    casts before gathering (Fp8Spec.tp_gathers_in_fp8, tp_backward_gathers_in_fp8), else the activation dtype's."""
    fp8 = d.fp8_tp_gather_bwd if backward else d.fp8_tp_gather
    return 1 if (dtype or d.gemm) == "fp8" and fp8 else d.act_bytes


def pointwise(name: str, d: Dims, elems_in: float, elems_out: float, tag: str = "", extra_in: float = 0.0, *,
              fn: str = "", width: int = 0) -> Piece:
    """An elementwise/normalisation op over activations: F reads its inputs and writes its output; I reads the
    saved input and the output gradient and writes the input gradient (bytes in the activation dtype). `fn` names
    the kernel, whose output rows are `width` long."""
    ab = d.act_bytes
    rows = int(elems_out // width) if fn and width else 0
    fwd = mem(name, "F", (elems_in + extra_in) * ab, elems_out * ab, d.act, tag, fn=fn, rows=rows, width=width)
    bwd = mem(f"{name}.bwd", "I", (elems_in + elems_out + extra_in) * ab, elems_in * ab, d.act, tag, fn=fn,
              rows=rows, width=width)
    return Piece(tag, (fwd,), (bwd,))


def tp_enter(name: str, d: Dims, width: int, tag: str = "", *, gather_bytes: int | None = None,
             regather_bytes: int | None = None) -> Piece:
    """Before a column-parallel linear (Megatron's `f` / sequence-parallel all-gather): with SP an all-gather of the
    [tokens, width] input in F, and in backward a reduce-scatter of its gradient (I) plus, in Megatron's style, the
    re-gather of the input for the weight gradient (W; Megatron keeps only the sharded input, Korthikanti et al. 2022
    §4.2.2; TorchTitan's DTensor TP keeps the gathered one); without SP nothing in F and an all-reduce of the input
    gradient in I. The gathers move `gather_bytes` (the re-gather `regather_bytes`) per element (1 for an fp8 linear
    that casts before gathering), the gradient's reduction the activation dtype."""
    if d.tp == 1:
        return Piece(tag, (), ())
    size = d.tokens * width * d.act_bytes
    if d.sp:
        gathered = d.tokens * width * (gather_bytes or d.act_bytes)
        again = d.tokens * width * (regather_bytes or gather_bytes or d.act_bytes)
        regather = (coll(f"{name}.ag", "W", "all_gather", again, "tp", tag=tag),) if d.tp_regather else ()
        return Piece(tag, (coll(f"{name}.ag", "F", "all_gather", gathered, "tp", tag=tag),),
                     (*regather, coll(f"{name}.rs", "I", "reduce_scatter", size, "tp", tag=tag)))
    return Piece(tag, (), (coll(f"{name}.ar", "I", "all_reduce", size, "tp", tag=tag),))


def tp_exit(name: str, d: Dims, width: int, tag: str = "", *, gather_bytes: int | None = None) -> Piece:
    """After a row-parallel linear (Megatron's `g`): with SP a reduce-scatter in F and an all-gather of the output
    gradient in I (`gather_bytes` per element: 1 where an fp8 linear casts dy before gathering); without SP an
    all-reduce in F and nothing in backward."""
    if d.tp == 1:
        return Piece(tag, (), ())
    size = d.tokens * width * d.act_bytes
    if d.sp:
        return Piece(tag, (coll(f"{name}.rs", "F", "reduce_scatter", size, "tp", tag=tag),),
                     (coll(f"{name}.ag", "I", "all_gather", d.tokens * width * (gather_bytes or d.act_bytes), "tp",
                           tag=tag),))
    return Piece(tag, (coll(f"{name}.ar", "F", "all_reduce", size, "tp", tag=tag),), ())


def join(tag: str, *pieces: Piece) -> Piece:
    """Pieces run one after another: forward in order, backward in reverse order."""
    fwd = tuple(op for p in pieces for op in p.fwd)
    bwd = tuple(op for p in reversed(pieces) for op in p.bwd)
    return Piece(tag, tuple(replace(o, tag=o.tag or tag) for o in fwd), tuple(replace(o, tag=o.tag or tag)
                                                                              for o in bwd))


def retag(piece: Piece, tag: str) -> Piece:
    """The same piece with every op tagged `tag` (the module name recompute selects by)."""
    return Piece(tag, tuple(replace(o, tag=tag) for o in piece.fwd), tuple(replace(o, tag=tag) for o in piece.bwd))


def residual(name: str, d: Dims) -> Piece:
    """Bias-dropout-add: x + dropout(y) over this rank's (sequence-sharded) tokens; backward adds two gradients."""
    e, ab = d.tokens_sp * d.h, d.act_bytes
    mask = e if d.dropout else 0
    return Piece("residual", (mem(name, "F", 2 * e * ab, e * ab + mask, d.act, "residual"),),
                 (mem(f"{name}.bwd", "I", 2 * e * ab + mask, e * ab, d.act, "residual"),))
