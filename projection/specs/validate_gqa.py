"""The KV-head rule of tensor parallelism: which numbers of KV heads (query groups) a TP size can split.

- Megatron-Core 0.16 (transformer/transformer_config.py __post_init__): num_query_groups must be "a multiple or
  divisor of tensor_model_parallel_size". With fewer groups than TP ranks (transformer/attention.py SelfAttention,
  get_query_key_value_tensors) the fused linear_qkv stays column-parallel over all (heads + 2 groups) heads, its
  output is all-gathered over TP along the last dim and each rank keeps heads / tp query heads of its group and the
  group's one K and one V head (priced in workload/ops_attention.gqa_attention). Megatron-LM, Primus's Megatron
  backend and Megatron-Bridge run this attention, and so does a native scenario unless it asks for TorchTitan's.
- TorchTitan (v0.2.2, models/llama3/model/model.py and infra/parallelize.py): wk and wv are ColwiseParallel, so a rank
  holds n_kv_heads * head_dim / tp columns of each, less than one head when n_kv_heads < tp, and Attention.forward's
  `xk.view(bs, seqlen, -1, head_dim)` cannot make whole heads of them; later TorchTitan refuses it at configuration
  ("tensor_parallel_degree (tp) must divide n_kv_heads"). So TorchTitan scenarios need tp to divide the KV heads.
"""

from __future__ import annotations

from projection.specs.model import ModelSpec
from projection.specs.plan import ParallelPlan
from projection.specs.training import TrainingSpec


def runs_megatron_attention(framework: str, training: TrainingSpec, plan: ParallelPlan) -> bool:
    """Whether the attention modelled is Megatron-Core's SelfAttention (not TorchTitan's DTensor-TP Attention)."""
    return ("torchtitan" not in framework and training.kernels.transformer_impl != "torchtitan"
            and plan.tp_style == "megatron")


def kv_heads_problem(framework: str, model: ModelSpec, training: TrainingSpec,
                     plan: ParallelPlan) -> tuple[str, str] | None:
    """(message, fix) where tp cannot split the model's KV heads, else None (module docstring)."""
    tp, groups = plan.tp, model.kv_heads
    if model.mla is not None or groups % tp == 0:
        return None
    if runs_megatron_attention(framework, training, plan):
        if tp % groups == 0:
            return None
        return (f"num_query_groups = {groups} is neither a multiple nor a divisor of tp = {tp} (Megatron-Core: "
                f"num_query_groups must be a multiple or a divisor of tp)",
                f"use a tp that is a multiple or a divisor of {groups}")
    return (f"tp = {tp} does not divide the number of KV heads = {groups} (TorchTitan shards wk and wv column-wise "
            f"over tp: fewer KV heads than tp ranks leave a rank part of a head)",
            f"use a tp that divides {groups} (or more KV heads)")
