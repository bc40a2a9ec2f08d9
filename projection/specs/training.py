"""TrainingSpec: sequence, batch, precision and optimizer of one training job."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from projection.specs.base import Spec

DType = Literal["fp32", "bf16", "fp16", "fp8"]

# Bytes per element of each dtype name used in specs.
DTYPE_BYTES: dict[str, int] = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}


class Fp8Spec(Spec):
    """FP8 GEMMs. `param_gather` keeps compute weights in fp8 (Megatron --fp8-param-gather, TorchTitan
    enable_fsdp_float8_all_gather): parameter all-gathers move, and gathered units hold, 1 B per GEMM weight.

    `library` decides what FP8 keeps in memory and which casts run (README § projection memory, FP8):
    * transformer_engine (Megatron-LM, Primus Megatron, NeMo): an fp8 copy of every GEMM weight and its transpose
      cached for the whole step (TE's `is_first_microbatch` workspaces), linear inputs saved for backward in fp8;
      the routed experts' grouped GEMMs run in fp8 too;
    * torchao (TorchTitan's float8 / MX converters): weights cast on the fly in every forward and backward, nothing
      cached, linear inputs saved in the high-precision dtype (`matmul_with_hp_or_float8_args` saves
      `input_hp, weight_hp_t`; eager mode, torchao >= 0.13); only nn.Linear modules are converted, so routed experts
      stay in the activation dtype unless a grouped-GEMM converter is listed (`grouped_experts`);
    * primus_turbo (Primus TorchTitan with Primus-Turbo's float8 / MX linear): cast on the fly like torchao, but the
      fp8 input and the fp8 weight are what is saved for backward (FP8GemmTensorFunction
      `ctx.save_for_backward(a_fp8, a_scale_inv, b_fp8, b_scale_inv)`), so every in-flight microbatch holds an fp8
      copy of each layer's GEMM weights; it does no fp8 all-gather.
    `output_layer`: the logits GEMM runs in fp8 too (TorchTitan converts every nn.Linear its filter_fqns do not
    name; Megatron's output layer is never an FP8 GEMM)."""

    format: Literal["e4m3", "hybrid"] = "hybrid"
    recipe: Literal["delayed", "tensorwise", "rowwise", "mxfp8", "blockwise"] = "delayed"
    param_gather: bool = False
    amax_history_len: int = Field(1, gt=0)
    library: Literal["transformer_engine", "torchao", "primus_turbo"] = "transformer_engine"
    grouped_experts: bool = False
    output_layer: bool = False
    weight_transpose_cache: bool = Field(
        True, description="Transformer Engine keeps each fp8 weight's transpose (for the input-gradient GEMM) with the "
        "fp8 copy for the whole step; ROCm Megatron-LM's --no-fp8-weight-transpose-cache and Primus's "
        "no_fp8_weight_transpose_cache turn it off (TE keep_fp8_weight_transpose_cache=False): the transpose is "
        "made again in every backward instead of held")

    tp_float8: bool = Field(
        False, description="TorchTitan's float8 tensor-parallel plan (Float8ColwiseParallel, Float8RowwiseParallel, "
        "PrepareFloat8ModuleInput: taken for a tensorwise `float8` converter, TorchTitan v0.1) on the attention and "
        "dense feed-forward blocks (not MoE blocks, whose TP plan is apply_moe_ep_tp's, nor the output layer): their "
        "inputs are cast to fp8 before the sequence all-gather, the row-parallel output gradients before theirs, "
        "and the linears save the fp8 inputs (tests/oracle/test_torchtitan_tp_float8.py measures both at tp 2)")

    bf16_first_layers: int = Field(0, ge=0, description="decoder layers at the start that run without fp8 (Megatron "
                                   "--first-last-layers-bf16 with --num-layers-at-start-in-bf16; Megatron-Bridge "
                                   "mixed_precision.num_layers_at_start_in_bf16): their GEMMs, casts, TP gathers and "
                                   "weights in the params dtype, no fp8 weight cache, inputs saved in high precision")
    bf16_last_layers: int = Field(0, ge=0, description="the same for the last decoder layers "
                                  "(--num-layers-at-end-in-bf16); MTP layers keep fp8 (Megatron-Core's global context)")

    def layer_in_fp8(self, layer_index: int, num_layers: int) -> bool:
        """Whether decoder layer `layer_index` (0-based, global) runs in fp8: Megatron-Core is_first_last_bf16_layer
        (fp8_utils.py) keeps layers below `bf16_first_layers` and from num_layers - `bf16_last_layers` on in bf16."""
        return self.bf16_first_layers <= layer_index < num_layers - self.bf16_last_layers

    @property
    def caches_weights(self) -> bool:
        """True where fp8 weight copies live for the whole step (Transformer Engine)."""
        return self.library == "transformer_engine"

    @property
    def saves_fp8_inputs(self) -> bool:
        """True where linear layers save their inputs for backward in fp8 (1 B) rather than high precision."""
        return self.library in ("transformer_engine", "primus_turbo")

    @property
    def saves_fp8_weights(self) -> bool:
        """True where each forward saves its own fp8 weight copy for backward (Primus-Turbo)."""
        return self.library == "primus_turbo"

    @property
    def mm_dispatched(self) -> bool:
        """Whether an fp8 linear's GEMM reaches the dispatcher as `aten.mm` (torchao's Float8Tensor and MXTensor
        subclasses: torchao/float8/float8_linear.py multiplies them with torch.mm), which TorchTitan's per-op
        checkpoint policy counts and saves like a bf16 linear's; Primus-Turbo's linears call their own op
        (primus_turbo::gemm_fp8_impl), which the policy neither counts nor saves."""
        return self.library == "torchao"

    @property
    def experts_in_fp8(self) -> bool:
        """Whether the routed experts' grouped GEMMs run in fp8."""
        return self.library == "transformer_engine" or self.grouped_experts

    def converts(self, component: str) -> bool:
        """Whether the GEMM weights of a parameter component (workload.params names) are FP8 GEMMs."""
        if component == "experts":
            return self.experts_in_fp8
        if component == "output":
            return self.output_layer
        return component in ("attention", "dense_mlp", "shared_experts", "mtp")

    @property
    def tp_gathers_in_fp8(self) -> bool:
        """Whether the sequence-parallel all-gathers in front of an fp8 linear move fp8 (1 B): the input of a
        column-parallel linear (and Megatron's re-gather of it for the weight gradient) and the output gradient of a
        row-parallel one. Transformer Engine casts before it gathers, every recipe (TE layernorm_linear.py / linear.py:
        the norm writes fp8 and `gather_along_first_dim` moves it; `grad_output_preprocess` casts dy, then gathers;
        TE 2.x gathers the quantized tensor through its quantizer); reduce-scatters stay in the activation dtype.
        TorchTitan's float8 TP plan (`tp_float8`) casts before it gathers too, on the attention and dense
        feed-forward blocks only (workload/ops.py); TorchTitan v0.2.2 gathers in high precision (tests/unit/
        test_tp_styles.py: its models take the float8 TP plan only for a converter name v0.2.2 does not register);
        Primus-Turbo's linears: not known, high precision. Backward: see tp_backward_gathers_in_fp8."""
        return self.library == "transformer_engine"

    @property
    def tp_backward_gathers_in_fp8(self) -> bool:
        """Whether the backward's TP all-gathers (the input re-gathered for the weight gradient, the row-parallel
        output gradient) move fp8: as the forward's, except under TE's blockwise recipe, whose backward gathers run
        in high precision (Float8BlockQuantizer: the callers pass no quantizer so that the gathers stay
        asynchronous, TransformerEngine PR #1559)."""
        return self.tp_gathers_in_fp8 and self.recipe != "blockwise"

    def gathers_in_fp8(self, component: str) -> bool:
        """Whether a component's weights are all-gathered (and held unsharded) in fp8 under `param_gather`: the
        weights it converts, except torchao's grouped experts, which FSDP gathers in the params dtype
        (torchao moe_training/tensor.py fsdp_pre_all_gather casts to mp_policy.param_dtype)."""
        if not self.param_gather or not self.converts(component):
            return False
        return component != "experts" or self.library == "transformer_engine"


class OptimizerSpec(Spec):
    """Optimizer and the dtypes of its state. Defaults are Megatron's mixed-precision Adam: fp32 master params and
    fp32 moments; `main_grads_dtype` is the dtype gradients are accumulated and reduced in."""

    name: Literal["adam", "adamw", "sgd", "muon", "lion"] = "adam"
    main_params_dtype: DType = "fp32"
    main_grads_dtype: DType = "fp32"
    exp_avg_dtype: DType = "fp32"
    exp_avg_sq_dtype: DType = "fp32"
    precision_aware: bool = False
    implementation: Literal["fused", "foreach", "for-loop"] = Field(
        "fused", description="how Adam / AdamW update: 'fused' = one multi-tensor kernel (Megatron's, torch's "
        "fused=True), 'foreach' = torch.optim's _foreach_* passes, one per line of the update (TorchTitan's "
        "[optimizer] implementation = 'foreach', and its default before 2025, optimizer.fused = false), "
        "'for-loop' = the same passes tensor by tensor (projection/perf/optimizer.py foreach_adam)")
    weight_decay: float | None = Field(
        None, ge=0, description="the weight decay, where a config gives one (TorchTitan [optimizer] weight_decay); "
        "None = the framework's default, non-zero. Zero drops the decay pass of the foreach update")

    @property
    def num_moments(self) -> int:
        """State tensors per parameter besides the master copy: Adam 2, SGD (momentum) 1, Muon 1, Lion 1."""
        return {"adam": 2, "adamw": 2, "sgd": 1, "muon": 1, "lion": 1}[self.name]


class KernelSpec(Spec):
    """Which kernels / framework code paths run, where that changes memory (Megatron-LM flags and environment):
    Transformer Engine, Megatron's local layers or TorchTitan's eager modules, TE grouped-GEMM experts, deferred
    embedding wgrad, the cross-entropy implementation, the GEMM library workspace (CUBLAS_WORKSPACE_CONFIG;
    None = library default) and the caching allocator's mode (PYTORCH_ALLOC_CONF)."""

    transformer_impl: Literal["transformer_engine", "local", "torchtitan"] = Field(
        "transformer_engine", description="the layer implementation: Megatron --transformer-impl "
        "(transformer_engine, local) or TorchTitan's eager PyTorch modules (torchtitan: separate wq/wk/wv, repeat_kv "
        "before SDPA, SwiGLU as w2(silu(w1 x) * w3 x); set by the TorchTitan loaders)")
    moe_grouped_gemm: bool | None = Field(
        None, description="Megatron --moe-grouped-gemm: True = one grouped GEMM per expert linear (TE GroupedLinear), "
        "False = Megatron's SequentialMLP, each local expert's linears as GEMMs of their own; None = not a Megatron "
        "setting (TorchTitan's grouped_mm, HF, native scenarios): grouped")
    moe_flex_backend: str = Field(
        "deepep", description="the kernels of the flex dispatcher (Megatron --moe-flex-dispatcher-backend, default "
        "deepep, or hybridep, ncclep, ...; turbo_deepep: Primus-Turbo's DeepEP, which Primus selects with "
        "use_turbo_deepep at tp 1): which of them read the token counts on the host (perf/checks.token_count_syncs)")
    moe_permute_fusion: bool | None = Field(
        None, description="Megatron --moe-permute-fusion: True = Transformer Engine's fused permute / unpermute, "
        "False = moe_utils' unfused path (routing-map and probability transposes, two masked_selects, index_select, "
        "zeros + scatter_add_, in backward gather and zeros + index_add_); None = not a Megatron setting: priced "
        "as the fused kernels")
    moe_token_dispatcher: Literal["alltoall", "allgather", "flex"] = Field(
        "alltoall", description="Megatron --moe-token-dispatcher-type (flex: DeepEP / HybridEP); the performance "
        "model prices the all-to-all dispatcher and says so in its notes when another one is configured")
    cuda_graph_impl: Literal["none", "local", "transformer_engine"] = Field(
        "none", description="Megatron's CUDA-graph capture (--cuda-graph-impl, or the deprecated --enable-cuda-graph "
        "/ --external-cuda-graph; Megatron-Bridge's cuda_graph_impl): recorded, not modelled; the performance notes "
        "say so (kernels keep their eager host launch, graph pools are not in the memory estimate)")
    cuda_graph_scope: tuple[str, ...] = Field(
        (), description="what the graphs capture (--cuda-graph-scope: attn, mlp, moe, moe_router, moe_preprocess, "
        "mamba, full_iteration; empty or 'full' = whole layers)")
    rope_fusion: bool = Field(
        True, description="Megatron's fused RoPE kernel (--no-rope-fusion, Bridge / Primus apply_rope_fusion false: "
        "Megatron-Core's unfused chain, each aten call a kernel: projection/workload/ops_eager.megatron_rope). "
        "TorchTitan's blocks follow `compiled` instead")
    bias_activation_fusion: bool = Field(
        True, description="Megatron's fused bias-activation kernel (--no-bias-gelu-fusion / --no-bias-swiglu-fusion, "
        "Bridge's bias_activation_fusion false: Megatron-Core's unfused chain, each aten call a kernel: "
        "projection/workload/ops_eager.megatron_activation; GeLU experts always run it)")
    unmodelled: tuple[str, ...] = Field(
        (), description="options the job sets that projection reads but prices as their defaults (Megatron's "
        "fusions turned off, MoE overlaps), each with what it is priced as; the performance notes list them")
    compiled: bool = Field(
        False, description="torch.compile of the decoder blocks (TorchTitan [compile] enable with the 'model' "
        "component; set by the TorchTitan loaders): the min-cut partitioner recomputes the SwiGLU's SiLU output "
        "instead of saving it (tests/oracle/test_memory_torchtitan_compile.py), and each elementwise chain (norm, "
        "RoPE, SwiGLU) is one kernel a direction; uncompiled, TorchTitan's blocks run them aten call by call "
        "(projection/workload/ops_eager.py)")
    rms_norm_kernel: Literal["fused", "composite"] = Field(
        "fused", description="the kernels of PyTorch's eager RMSNorm (torch.nn.RMSNorm / F.rms_norm), where "
        "TorchTitan's blocks run uncompiled: 'fused' = one `_fused_rms_norm` kernel a direction (PyTorch 2.8 and "
        "later, pytorch/pytorch#153666), 'composite' = the aten chain of earlier releases and of TorchTitan's own 2024 "
        "RMSNorm (upcast, pow, mean, add, rsqrt, two products, cast: 8 kernels forward, 17 backward; "
        "projection/workload/ops_eager.py). Other layer implementations and compiled blocks are not affected")
    gqa_native_attention: bool = Field(
        False, description="the attention kernel takes K and V with their own (fewer) heads, so TorchTitan's "
        "repeat_kv copies are not made: Primus-Turbo's flash attention patched into TorchTitan's Llama models "
        "(primus_turbo.use_turbo_attention, primus/backends/torchtitan/models/llama3/model/model.py)")
    defer_embedding_wgrad: bool = False
    wgrad_deferral_limit: int = Field(0, ge=0)
    cross_entropy_fusion_impl: Literal["native", "te"] = "native"
    gemm_workspace_bytes: int | None = Field(None, ge=0)
    expandable_segments: bool = Field(
        False, description="PyTorch's caching allocator runs with expandable_segments:True (PYTORCH_ALLOC_CONF, "
        "PYTORCH_CUDA_ALLOC_CONF or PYTORCH_HIP_ALLOC_CONF): one growing segment per stream, mapped in 20 MiB pages, "
        "instead of a cudaMalloc per segment; changes the reserved peak (memory/allocator.py). TorchTitan's "
        "run_train.sh sets it, so the TorchTitan loader does")

    @property
    def eager_rms_norm(self) -> bool:
        """Whether TorchTitan's RMSNorm runs PyTorch's composite chain (rms_norm_kernel 'composite'): its final norm
        always, the blocks' norms where the blocks are not compiled (TorchTitan compiles the blocks only)."""
        return self.transformer_impl == "torchtitan" and self.rms_norm_kernel == "composite"


class TrainingSpec(Spec):
    """Per-step workload. Batch sizes count sequences; global batch = micro * dp * gradient-accumulation steps."""

    seq_length: int = Field(gt=0, le=2**27)  # 134M tokens a sample: past any long-context run
    micro_batch_size: int = Field(1, gt=0)
    global_batch_size: int | None = Field(None, gt=0, description="None = local_batch_size * dp")
    local_batch_size: int | None = Field(None, gt=0, description="sequences per DP rank per step when "
                                         "global_batch_size is None (TorchTitan); None = micro_batch_size")
    params_dtype: Literal["fp32", "bf16", "fp16"] = "bf16"
    fp8: Fp8Spec | None = None
    optimizer: OptimizerSpec = OptimizerSpec()
    gradient_accumulation_fusion: bool = True
    log_params_norm: bool = Field(False, description="Megatron --log-params-norm: the parameters' L2 norm is "
                                  "computed, all-reduced and read by the host every iteration")
    log_num_zeros_in_grad: bool = Field(False, description="Megatron --log-num-zeros-in-grad: zeros in the "
                                        "gradients counted per parameter tensor, all-reduced and read every iteration")
    check_for_nan_in_loss_and_grad: bool = Field(
        False, description="Megatron's NaN/Inf checks (on by default there; the Megatron and Primus loaders set it): "
        "the host reads isnan/isinf of each microbatch's loss and of each gradient bucket's norm before its reduction")
    check_for_nan_in_loss: bool | None = Field(
        None, description="the loss's isnan/isinf host reads alone, where a framework sets them apart from the "
        "gradient buckets' (Megatron-Bridge: rerun_state_machine.check_for_nan_in_loss, default on, beside "
        "ddp.check_for_nan_in_grad, default off); None: check_for_nan_in_loss_and_grad decides both")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="dropout after attention, the MLP and the embedding "
                           "(Megatron --hidden-dropout)")
    attention_dropout: float | None = Field(None, ge=0.0, lt=1.0, description="dropout of the attention "
                                            "probabilities (Megatron --attention-dropout; None: `dropout`)")
    attention_backend: Literal["flash", "fused", "unfused", "auto"] = "auto"
    fused_loss: bool = False
    kernels: KernelSpec = KernelSpec()

    @model_validator(mode="after")
    def _check(self) -> TrainingSpec:
        if self.params_dtype == "fp32" and self.fp8 is not None:
            raise ValueError("fp8 needs bf16 or fp16 params (params_dtype)")
        return self

    @property
    def attention_dropout_(self) -> float:
        return self.dropout if self.attention_dropout is None else self.attention_dropout

    @property
    def loss_nan_checks(self) -> bool:
        """Whether each microbatch's loss is checked for NaN/Inf with host reads (perf/checks.py)."""
        return self.check_for_nan_in_loss_and_grad if self.check_for_nan_in_loss is None else self.check_for_nan_in_loss

    def for_layer(self, layer_index: int, num_layers: int) -> TrainingSpec:
        """The training a decoder layer runs: without fp8 where Fp8Spec keeps it in bf16 (a bf16 layer is the same
        job's layer without fp8: Megatron-Core enters no fp8 autocast and no fp8_model_init for it)."""
        if self.fp8 is None or self.fp8.layer_in_fp8(layer_index, num_layers):
            return self
        return self.model_copy(update={"fp8": None})

    def resolved_global_batch(self, dp: int) -> int:
        if self.global_batch_size is not None:
            return self.global_batch_size
        return (self.local_batch_size or self.micro_batch_size) * dp

    def num_microbatches(self, dp: int) -> int:
        """Microbatches per step on each DP rank: gbs / (mbs * dp) (Megatron get_num_microbatches)."""
        return self.resolved_global_batch(dp) // (self.micro_batch_size * dp)
