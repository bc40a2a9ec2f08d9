"""HuggingFace config.json: what the file says of training (its checkpoint dtype) and what it leaves to flags."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from projection import api

LLAMA = {"model_type": "llama", "hidden_size": 512, "intermediate_size": 1408, "num_attention_heads": 8,
         "num_key_value_heads": 8, "num_hidden_layers": 4, "vocab_size": 32000, "max_position_embeddings": 2048}


@pytest.mark.parametrize(("torch_dtype", "params_dtype", "from_file"),
                         [("bfloat16", "bf16", True), ("float16", "fp16", True), ("float32", "bf16", False),
                          (None, "bf16", False)])
def test_checkpoint_dtype_sets_training_dtype_only_when_16_bit(tmp_path: Path, torch_dtype: str | None,
                                                               params_dtype: str, from_file: bool) -> None:
    """A float32 checkpoint is not an fp32 training job (mixed-precision runs often save float32 weights): it keeps
    the bf16 default, which --set overrides."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**LLAMA, **({"torch_dtype": torch_dtype} if torch_dtype else {})}))
    sc = api.load(path, hardware="h100-sxm")
    assert sc.training.params_dtype == params_dtype
    assert ("(torch_dtype)" in sc.origins.get("training.params_dtype", "")) == from_file
    assert api.load(path, hardware="h100-sxm", overrides={"training.params_dtype": "fp32"}).training.params_dtype \
        == "fp32"
