"""Bad input found by the CLI audit of 2026-11-30, one test per class: values no job or hardware has, keys that
name nothing, launch-script quoting, and problems located where they were written. Each exits 2, names the file,
the key and the fix, and prints no traceback (the helpers of test_bad_input.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.test_bad_input import FIXTURES, GOOD, assert_user_error, run, write


def test_a_key_below_a_single_value(tmp_path: Path) -> None:
    """`--set plan.tp.x=1`: plan.tp holds a number, not a table (a TypeError traceback before)."""
    res = run("memory", "--config", str(write(tmp_path, GOOD)), "--set", "plan.tp.x=1")
    assert_user_error(res, "key 'plan.tp.x'", "plan.tp is a single value", "set plan.tp itself")


MEGATRON_SCRIPT = ("torchrun pretrain_gpt.py --num-layers 2 --hidden-size 1024 --num-attention-heads 16 "
                   "--seq-length 1024 --max-position-embeddings 1024 --micro-batch-size 1 --global-batch-size 8 "
                   "--bf16 --vocab-size 32000\n")


@pytest.mark.parametrize(("key", "hint"), [("trainig.seq_length=512", "did you mean training.seq_length"),
                                           ("pln.tp=2", "did you mean plan.tp"),
                                           ("tensor_model_parallel_size.x=4", "dotted canonical key")])
def test_a_megatron_file_refuses_a_dotted_key_of_no_section(tmp_path: Path, key: str, hint: str) -> None:
    """A dotted --set key on a Megatron file is a canonical key, so its first part must be one of projection's
    sections (it used to be accepted and ignored, exit 0)."""
    res = run("inspect", "--config", str(write(tmp_path, MEGATRON_SCRIPT, "train.sh")), "--set", key)
    assert_user_error(res, f"key '{key.split('=')[0]}'", "not a section of projection's canonical keys", hint)


def test_numbers_too_large_for_any_job(tmp_path: Path) -> None:
    """A 400-digit vocabulary (an OverflowError traceback before) and a million layers (minutes of work) are refused
    at the key that holds them."""
    res = run("memory", "--config", str(write(tmp_path, GOOD)), "--set", "model.vocab_size=" + "9" * 400)
    assert_user_error(res, "key 'model.vocab_size'", "400-digit number is too large")
    res = run("memory", "--config", str(write(tmp_path, GOOD)), "--set", "model.num_layers=1000000")
    assert_user_error(res, "key 'model.num_layers'", "less than or equal to 10000")


def test_exponent_numbers_past_float_range(tmp_path: Path) -> None:
    """YAML reads `1e400` (no dot) as a string, which pydantic turned into an infinite float: a ZeroDivisionError
    traceback in the fabric model, an OverflowError in the MoE capacity. Refused at the key; a taper past any
    fabric's too."""
    config = str(write(tmp_path, GOOD))
    res = run("performance", "--config", config, "--set", "cluster.oversubscription=1e400")
    assert_user_error(res, "key '--set cluster.oversubscription'", "expected a finite number, got 1e400")
    res = run("memory", "--config", config, "--set", "model.rope_theta=-1e999")
    assert_user_error(res, "model.rope_theta'", "expected a finite number")
    res = run("performance", "--config", config, "--set", "cluster.oversubscription=1e300")
    assert_user_error(res, "key '--set cluster.oversubscription'", "less than or equal to 64")
    spec = (Path(__file__).resolve().parents[2] / "hardware_specs" / "mi300x.yaml").read_text()
    lines = ["hbm_bytes: 1e400GiB" if line.startswith("hbm_bytes:") else line for line in spec.splitlines()]
    device = write(tmp_path, "\n".join(lines) + "\n", "inf_hbm.yaml")  # a unit string: int(inf) raised
    assert_user_error(run("memory", "--config", config, "--hardware", str(device)), "key 'hbm_bytes'",
                      "expected a finite number")


def test_device_values_outside_any_hardware(tmp_path: Path) -> None:
    """A host issue time of 1e300 s or an HBM bandwidth of 1e-300 B/s is a slip, refused where it is written (it used
    to end in an overflow to inf inside the simulator)."""
    spec = (Path(__file__).resolve().parents[2] / "hardware_specs" / "mi300x.yaml").read_text()
    for key, value, needle in (("host_kernel_issue_s", "1e300 s", "less than or equal to 3600"),
                               ("hbm_bandwidth_bytes_per_s", "1e-300 B/s", "greater than or equal to 1000")):
        lines = [f"{key}: {value}" if line.startswith(f"{key}:") else line for line in spec.splitlines()]
        device = write(tmp_path, "\n".join(lines) + "\n", f"bad_{key}.yaml")
        res = run("performance", "--config", str(write(tmp_path, GOOD)), "--hardware", str(device))
        assert_user_error(res, f"key '{key}'", needle)


def test_schedule_indices_and_durations_beyond_the_simulator(tmp_path: Path) -> None:
    """One CSV cell naming microbatch 1e20 used to run for minutes; a rank index of 1e8 made a 1 GB message; 1e308 s
    per action printed inf and NaN."""
    csv = write(tmp_path, "0F99999999999999999999,0B99999999999999999999\n", "huge.csv")
    assert_user_error(run("schedule", "--csv", str(csv)), "key '--csv'", "more than the 1,000,000")
    csv = write(tmp_path, "99999999F0,99999999B0\n", "ranks.csv")
    res = run("schedule", "--csv", str(csv))
    assert_user_error(res, "100,000,000 stages")
    assert len(res.stderr) < 2000
    res = run("schedule", "--schedule", "1f1b", "--pp", "4", "--microbatches", "8", "--fwd-s", "1e308")
    assert_user_error(res, "key '--fwd-s'", "more than the 3600 s")


def test_a_model_cross_check_is_located_at_the_key_it_names(tmp_path: Path) -> None:
    """32 heads over 5 KV heads: the problem is reported at the file's line of num_attention_heads (it used to be at
    'model' with a generic fix), in the file's own spelling for an HF config."""
    text = GOOD.replace("num_kv_heads: 8", "num_kv_heads: 5")
    line = next(i for i, t in enumerate(text.splitlines(), 1) if t.strip().startswith("num_attention_heads"))
    res = run("memory", "--config", str(write(tmp_path, text)))
    assert_user_error(res, f"exp.yaml:{line}: key 'model.num_attention_heads'", "not a multiple of num_kv_heads 5",
                      "change model.num_attention_heads")
    hf = FIXTURES / "hf" / "Llama-2-7b-hf.config.json"
    if hf.is_file():
        import json

        doc = json.loads(hf.read_text())
        doc["num_key_value_heads"] = 5
        res = run("memory", "--config", str(write(tmp_path, json.dumps(doc, indent=1), "config.json")))
        assert_user_error(res, "key 'num_attention_heads'", "change num_attention_heads")


def test_a_table_given_on_the_command_line_is_blamed_on_the_command_line(tmp_path: Path) -> None:
    """`--set 'training={seq_length: 0}'` replaces the file's table: the bad 0 is --set's, not the file's line that
    holds 8192 (the old origins of the replaced keys used to be reported)."""
    res = run("memory", "--config", str(write(tmp_path, GOOD)), "--set", "training={seq_length: 0}")
    assert_user_error(res, "--set: key 'training'", "training.seq_length a valid value (got 0)")
    assert "exp.yaml:" not in res.stderr


def test_launch_script_quotes_and_commands(tmp_path: Path) -> None:
    """An unclosed quote is reported where it opens (it used to surface as nine flags "using" a variable); a value
    from `$(nproc)` says projection runs no commands (its fix used to ask to set `$(nproc)`); a here-document's
    apostrophes are not quotes."""
    flags = ("--num-layers 2 --hidden-size 1024 --num-attention-heads 16 --seq-length 1024 "
             "--max-position-embeddings 1024 --micro-batch-size 1 --global-batch-size 8 --bf16 --vocab-size 32000")
    res = run("memory", "--config", str(write(tmp_path, f'echo ok\ntorchrun pretrain_gpt.py --lr "1e-4 {flags}\n',
                                              "quote.sh")))
    assert_user_error(res, "quote.sh:2", "never closed", "close the quote")
    res = run("memory", "--config", str(write(tmp_path, f"TP=$(nproc)\ntorchrun pretrain_gpt.py {flags} "
                                              "--tensor-model-parallel-size $TP\n", "cmd.sh")))
    assert_user_error(res, "key '--tensor-model-parallel-size'", "a command projection does not run",
                      "--set tensor_model_parallel_size=VALUE")
    heredoc = f"cat > notes.txt <<EOF\ndon't edit\nEOF\ntorchrun pretrain_gpt.py {flags}\n"
    assert run("memory", "--config", str(write(tmp_path, heredoc, "heredoc.sh"))).returncode == 0


def test_an_unknown_key_does_not_hide_the_layout_problems(tmp_path: Path) -> None:
    """`--set plan.bogus=1` on a plan that also breaks the layout: every problem at once (the unknown key used to be
    the only one reported until it was fixed)."""
    text = GOOD.replace("  tp: 2", "  tp: 3")
    res = run("memory", "--config", str(write(tmp_path, text)), "--set", "plan.bogus=1")
    assert_user_error(res, "key 'plan.bogus'", "unknown key", "tp = 3 does not divide num_attention_heads",
                      "world size 8 is not divisible")


@pytest.mark.parametrize(("command", "option", "value", "needle"),
                         [("performance", "--scaling", "-4,4", "cannot read node counts '-4,4'"),
                          ("plan", "--tp", "-2,4", "cannot read tp values '-2,4'")])
def test_a_list_value_that_starts_with_a_dash(tmp_path: Path, command: str, option: str, value: str,
                                              needle: str) -> None:
    """`--scaling -4,4`: argparse took the list for an option of its own and printed its usage text; the option's
    own check now names the value and the fix."""
    res = run(command, "--config", str(write(tmp_path, GOOD)), option, value)
    assert_user_error(res, f"key '{option}'", needle, "is not a positive whole number")
    assert "usage:" not in res.stderr


@pytest.mark.parametrize(("command", "option"), [("plan", "--tp"), ("performance", "--scaling")])
def test_a_list_value_past_any_count(tmp_path: Path, command: str, option: str) -> None:
    """`plan --tp 99999999999999999999` printed pydantic's own message in a refused row and exited 0."""
    res = run(command, "--config", str(write(tmp_path, GOOD)), option, "2," + "9" * 20)
    assert_user_error(res, f"key '{option}'", "is too large (at most 2**53)")


def test_a_file_named_inside_the_config_is_blamed_on_the_key_that_names_it(tmp_path: Path) -> None:
    """`cluster.hardware: /missing.yaml` said only "/missing.yaml: device file not found" (neither the config nor the
    key); `model:` naming a directory said "not found". Both are reported at the key that names them, saying what
    the path is."""
    missing = tmp_path / "nohw.yaml"
    config = write(tmp_path, GOOD.replace("hardware: mi300x", f"hardware: {missing}"))
    res = run("memory", "--config", str(config))
    assert_user_error(res, f"{config}:", "key 'cluster.hardware'", f"device file '{missing}' not found")
    config = write(tmp_path, GOOD.replace("hardware: mi300x", f"hardware: {tmp_path}"), "dir.yaml")
    assert_user_error(run("memory", "--config", str(config)), "key 'cluster.hardware'", "is a directory")
    lines = GOOD.splitlines()
    model_at = next(i for i, line in enumerate(lines) if line.startswith("model:"))
    body = [line for line in lines[model_at + 1:]]
    rest = body[next(i for i, line in enumerate(body) if not line.startswith(" ")):]
    config = write(tmp_path, "\n".join([*lines[:model_at], f"model: {tmp_path}", *rest]) + "\n", "model.yaml")
    assert_user_error(run("memory", "--config", str(config)), "key 'model'", "is a directory, not a preset YAML")
    (tmp_path / "llama3_8B").mkdir()  # a folder named like a preset (an HF snapshot) does not hide the preset
    config = write(tmp_path, "\n".join([*lines[:model_at], "model: llama3_8B", *rest]) + "\n", "preset.yaml")
    assert run("memory", "--config", str(config)).returncode == 0


def test_a_json_key_given_twice(tmp_path: Path) -> None:
    """JSON readers keep the last of two equal keys without a word (the YAML loaders refuse them): an HF config.json
    and a calibration file name the key and the line of its second appearance."""
    hf = write(tmp_path, '{"model_type": "llama", "hidden_size": 512, "intermediate_size": 1408,\n'
               ' "num_attention_heads": 8, "num_key_value_heads": 8, "num_hidden_layers": 4,\n'
               ' "vocab_size": 32000, "hidden_size": 1024}\n', "config.json")
    assert_user_error(run("inspect", "--config", str(hf)), f"{hf}:3: key 'hidden_size'", "appears twice")
    cal = write(tmp_path, '{"schema_version": 1,\n "gemm": [],\n "gemm": []}\n', "cal.json")
    assert_user_error(run("performance", "--config", str(write(tmp_path, GOOD)), "--calibration", str(cal)),
                      f"{cal}:3", "'gemm' appears twice")
