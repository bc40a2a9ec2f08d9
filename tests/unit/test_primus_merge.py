"""Primus experiment merge rules at the dict level (config-formats.md §2.2, §2.6), on small files in tmp_path.

Nothing here needs the Megatron or TorchTitan converters: `resolve_experiment` stops at the trainer config Primus
would build.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from projection.errors import ConfigError
from projection.formats.primus import (
    Tracked,
    combine_module_and_model,
    is_primus_experiment,
    load_primus,
    load_primus_yaml,
    merge_into,
    resolve_experiment,
    substitute_env,
)
from projection.specs.hardware import load_device
from projection.specs.scenario import Origin, build_scenario


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# ---- ${VAR} substitution and coercion ----

@pytest.mark.parametrize(("text", "env", "expected"), [
    ("${A}", {"A": "x"}, "x"),
    ("${TP:1}", {}, 1),                       # int after substitution
    ("${TP:1}", {"TP": "8"}, 8),              # the environment beats the default
    ("${LR:1.5e-3}", {}, 0.0015),
    ("${FLAG:true}", {}, True),
    ("${FLAG:FALSE}", {}, False),             # any case
    ("${X:null}", {}, "null"),                # stays the string "null" here
    ("a${X:1}", {}, "a1"),                    # text around the substitution: still a string
    ("${A:1}${B:2}", {}, 12),                 # the whole result is coerced (Primus)
    ("${X:}", {}, ""),                        # empty default
    ("${URL:http://h:80/x}", {}, "http://h:80/x"),  # a default may hold ':'
    ("${E:5}", {"E": ""}, ""),                # set-but-empty counts as set
    ("1", {}, "1"),                           # no substitution: unchanged, even if it looks numeric
    ("true", {}, "true"),
    ("${PRIMUS_MODEL:llama2_7B}.yaml", {}, "llama2_7B.yaml"),
])
def test_substitution_and_coercion(text: str, env: dict[str, str], expected: object) -> None:
    out = substitute_env(text, env)
    assert out == expected
    assert type(out) is type(expected)


def test_unset_variable_without_default_names_file_line_key(tmp_path: Path) -> None:
    f = write(tmp_path / "a.yaml", "x: 1\nblock:\n  path: ${DATA_DIR}/train\n")
    with pytest.raises(ConfigError) as err:
        load_primus_yaml(f, {})
    p = err.value.problems[0]
    assert (p.file, p.line, p.key) == (str(f), 3, "block.path")
    assert "DATA_DIR" in p.message
    assert p.fix == "set DATA_DIR in the environment or give a default ${DATA_DIR:value}"


def test_file_values_typed_only_when_substituted(tmp_path: Path) -> None:
    f = write(tmp_path / "a.yaml", 'q: "1"\nu: 1\ns: ${S:1}\nlst: ["${A:2}", 3]\nn: ${N:null}\n')
    data = load_primus_yaml(f, {}).data
    assert data == {"q": "1", "u": 1, "s": 1, "lst": [2, 3], "n": "null"}


# ---- extends ----

def test_extends_relative_chain_order_and_lists(tmp_path: Path) -> None:
    write(tmp_path / "common.yaml", "a: 1\nb: {x: 1, y: 1}\nlst: [1, 2, 3]\nonly_common: c\n")
    write(tmp_path / "presets/left.yaml", "extends: ../common.yaml\na: 2\nb: {y: 2}\n")   # scalar extends
    write(tmp_path / "presets/right.yaml", "a: 3\nlst: [9]\n")
    top = write(tmp_path / "presets/top.yaml", "extends:\n  - left.yaml\n  - right.yaml\nb:\n  z: 4\n")
    t = load_primus_yaml(top, {})
    assert t.data == {"a": 3, "b": {"x": 1, "y": 2, "z": 4}, "lst": [9], "only_common": "c"}
    assert "extends" not in t.data
    assert t.origins[("a",)] == Origin(str(tmp_path / "presets/right.yaml"), 1, "a")
    assert t.origins[("b", "y")] == Origin(str(tmp_path / "presets/left.yaml"), 3, "b.y")
    assert t.origins[("b", "z")] == Origin(str(top), 5, "b.z")
    assert t.origins[("only_common",)].file == str(tmp_path / "common.yaml")


def test_own_keys_beat_extended_ones_and_extends_may_use_variables(tmp_path: Path) -> None:
    write(tmp_path / "base_a.yaml", "k: from_a\n")
    f = write(tmp_path / "x.yaml", "extends: [\"${BASE:base_a}.yaml\"]\nk: own\n")
    assert load_primus_yaml(f, {}).data == {"k": "own"}
    write(tmp_path / "base_b.yaml", "k2: from_b\n")
    assert load_primus_yaml(f, {"BASE": "base_b"}).data == {"k2": "from_b", "k": "own"}


def test_extends_missing_file_and_loop(tmp_path: Path) -> None:
    f = write(tmp_path / "x.yaml", "a: 1\nextends:\n  - nope.yaml\n")
    with pytest.raises(ConfigError) as err:
        load_primus_yaml(f, {})
    assert err.value.problems[0].line == 2 and "nope.yaml" in err.value.problems[0].message
    write(tmp_path / "p.yaml", "extends: q.yaml\n")
    write(tmp_path / "q.yaml", "extends: p.yaml\n")
    with pytest.raises(ConfigError, match="loop"):
        load_primus_yaml(tmp_path / "p.yaml", {})


# ---- merge primitives ----

def _t(data: dict[str, object], file: str) -> Tracked:
    def walk(d: dict[str, object], prefix: tuple[str, ...]) -> dict[tuple[str, ...], Origin]:
        out = {}
        for k, v in d.items():
            out[(*prefix, k)] = Origin(file, None, ".".join((*prefix, k)))
            if isinstance(v, dict):
                out.update(walk(v, (*prefix, k)))
        return out
    return Tracked(data, walk(data, ()))


def test_override_path_turns_null_strings_into_none() -> None:
    base = _t({"a": 1, "s": {"x": 1}}, "base")
    merge_into(base, _t({"a": "null", "s": {"y": "null"}, "lst": ["null"]}, "ov"), null_to_none=True)
    assert base.data == {"a": None, "s": {"x": 1, "y": None}, "lst": ["null"]}
    plain = _t({"a": 1}, "base")
    merge_into(plain, _t({"a": "null"}, "preset"))
    assert plain.data == {"a": "null"}


def test_replacing_a_dict_drops_its_old_origins() -> None:
    base = _t({"s": {"x": 1, "y": 2}}, "base")
    merge_into(base, _t({"s": 5}, "ov"))
    assert base.data == {"s": 5}
    assert set(base.origins) == {("s",)} and base.origins[("s",)].file == "ov"


def test_module_beats_model_key_by_key() -> None:
    module = _t({"seq_length": 1024, "sec": {"a": 1}}, "module")
    model = _t({"seq_length": 4096, "num_layers": 8, "sec": {"b": 2}}, "model")
    out = combine_module_and_model(module, model)
    assert out.data == {"seq_length": 1024, "sec": {"a": 1}, "num_layers": 8}  # shallow: model's sec dropped whole
    assert out.origins[("seq_length",)].file == "module" and out.origins[("num_layers",)].file == "model"


# ---- whole experiments against a fake Primus checkout ----

@pytest.fixture
def root(tmp_path: Path) -> Path:
    r = tmp_path / "primus_root"
    mods, models = r / "primus/configs/modules", r / "primus/configs/models"
    write(mods / "module_base.yaml", "trainable: false\n")
    write(mods / "megatron/trainer_base.yaml", "extends:\n  - ../module_base.yaml\ntrainable: true\n"
          "micro_batch_size: 2\nglobal_batch_size: 128\nseq_length: 4096\nbf16: true\n"
          "train_data_path: null\nlabel: x\nlr: 1.0e-5\nmy_block:\n  enable: true\n")
    write(mods / "megatron/pre_trainer.yaml", "extends:\n  - trainer_base.yaml\nglobal_batch_size: 16\n"
          "seq_length: 1024\n")
    write(models / "megatron/toy_base.yaml", "swiglu: true\nnum_layers: 2\n")
    write(models / "megatron/toy.yaml", "extends: [toy_base.yaml]\nnum_layers: 4\nhidden_size: 64\n"
          "seq_length: 8192\n")
    write(models / "megatron/big.yaml", "num_layers: 80\n")
    write(mods / "torchtitan/pre_trainer.yaml", "training:\n  seq_len: 2048\n  local_batch_size: 8\n"
          "parallelism:\n  data_parallel_shard_degree: -1\n")
    write(models / "torchtitan/tiny.yaml", "model:\n  name: llama3\n  flavor: debugmodel\n")
    return r


def experiment(tmp_path: Path, body: str, framework: str = "megatron", model: str = "${PRIMUS_MODEL:toy}.yaml",
               config: str = "pre_trainer.yaml") -> Path:
    return write(tmp_path / "exp.yaml", f"work_group: amd\nmodules:\n  pre_trainer:\n    framework: {framework}\n"
                 f"    config: {config}\n    model: {model}\n    overrides:\n{body}")


def test_megatron_experiment_merge_order_and_origins(tmp_path: Path, root: Path) -> None:
    exp = experiment(tmp_path, "      micro_batch_size: ${MBS:4}\n      train_data_path: ${D:null}\n"
                               "      label: a${X:1}\n")
    e = resolve_experiment(exp, primus_root=root, env={})
    p = e.params
    assert (e.framework, e.module) == ("megatron", "pre_trainer")
    assert p["seq_length"] == 1024            # module (pre_trainer) beats the model preset's 8192
    assert p["global_batch_size"] == 16 and p["bf16"] is True and p["trainable"] is True
    assert p["num_layers"] == 4 and p["swiglu"] is True and p["hidden_size"] == 64
    assert p["micro_batch_size"] == 4         # int after substitution
    assert p["train_data_path"] is None       # "${D:null}" -> "null" -> None through overrides
    assert p["label"] == "a1"
    assert p["model"] == "toy.yaml"           # the preset has no `model` key: named after the file
    mods = root / "primus/configs/modules/megatron"
    assert e.origins["seq_length"] == Origin(str(mods / "pre_trainer.yaml"), 4, "seq_length")
    assert e.origins["num_layers"].file == str(root / "primus/configs/models/megatron/toy.yaml")
    assert e.origins["micro_batch_size"] == Origin(str(exp), 8, "modules.pre_trainer.overrides.micro_batch_size")
    assert e.origins["trainable"].file == str(mods / "trainer_base.yaml")
    assert set(e.origins) >= set(p)


def test_cli_overrides_come_last(tmp_path: Path, root: Path) -> None:
    exp = experiment(tmp_path, "      micro_batch_size: 4\n")
    e = resolve_experiment(exp, {"micro_batch_size": 8, "modules.pre_trainer.seq_length": 2048,
                                 "train_data_path": "null"}, primus_root=root, env={})
    assert (e.params["micro_batch_size"], e.params["seq_length"], e.params["train_data_path"]) == (8, 2048, None)
    assert e.origins["micro_batch_size"] == Origin("--set", None, "micro_batch_size")
    assert e.origins["seq_length"] == Origin("--set", None, "modules.pre_trainer.seq_length")


def test_environment_picks_the_model(tmp_path: Path, root: Path) -> None:
    exp = experiment(tmp_path, "      micro_batch_size: 4\n")
    assert resolve_experiment(exp, primus_root=root, env={"PRIMUS_MODEL": "big"}).params["num_layers"] == 80


def test_torchtitan_overrides_nest(tmp_path: Path, root: Path) -> None:
    exp = experiment(tmp_path, "      training:\n        seq_len: 8192\n", framework="torchtitan",
                     model="tiny.yaml")
    e = resolve_experiment(exp, {"training.local_batch_size": 2}, primus_root=root, env={})
    assert e.params["training"] == {"seq_len": 8192, "local_batch_size": 2}
    assert e.params["parallelism"] == {"data_parallel_shard_degree": -1}
    assert e.params["model"] == {"name": "llama3", "flavor": "debugmodel"}
    assert e.origins["training.seq_len"].line == 9 and e.origins["training.local_batch_size"].file == "--set"


def test_missing_presets_list_what_exists(tmp_path: Path, root: Path) -> None:
    exp = experiment(tmp_path, "      micro_batch_size: 4\n", model="nope.yaml")
    with pytest.raises(ConfigError) as err:
        resolve_experiment(exp, primus_root=root, env={})
    p = err.value.problems[0]
    assert p.key == "modules.pre_trainer.model" and p.line == 6 and p.file == str(exp)
    assert "big.yaml" in p.message and "toy.yaml" in p.message
    with pytest.raises(ConfigError) as err:   # without a checkout: our models/ folder, and the fix says so
        resolve_experiment(exp, env={}, models_dir=root / "primus/configs/models")
    assert "--primus-root" in (err.value.problems[0].fix or "") and "toy.yaml" in err.value.problems[0].message
    exp = experiment(tmp_path, "      micro_batch_size: 4\n", config="nope_trainer.yaml")
    with pytest.raises(ConfigError, match="module config 'nope_trainer.yaml'"):
        resolve_experiment(exp, primus_root=root, env={})
    with pytest.raises(ConfigError, match="pre_trainer.yaml"):   # the built-in ones are listed
        resolve_experiment(exp, env={})


def test_unsupported_framework_and_missing_keys(tmp_path: Path, root: Path) -> None:
    with pytest.raises(ConfigError) as err:
        resolve_experiment(experiment(tmp_path, "      a: 1\n", framework="maxtext"), primus_root=root, env={})
    assert "megatron or torchtitan" in (err.value.problems[0].fix or "")
    with pytest.raises(ConfigError) as err:  # a recipe name: the run's own YAML is what projection reads
        resolve_experiment(experiment(tmp_path, "      a: 1\n", framework="megatron_bridge"), primus_root=root, env={})
    assert "run_config.yaml" in (err.value.problems[0].fix or "")
    write(tmp_path / "m.yaml", "modules:\n  pre_trainer:\n    framework: megatron\n    config: pre_trainer.yaml\n")
    with pytest.raises(ConfigError, match="needs a `model`"):
        resolve_experiment(tmp_path / "m.yaml", primus_root=root, env={})
    write(tmp_path / "n.yaml", "modules:\n  benchmark: {}\n")
    with pytest.raises(ConfigError, match="no trainer module"):
        resolve_experiment(tmp_path / "n.yaml", primus_root=root, env={})


def test_builtin_module_defaults_and_model_base(tmp_path: Path) -> None:
    models = tmp_path / "models"
    write(models / "toy.yaml", "num_layers: 4\nhidden_size: 64\nseq_length: 8192\n")
    exp = experiment(tmp_path, "      micro_batch_size: 4\n", model="toy")   # .yaml is optional
    e = resolve_experiment(exp, models_dir=models, env={})
    p = e.params
    assert p["seq_length"] == 1024 and p["global_batch_size"] == 16 and p["use_distributed_optimizer"] is True
    # Primus's model-side base (llama_base -> language_model) under the self-contained preset
    assert p["swiglu"] is True and p["sequence_parallel"] is True and p["normalization"] == "RMSNorm"
    assert p["hidden_dropout"] == 0.0 and p["add_bias_linear"] is False
    assert e.origins["seq_length"] == Origin("primus@fd1eeab:primus/configs/modules/megatron/pre_trainer.yaml", 8,
                                             "seq_length")
    assert e.origins["hidden_dropout"].file.endswith("models/megatron/llama_base.yaml")
    assert e.origins["sequence_parallel"].file.endswith("models/megatron/language_model.yaml")
    assert e.origins["num_layers"].file == str(models / "toy.yaml")


def test_is_primus_experiment() -> None:
    assert is_primus_experiment({"modules": {"pre_trainer": {"framework": "megatron"}}})
    assert is_primus_experiment({"modules": {"post_trainer": {"model": "x.yaml", "config": "sft_trainer.yaml"}}})
    assert not is_primus_experiment({"modules": {"benchmark": {"framework": "megatron"}}})
    assert not is_primus_experiment({"modules": {"pre_trainer": "megatron"}})
    assert not is_primus_experiment({"modules": [{"name": "pre_trainer"}]})
    assert not is_primus_experiment({"num_layers": 2})
    assert not is_primus_experiment([1, 2])


def test_set_keys_a_megatron_experiment_would_not_read_are_refused(tmp_path: Path, root: Path) -> None:
    """Primus merges any `--set` key into the trainer's arguments; one that projection does not read and the
    experiment does not hold would change nothing, so it is refused (as the Megatron loader refuses it), and dotted
    model./training./plan./cluster. keys are canonical keys, applied after the Megatron arguments."""
    write(root / "primus/configs/models/megatron/toy.yaml",
          "num_layers: 4\nhidden_size: 64\nnum_attention_heads: 4\nffn_hidden_size: 256\n"
          "tokenizer_type: NullTokenizer\nvocab_size: 1000\nmax_position_embeddings: 1024\n")
    exp = experiment(tmp_path, "      lr: 1.0e-4\n      my_block:\n        enable: false\n")
    # dropped and kept for build_scenario, which reports them with the layout's own problems
    unknown = load_primus(exp, {"bogus_key": 5, "tensor-model-parallel-size": 2, "lr": 3e-4, "my_block.enable": True,
                                "my_block.nope": 1, "seed": 3, "model": "big.yaml"}, primus_root=root, env={}).deferred
    # lr and my_block.enable: the experiment's own keys; seed: a key of Primus's Megatron module configs
    assert [(p.key, p.fix) for p in unknown] == [
        ("model", "edit modules.pre_trainer.model in the experiment, or --set the architecture's own keys "
                  "(num_layers, hidden_size, ...)"),
        ("bogus_key", "use a Megatron argument name (e.g. tensor_model_parallel_size) or a canonical key (e.g. "
                      "training.global_batch_size)"),
        ("tensor-model-parallel-size", "did you mean tensor_model_parallel_size?"),
        ("my_block.nope", "use a Megatron argument name (e.g. tensor_model_parallel_size) or a canonical key (e.g. "
                          "training.global_batch_size)")]
    assert "--primus-root" not in unknown[1].message  # a checkout was given: its keys are the keys
    unknown = load_primus(experiment(tmp_path / "builtin", "      lr: 1.0e-4\n"), {"bogus_key": 5},
                          models_dir=root / "primus/configs/models", env={}).deferred
    assert "pass --primus-root PATH to read your version's" in unknown[0].message
    raw = load_primus(exp, {"training.global_batch_size": 64, "modules.pre_trainer.overrides.micro_batch_size": 1,
                            "plan.tp": 2}, primus_root=root, env={})
    assert raw.get("training.global_batch_size") == 64 and raw.get("training.micro_batch_size") == 1
    assert raw.get("plan.tp") == 2 and raw.origins["plan.tp"] == Origin("--set", None, "plan.tp")


def test_shipped_primus_key_names_are_the_module_configs_keys() -> None:
    """primus_keys.PRIMUS_MEGATRON_KEYS against the Primus @fd1eeab module configs in ../shared/fixtures."""
    from projection.formats.primus_keys import PRIMUS_MEGATRON_KEYS

    modules = Path(__file__).resolve().parents[3] / "shared/fixtures/primus/primus/configs/modules"
    if not modules.is_dir():
        pytest.skip(f"{modules} is absent (the shared fixtures are not in a user's clone)")
    files = [*sorted((modules / "megatron").glob("*.yaml")), modules / "module_base.yaml"]
    keys = {k for f in files for k in load_primus_yaml(f, {}).data} - {"extends"}
    assert keys == PRIMUS_MEGATRON_KEYS


def test_override_keys_the_module_and_model_do_not_hold_are_refused(tmp_path: Path, root: Path) -> None:
    """Primus refuses an `overrides:` key that the module config and the model preset do not hold (yaml_utils
    override_namespace), nested keys too; projection used to drop a misspelt key and project the default instead."""
    exp = experiment(tmp_path, "      micro_batch_sise: 4\n      lr: 1.0e-4\n      my_block:\n        enabel: true\n")
    deferred = resolve_experiment(exp, primus_root=root, env={}).deferred
    got = [(p.key, p.line, p.fix) for p in deferred]
    assert got == [("modules.pre_trainer.overrides.micro_batch_sise", 8,
                    "did you mean micro_batch_size, global_batch_size?"),
                   ("modules.pre_trainer.overrides.my_block.enabel", 11, "did you mean enable?")]
    assert all(p.file == str(exp) and "Primus refuses it" in p.message for p in deferred)
    # reported together with the layout's own problems: micro batch 3 does not divide the global batch of 16
    write(root / "primus/configs/models/megatron/full.yaml", "num_layers: 2\nhidden_size: 64\nnum_attention_heads: 4\n"
          "ffn_hidden_size: 256\nvocab_size: 1000\nmax_position_embeddings: 1024\n")
    raw = load_primus(experiment(tmp_path / "layout", "      micro_batch_sise: 4\n      micro_batch_size: 3\n",
                                 model="full.yaml"), primus_root=root, env={})
    raw.set("cluster.nodes", 1, Origin("--nodes"))
    with pytest.raises(ConfigError) as err:
        build_scenario(raw, load_device("h100-sxm"))
    problems = err.value.problems
    assert [p.key for p in problems] == ["modules.pre_trainer.overrides.micro_batch_sise", "global_batch_size"]
    assert "not divisible by micro batch * dp = 3 * 8" in problems[1].message
    # a model-preset key may be overridden, and the TorchTitan module's sections are checked key by key
    assert resolve_experiment(experiment(tmp_path, "      swiglu: false\n"), primus_root=root,
                              env={}).params["swiglu"] is False
    with pytest.raises(ConfigError, match="training.local_batch_sise"):
        resolve_experiment(experiment(tmp_path, "      training:\n        local_batch_sise: 2\n",
                                      framework="torchtitan", model="tiny.yaml"), primus_root=root, env={})


def test_without_a_checkout_override_keys_are_not_refused(tmp_path: Path) -> None:
    """Without --primus-root no list says which keys the user's Primus holds (versions add and rename them: a newer
    upstream example overrides use_turbo_grouped_mlp), so an override is not refused; `--set` of a key of Primus's
    model bases (init_method_std) is accepted too."""
    models = tmp_path / "models"
    write(models / "toy.yaml", "num_layers: 4\nhidden_size: 64\nnum_attention_heads: 4\nffn_hidden_size: 256\n"
          "vocab_size: 1000\nmax_position_embeddings: 1024\n")
    exp = experiment(tmp_path, "      init_method_std: 0.008\n      use_turbo_grouped_mlp: true\n", model="toy")
    p = resolve_experiment(exp, models_dir=models, env={}).params
    assert p["init_method_std"] == 0.008 and p["use_turbo_grouped_mlp"] is True
    load_primus(experiment(tmp_path / "set", "      micro_batch_size: 4\n", model="toy"),
                {"init_method_std": 0.01}, models_dir=models, env={})


def test_shipped_primus_model_base_keys_are_the_bases_keys() -> None:
    """primus_keys.PRIMUS_MODEL_BASE_KEYS against Primus @fd1eeab's language_model.yaml and primus_megatron_model.yaml
    in ../shared/fixtures."""
    from projection.formats.primus_keys import PRIMUS_MODEL_BASE_KEYS

    models = Path(__file__).resolve().parents[3] / "shared/fixtures/primus/primus/configs/models/megatron"
    if not models.is_dir():
        pytest.skip(f"{models} is absent (the shared fixtures are not in a user's clone)")
    keys = {k for f in ("language_model.yaml", "primus_megatron_model.yaml")
            for k in load_primus_yaml(models / f, {}).data} - {"extends"}
    assert keys == PRIMUS_MODEL_BASE_KEYS
