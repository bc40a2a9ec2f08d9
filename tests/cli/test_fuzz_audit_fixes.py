"""Inputs a fuzzing audit of the CLI found breaking the bad-input rule (a traceback, or a hang growing memory, where
the rule wants exit 2 with the file, the key and the fix); each failed before its fix."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from projection.cli import main
from tests.unit.test_bridge_loader import SMALL

REPO = Path(__file__).resolve().parents[2]
QWEN3_MOE = {"model_type": "qwen3_moe", "hidden_size": 2048, "num_hidden_layers": 48, "num_attention_heads": 32,
             "num_key_value_heads": 4, "intermediate_size": 6144, "vocab_size": 151936, "head_dim": 128,
             "max_position_embeddings": 40960, "num_experts": 128, "num_experts_per_tok": 8,
             "moe_intermediate_size": 768, "rope_theta": 1000000.0, "tie_word_embeddings": False}
ARGS = ("--num-layers 4 --hidden-size 512 --num-attention-heads 8 --seq-length 1024 --max-position-embeddings 1024 "
        "--micro-batch-size 1 --global-batch-size 8 --vocab-size 32000 --bf16")


def refused(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


def test_hf_values_of_the_wrong_kind_are_listed_at_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**QWEN3_MOE, "num_hidden_layers": 10**9, "rope_theta": "abc",
                                "tie_word_embeddings": "false", "mlp_only_layers": -1}), encoding="utf-8")
    err = refused(capsys, ["memory", "--config", str(path)])  # the 10**9-layer pattern used to hang
    for key, text in (("num_hidden_layers", "at most 10000"), ("rope_theta", "expected a positive number"),
                      ("tie_word_embeddings", "expected true or false"), ("mlp_only_layers", "list of layer")):
        assert f"key '{key}'" in err and text in err, err
    cfg = {k: v for k, v in QWEN3_MOE.items() if k != "num_experts_per_tok"}
    path.write_text(json.dumps({**cfg, "model_type": "deepseek_v3", "n_routed_experts": 8}), encoding="utf-8")
    err = refused(capsys, ["memory", "--config", str(path)])
    assert all(f"key '{k}': required key is missing" in err for k in ("kv_lora_rank", "num_experts_per_tok")), err
    path.write_text(json.dumps({"model_type": "llava", "text_config": 5, "architectures": ["x"]}), encoding="utf-8")
    assert "key 'text_config': expected a mapping" in refused(capsys, ["memory", "--config", str(path)])


def test_megatron_scripts_and_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bomb = tmp_path / "train.sh"
    bomb.write_text("X=aaaaaaaaaa\n" + 'X="$X$X"\n' * 40 + f"torchrun pretrain_gpt.py {ARGS} --data-path $X\n",
                    encoding="utf-8")
    assert "$X grows past 1,000,000 characters" in refused(capsys, ["memory", "--config", str(bomb)])
    args = tmp_path / "args.txt"
    args.write_text(f"{ARGS} --pipeline-model-parallel-size 0 --num-layers-per-virtual-pipeline-stage 1\n")
    assert "Input should be greater than 0" in refused(capsys, ["memory", "--config", str(args)])
    args.write_text(f'{ARGS} --pipeline-model-parallel-layout "E((t|)*999999999999)L"\n')
    assert "expands to more than 1,000,000 symbols" in refused(capsys, ["memory", "--config", str(args)])


def test_bridge_values_of_the_wrong_kind(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bridge.yaml"
    path.write_text(SMALL.replace("  pipeline_model_parallel_size: 2\n", "  pipeline_model_parallel_size: abc\n")
                    + "comm_overlap:\n  tp_comm_overlap: true\n", encoding="utf-8")
    assert "expected an integer, got 'abc'" in refused(capsys, ["memory", "--config", str(path), "--nodes", "1"])
    path.write_text(SMALL.replace("  sequence_length: 8192\n", "  sequence_length: [1]\n"), encoding="utf-8")
    assert "must be a whole number of tokens" in refused(capsys, ["memory", "--config", str(path), "--nodes", "1"])


def test_numbers_past_pythons_digit_limit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = (REPO / "examples" / "llama3_8b_inline.yaml").read_text(encoding="utf-8")
    path = tmp_path / "big.yaml"
    path.write_text(text.replace("hidden_size: 4096", "hidden_size: " + "9" * 5000), encoding="utf-8")
    line = 1 + text[:text.index("hidden_size: 4096")].count("\n")
    err = refused(capsys, ["memory", "--config", str(path)])
    assert f"{path}:{line}: key 'hidden_size': a number has more than 4300 digits" in err, err
    # a --set value is named by its key, not blamed on the config file (second fuzz audit)
    err = refused(capsys, ["memory", "--config", str(REPO / "examples" / "llama3_8b_inline.yaml"),
                           "--set", "plan.tp=" + "9" * 5000])
    assert err.startswith("error: --set: key 'plan.tp': a number has more than 4300 digits"), err
    hf = tmp_path / "config.json"
    hf.write_text('{"hidden_size": ' + "9" * 5000 + ', "num_attention_heads": 32}\n', encoding="utf-8")
    assert f"{hf}:1: key 'hidden_size': a number" in refused(capsys, ["memory", "--config", str(hf)])


def test_torchtitan_compile_components_must_be_a_list(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = (REPO / "benchmarks" / "torchtitan_runs" / "a100_llama3_8b_fsdp64_sel_op.toml").read_text(encoding="utf-8")
    path = tmp_path / "job.toml"
    path.write_text(text.replace("[compile]\nenable = false", "[compile]\nenable = true\ncomponents = 0"),
                    encoding="utf-8")
    assert "key 'compile.components': expected a list" in refused(capsys, ["memory", "--config", str(path)])


def test_benchmark_logs_with_impossible_times_and_gzip_bombs(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    from tests.unit.test_import_audit_fixes import _nccl_log

    log = tmp_path / "ar.log"
    log.write_text(_nccl_log().replace("  6000.00 ", "    -6.00 ", 1), encoding="utf-8")
    assert main(["calibrate", "import", str(log), "--out", str(tmp_path / "c.json")]) == 0
    assert "skipped 1 malformed data row" in capsys.readouterr().err
    bomb = tmp_path / "trace.json.gz"
    bomb.write_bytes(gzip.compress(b"{" + b" " * (200 << 20) + b"}", compresslevel=9))
    err = refused(capsys, ["calibrate", "import", str(bomb), "--out", str(tmp_path / "d.json")])
    assert "unpacks to more than" in err and not (tmp_path / "d.json").exists()


def test_an_unreadable_megatron_size_is_one_problem_quoted_short(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    args = tmp_path / "args.txt"
    args.write_text(ARGS.replace("--hidden-size 512", "--hidden-size " + "9x" * 3000) + "\n", encoding="utf-8")
    err = refused(capsys, ["memory", "--config", str(args)])
    assert "key '--hidden-size': expected an integer" in err and "(6002 characters)" in err
    assert "--hidden-size is required" not in err and len(err) < 2000


def test_native_values_outside_any_real_job(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = (REPO / "examples" / "llama3_8b_inline.yaml").read_text(encoding="utf-8")
    path = tmp_path / "job.yaml"
    path.write_text(text.replace("seq_length: 8192", f"seq_length: {2**40}"), encoding="utf-8")
    assert "key 'training.seq_length'" in refused(capsys, ["memory", "--config", str(path)])
    path.write_text(text.replace("rope_theta: 500000", "rope_theta: -1"), encoding="utf-8")
    assert "key 'model.rope_theta'" in refused(capsys, ["memory", "--config", str(path)])


def test_messages_name_the_key_as_given(capsys: pytest.CaptureFixture[str]) -> None:
    example = str(REPO / "examples" / "llama3_8b_inline.yaml")
    err = refused(capsys, ["memory", "--config", example, "--nodes", "9" * 23])
    assert "fix: give --nodes a valid value" in err
    err = refused(capsys, ["schedule", "--schedule", "1f1b", "--pp", "2", "--microbatches", "4", "--fwd-s", "-1"])
    assert "is negative: a time must be >= 0" in err
    err = refused(capsys, ["memory", "--config", example, "--set", "foo"])
    assert "--set plan.tp=8" in err and "tensor_model_parallel_size" not in err


def test_schedule_lists_a_bad_size_beside_what_is_missing(capsys: pytest.CaptureFixture[str]) -> None:
    err = refused(capsys, ["schedule", "--pp", "0"])
    assert "missing --schedule, --microbatches" in err and "key '--pp': must be a positive whole number" in err


def test_a_json_config_with_a_byte_order_mark_reads_as_yaml_does(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(QWEN3_MOE), encoding="utf-8-sig")
    assert main(["memory", "--config", str(path), "--nodes", "2"]) == 0
    assert "Peak allocated" in capsys.readouterr().out


def test_a_device_must_be_named_not_listed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = (REPO / "examples" / "llama3_8b_inline.yaml").read_text(encoding="utf-8")
    path = tmp_path / "job.yaml"
    path.write_text(text.replace("hardware: mi300x", "hardware: [mi300x]"), encoding="utf-8")
    assert "key 'cluster.hardware': must be a device name" in refused(capsys, ["memory", "--config", str(path)])


def test_a_timeline_too_large_to_draw_is_refused_before_the_simulation(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`schedule --png` at pp 1000 x 1000 microbatches (allowed by the million-forward guard) drew for over a minute a
    picture of 195 M pixels (fuzz audit): refused, naming --png, nothing written; the picture's sides are capped."""
    from projection.report.timeline_png import MAX_INCHES

    png = tmp_path / "t.png"
    err = refused(capsys, ["schedule", "--schedule", "1f1b", "--pp", "1000", "--microbatches", "1000",
                           "--png", str(png)])
    assert "key '--png': a timeline of 2,000,000 actions is too many to draw" in err and not png.exists()
    assert main(["schedule", "--schedule", "1f1b", "--pp", "200", "--microbatches", "8", "--png", str(png)]) == 0
    from matplotlib.image import imread

    height, width = imread(png).shape[:2]
    assert max(height, width) <= MAX_INCHES * 120 and height > width / 4  # 200 ranks, capped, not a sliver
