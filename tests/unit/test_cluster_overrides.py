"""`--set cluster.KEY=VALUE` is projection's own key in every input format: applied after the file is read, so a
Primus experiment does not merge it into the Megatron arguments (where it was silently dropped) and a TorchTitan TOML
does not take it for an unknown section; a misspelt cluster key is still refused with the key named."""

from __future__ import annotations

from pathlib import Path

import pytest

from projection import api
from projection.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO.parent / "shared" / "fixtures"
CONFIGS = [REPO / "examples" / "llama3_8b_inline.yaml",
           FIXTURES / "primus" / "examples" / "megatron" / "configs" / "MI300X" / "llama3.1_8B-BF16-pretrain.yaml",
           FIXTURES / "megatron" / "gpt3_mcore_te_tp1_pp1_resume_torch_dist_dist_optimizer" / "model_config.yaml",
           FIXTURES / "hf" / "Meta-Llama-3.1-8B.config.json",
           FIXTURES / "torchtitan" / "deepseek_v3_16b.toml"]
SET = ["cluster.oversubscription=4", "cluster.inter_node_topology=fat_tree"]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.suffix + ":" + p.parent.name)
def test_cluster_keys_apply_in_every_format(config: Path) -> None:
    if not config.is_file():
        pytest.skip(f"{config} absent (user clone without shared fixtures)")
    sc = api.load(config, overrides=SET)
    assert (sc.cluster.oversubscription, sc.cluster.inter_node_topology) == (4.0, "fat_tree")
    assert sc.origins["cluster.oversubscription"] == "<command line> (--set cluster.oversubscription)"


def test_misspelt_cluster_key_is_named() -> None:
    with pytest.raises(ConfigError) as info:
        api.load(REPO / "examples" / "llama3_8b_inline.yaml", overrides=["cluster.oversubscripton=4"])
    assert "cluster.oversubscripton" in str(info.value)


def test_nested_mapping_and_flag_precedence() -> None:
    example = REPO / "examples" / "llama3_8b_inline.yaml"
    sc = api.load(example, overrides={"cluster": {"oversubscription": 4, "inter_node_topology": "fat_tree"}})
    assert (sc.cluster.oversubscription, sc.cluster.inter_node_topology) == (4.0, "fat_tree")
    # --nodes (and --hardware, --gpus-per-node) win over --set cluster.*
    sc = api.load(example, nodes=2, overrides=["cluster.nodes=4"])
    assert sc.cluster.nodes == 2
