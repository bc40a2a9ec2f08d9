"""The GPT training job of the measured step checks (tests/oracle/test_performance_cpu.py on the CPU,
benchmarks/device_check.py on a GPU): the model in PyTorch, the scenario YAML that describes it to `projection`, and
the Megatron-style contiguous gradient buffer.

GPT-style decoder: LayerNorm, GELU 4h MLP, biases, learned positions, tied embeddings, attention =
`F.scaled_dot_product_attention(is_causal=True)` (the flash kernel of the device), fp32. Gradients accumulate into
one contiguous fp32 buffer (the autograd accumulation adds each weight gradient into its view: the scenario says
`gradient_accumulation_fusion: false`, which prices that add).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class Job:
    """Sizes of the job (FFN = 4 h)."""

    h: int
    heads: int
    layers: int
    vocab: int
    seq: int
    mbs: int


def config_text(job: Job, hardware: str, world: int = 1, name: str = "gpt-job") -> str:
    """The scenario YAML: `world` data-parallel ranks on one node, one microbatch per rank."""
    return f"""\
# the GPT job of tests/oracle/gpt_job.py on {world} process(es)
model: {{name: {name}, num_layers: {job.layers}, hidden_size: {job.h}, num_attention_heads: {job.heads},
        ffn_hidden_size: {4 * job.h}, gated_mlp: false, activation: gelu, norm: layernorm, add_bias_linear: true,
        add_qkv_bias: true, position_embedding: learned, max_position_embeddings: {job.seq}, tie_embeddings: true,
        vocab_size: {job.vocab}}}
training: {{seq_length: {job.seq}, micro_batch_size: {job.mbs}, global_batch_size: {job.mbs * world},
           params_dtype: fp32, attention_backend: flash, gradient_accumulation_fusion: false}}
plan: {{tp: 1, pp: 1, sharding: {{zero_stage: 0}}}}
cluster: {{hardware: {hardware}, nodes: 1, gpus_per_node: {world}}}
"""


class Block(nn.Module):
    def __init__(self, job: Job) -> None:
        super().__init__()
        h = job.h
        self.heads = job.heads
        self.ln1, self.qkv, self.proj = nn.LayerNorm(h), nn.Linear(h, 3 * h), nn.Linear(h, h)
        self.ln2, self.fc1, self.fc2 = nn.LayerNorm(h), nn.Linear(h, 4 * h), nn.Linear(4 * h, h)

    def forward(self, x: Any) -> Any:
        b, t, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, h))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, job: Job) -> None:
        super().__init__()
        self.vocab = job.vocab
        self.wte, self.wpe = nn.Embedding(job.vocab, job.h), nn.Embedding(job.seq, job.h)
        self.blocks = nn.ModuleList(Block(job) for _ in range(job.layers))
        self.ln_f = nn.LayerNorm(job.h)

    def forward(self, ids: Any, targets: Any) -> Any:
        x = self.wte(ids) + self.wpe.weight[: ids.shape[1]]
        for block in self.blocks:
            x = block(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # tied output layer
        return F.cross_entropy(logits.view(-1, self.vocab), targets.view(-1))


def contiguous_grads(model: nn.Module) -> torch.Tensor:
    """Megatron-style contiguous gradient buffer: each parameter's .grad is a view into it, so autograd accumulates
    into the buffer (zero it at the start of a step)."""
    params = list(model.parameters())
    grads = torch.zeros(sum(p.numel() for p in params), device=params[0].device)
    offset = 0
    for p in params:
        p.grad = grads[offset: offset + p.numel()].view_as(p)
        offset += p.numel()
    return grads
