"""`inspect` cites the config.json key each MoE / MLA field was read from, and the architecture where the file has no
such key (an audit found every model.moe.* field cited at n_routed_experts, q_lora_rank at kv_lora_rank's line, and
Qwen2.5's qkv bias at an 'attention_bias' key the file does not have)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from projection import api

HF = Path(__file__).resolve().parents[2].parent / "shared" / "fixtures" / "hf"


def _line(path: Path, key: str) -> int:
    return next(i for i, text in enumerate(path.read_text().splitlines(), 1) if text.strip().startswith(f'"{key}"'))


@pytest.mark.parametrize("name,field,key", [
    ("DeepSeek-V3", "model.mla.q_lora_rank", "q_lora_rank"),
    ("DeepSeek-V3", "model.mla.qk_head_dim", "qk_nope_head_dim"),
    ("DeepSeek-V3", "model.moe.top_k", "num_experts_per_tok"),
    ("DeepSeek-V3", "model.moe.expert_ffn_hidden_size", "moe_intermediate_size"),
    ("DeepSeek-V3", "model.moe.first_k_dense", "first_k_dense_replace"),
    ("Qwen3-30B-A3B", "model.moe.expert_ffn_hidden_size", "moe_intermediate_size"),
    ("Mixtral-8x7B-v0.1", "model.moe.top_k", "num_experts_per_tok")])
def test_each_field_cites_its_key(name: str, field: str, key: str) -> None:
    path = HF / f"{name}.config.json"
    if not path.is_file():
        pytest.skip("shared/fixtures/hf absent (user clone)")
    assert key in json.loads(path.read_text())
    assert api.load(path).origins[field] == f"{path}:{_line(path, key)} ({key})"


def test_a_value_the_file_does_not_hold_cites_the_architecture() -> None:
    path = HF / "Qwen2.5-7B-Instruct.config.json"
    if not path.is_file():
        pytest.skip("shared/fixtures/hf absent (user clone)")
    assert "attention_bias" not in json.loads(path.read_text())
    sc = api.load(path)
    assert sc.model.add_qkv_bias and sc.origins["model.add_qkv_bias"].startswith("architecture of qwen2")
