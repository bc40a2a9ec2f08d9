"""Allocations besides model states and saved activations that the training framework makes through PyTorch's caching
allocator (so they count in `torch.cuda.memory_stats()["allocated_bytes.all.peak"]`), per rank, in bytes.

Each term names what allocates it; every constant is read from the source cited next to it.

GEMM workspaces
* PyTorch cuBLAS workspace (aten/src/ATen/cuda/CublasHandlePool.cpp, `setCublasWorkspace` / `getNewWorkspace`):
  one caching-allocator block of `getChosenWorkspaceSize()` bytes per (thread, stream) that runs a PyTorch GEMM; the
  map is `thread_local` (older releases key it by (handle, stream), handles being per thread: the same count). The
  size parses CUBLAS_WORKSPACE_CONFIG ":SIZE_KiB:COUNT[...]" as sum(SIZE * 1024 * COUNT); unset, it is ":4096:8"
  = 32 MiB on Hopper/Blackwell (sm 9.x/10.x/12.x) and 4096 KiB * 2 + 16 KiB * 8 before; on ROCm 32 MiB, 128 MiB on
  gfx94x/gfx95x (MI300X/MI325X/MI355X). cuBLASLt shares that workspace on CUDA (TORCH_CUBLASLT_UNIFIED_WORKSPACE,
  default on). Forward runs on the Python main thread and backward on the autograd engine's device thread, so a
  model with a PyTorch GEMM in both passes holds two workspaces on one stream. Megatron's GPT output layer
  (tensor_parallel.ColumnParallelLinear, also under Transformer Engine) and MoE router are PyTorch GEMMs.
* Transformer Engine (transformer_engine/pytorch/module/base.py `get_workspace`, `get_cublas_workspace_size_bytes`):
  one global 32 MiB cuBLASLt workspace when the device reports compute capability major >= 9 (4 MiB before; ROCm
  reports CDNA gfx9xx as major 9); grouped GEMMs (TE GroupedLinear,
  Megatron --moe-grouped-gemm) add `get_multi_stream_cublas_workspace()`: one workspace per cuBLAS stream,
  tex.get_num_cublas_streams() = 4.

Megatron-core
* `GlobalMemoryBuffer` (megatron/core/utils.py, parallel_state.get_global_memory_buffer): one persistent tensor per
  (name, dtype), grown to the largest request and never freed. Name "mpu" serves the pre-allocated [b * np, sq, sk]
  input of the score baddbmm in the local DotProductAttention (megatron/core/transformer/dot_product_attention.py)
  and the sequence-parallel all-gather of the input of every non-TE linear (tensor_parallel/layers.py
  LinearWithGradAccumulationAndAsyncCommunication): with Transformer Engine only the output layer.
* Mixed-precision optimizer with 16-bit main grads (fp16 without --accumulate-allreduce-grads-in-fp32, or
  --grad-reduce-in-bf16): `main_param.grad = model_param.main_grad.float()` (optimizer.py
  Float16OptimizerWithFloat16Params._copy_model_grads_to_main_grads) and, with the distributed optimizer,
  `shard_main_param.grad = shard_model_grad.float()` (distrib_optimizer.py) allocate fp32 copies (4 B per parameter,
  sharded over the optimizer's shard group with the distributed optimizer). They live from the optimizer step until
  the next iteration's zero_grad(set_to_none=True): part of the optimizer-step peak, not of forward/backward.
  (`.float()` of an fp32 grad is the grad itself: no copy with fp32 main grads.)
* --defer-embedding-wgrad-compute: the output layer appends its input (forward) and its output gradient [s, b, V/t]
  (backward) to embedding_activation_buffer / grad_output_buffer for up to --wgrad-deferral-limit microbatches
  (0 = all), computing their weight gradients only when the pipeline drains (layers.py, schedules.py
  drain_embedding_wgrad_compute).

Not modelled: NCCL buffers (allocated by NCCL outside the caching allocator unless NCCL user-buffer registration
through the PyTorch allocator is on), the CUDA context, hipBLASLt's separate ROCm workspace.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from projection.memory.model_states import shard_groups
from projection.specs.hardware import DeviceSpec
from projection.specs.scenario import Scenario, runs_megatron
from projection.specs.training import DTYPE_BYTES
from projection.workload.params import RankParams
from projection.workload.stages import StageSlot

MiB = 1024 * 1024
# PyTorch CublasHandlePool.cpp parseChosenWorkspaceSize defaults.
CUBLAS_DEFAULT_SM90_PLUS = 4096 * 1024 * 8  # ":4096:8" on compute capability 9.x, 10.x, 12.x
CUBLAS_DEFAULT_PRE_SM90 = 4096 * 1024 * 2 + 16 * 1024 * 8  # ":4096:2:16:8"
HIPBLAS_DEFAULT = 32 * MiB
HIPBLAS_DEFAULT_GFX94_95 = 128 * MiB
# Transformer Engine get_cublas_workspace_size_bytes and tex.get_num_cublas_streams.
TE_WORKSPACE_SM90_PLUS = 33_554_432
TE_WORKSPACE_PRE_SM90 = 4_194_304
TE_NUM_CUBLAS_STREAMS = 4
# Threads that run PyTorch GEMMs in one training step: the Python main thread (forward) and the autograd engine's
# device thread (backward).
GEMM_THREADS = 2

# Device generation of each bundled device (vendor datasheets): NVIDIA compute capability >= 9 (Hopper: H100, H200;
# Blackwell: B200) and AMD gfx94x/gfx95x (CDNA3 MI300X/MI325X = gfx942, CDNA4 MI355X = gfx950).
_SM90_PLUS = ("h100", "h200", "h800", "gh200", "b100", "b200", "gb200", "b300", "gb300")
_GFX94_95 = ("mi300", "mi325", "mi350", "mi355")

def is_megatron(sc: Scenario) -> bool:
    return runs_megatron(sc.framework)


@dataclass(frozen=True)
class Runtime:
    """Framework facts the memory model needs that a Scenario does not carry (yet): which GEMM libraries run, the
    workspace sizes they allocate, and Megatron options that change what stays allocated."""

    megatron: bool = False  # Megatron-core code paths: global memory buffer, vocab-parallel CE, mixed-precision optim.
    te: bool = False  # Transformer Engine modules run the transformer layers
    te_grouped_gemm: bool = False  # TE GroupedLinear experts (Megatron --moe-grouped-gemm under TE)
    cublas_workspace_bytes: int = CUBLAS_DEFAULT_SM90_PLUS  # per (thread, stream)
    te_workspace_bytes: int = TE_WORKSPACE_SM90_PLUS
    gemm_threads: int = GEMM_THREADS
    defer_embedding_wgrad: bool = False
    wgrad_deferral_limit: int = 0
    ce_fusion_te: bool = False  # --cross-entropy-fusion-impl te: TE's in-place bf16 cross entropy


def default_cublas_workspace(device: DeviceSpec) -> int:
    name = device.name.lower()
    if device.vendor == "amd":
        return HIPBLAS_DEFAULT_GFX94_95 if name.startswith(_GFX94_95) else HIPBLAS_DEFAULT
    return CUBLAS_DEFAULT_SM90_PLUS if name.startswith(_SM90_PLUS) else CUBLAS_DEFAULT_PRE_SM90


def default_te_workspace(device: DeviceSpec) -> int:
    """TE tests torch.cuda.get_device_properties().major >= 9: true on Hopper/Blackwell and on every CDNA part
    (ROCm reports gfx9xx as major 9, e.g. gfx942 -> 9.4)."""
    major9 = device.vendor == "amd" or device.name.lower().startswith(_SM90_PLUS)
    return TE_WORKSPACE_SM90_PLUS if major9 else TE_WORKSPACE_PRE_SM90


def runtime_for(sc: Scenario) -> Runtime:
    """The Runtime of a scenario, from its framework and `training.kernels` (Megatron flags and the
    CUBLAS_WORKSPACE_CONFIG the loaders read; library defaults otherwise)."""
    k = sc.training.kernels
    dev = sc.cluster.device
    megatron = is_megatron(sc)
    te = megatron and k.transformer_impl == "transformer_engine"
    ws = k.gemm_workspace_bytes
    return Runtime(
        megatron=megatron, te=te,
        te_grouped_gemm=te and bool(k.moe_grouped_gemm) and sc.model.moe is not None,
        cublas_workspace_bytes=ws if ws is not None else default_cublas_workspace(dev),
        te_workspace_bytes=default_te_workspace(dev),
        defer_embedding_wgrad=megatron and k.defer_embedding_wgrad,
        wgrad_deferral_limit=k.wgrad_deferral_limit,
        ce_fusion_te=megatron and sc.training.fused_loss and k.cross_entropy_fusion_impl == "te",
    )


def _act_bytes(sc: Scenario) -> int:
    return 4 if sc.training.params_dtype == "fp32" else 2


def global_memory_buffer_bytes(sc: Scenario, rt: Runtime, slots: Sequence[StageSlot]) -> int:
    """Megatron's persistent GlobalMemoryBuffer ("mpu", activation dtype) on one pipeline rank: the largest of its
    users on that rank (see module docstring)."""
    if not rt.megatron:
        return 0
    m, t, p = sc.model, sc.training, sc.plan
    e = _act_bytes(sc)
    s_local, b = t.seq_length // p.cp, t.micro_batch_size
    sizes = [0]
    has_layers = any(s.layers for s in slots)
    if not rt.te and has_layers and t.attention_backend == "unfused":
        heads = m.num_attention_heads // p.tp
        sizes.append(e * b * heads * s_local * s_local)
    if p.sp_ and (any(s.loss or s.mtp_layers for s in slots) or (not rt.te and has_layers)):
        sizes.append(e * s_local * b * m.hidden_size)  # all-gathered [s, b, h] input of a non-TE linear
    return max(sizes)


def persistent_buffer_bytes(sc: Scenario, rt: Runtime, slots: Sequence[StageSlot]) -> dict[str, int]:
    """Buffers allocated once and held through forward, backward and the optimizer step."""
    out = {"buffers.cublas_workspaces": rt.gemm_threads * rt.cublas_workspace_bytes}
    if rt.te:
        out["buffers.te_workspace"] = rt.te_workspace_bytes
        moe_here = sc.model.moe is not None and any(sc.model.is_moe_layer(i) for s in slots for i in s.layers)
        if rt.te_grouped_gemm and moe_here:
            out["buffers.te_grouped_gemm_workspaces"] = TE_NUM_CUBLAS_STREAMS * rt.te_workspace_bytes
    gmb = global_memory_buffer_bytes(sc, rt, slots)
    if gmb:
        out["buffers.megatron_global_buffer"] = gmb
    return out


def optimizer_step_bytes(sc: Scenario, rt: Runtime, rank: RankParams) -> dict[str, int]:
    """Transient bytes of the optimizer step beyond model states and persistent buffers: Megatron's fp32 copies of
    16-bit main grads (see module docstring)."""
    t, p = sc.training, sc.plan
    mixed = t.params_dtype != "fp32"
    grads16 = DTYPE_BYTES[t.optimizer.main_grads_dtype] < 4
    if not (rt.megatron and mixed and grads16 and not t.optimizer.precision_aware):
        return {}
    expert = rank.by_component.get("experts", 0)
    dense = rank.params - expert
    if p.sharding.zero_stage >= 1:
        g_dense, g_expert = shard_groups(p)
        n = dense / g_dense + expert / g_expert
    else:
        n = dense + expert
    return {"optimizer_step.fp32_grad_copies": round(4 * n)}


def deferred_wgrad_bytes(sc: Scenario, rt: Runtime, n_microbatches: int) -> int:
    """Output-layer inputs and output gradients held for deferred weight-gradient GEMMs on the stage with the
    loss, at the moment the loss of the microbatch after them runs (see module docstring)."""
    if not rt.defer_embedding_wgrad or sc.plan.pp == 1:
        return 0
    m, t, p = sc.model, sc.training, sc.plan
    e = _act_bytes(sc)
    held = n_microbatches - 1 if rt.wgrad_deferral_limit == 0 else min(rt.wgrad_deferral_limit, n_microbatches - 1)
    tokens = t.micro_batch_size * t.seq_length // p.cp
    v = m.padded_vocab(p.tp) // p.tp
    x_in = e * tokens * m.hidden_size / (p.tp if p.sp_ else 1)
    return round(max(0, held) * (e * tokens * v + x_in))
