"""A launch script's flags are what its command passes, in the command's order (argparse: the last one wins), not
every array or string the script assigns. An audit's scripts (tests/data/shell/use_site_*.sh) were read wrong:
an unused 70B array beat the 8B one the command used; an array placed after the command's own flags lost to them; a
flag string emptied before use still counted; an evaluation run's flags after the training run's overrode them."""

from __future__ import annotations

from pathlib import Path

import pytest

from projection import api

SHELL = Path(__file__).resolve().parents[1] / "data" / "shell"
# a small job's launch line, its layer count given by the caller
LAUNCH = ("torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers {layers} --hidden-size 512 --num-attention-heads 8 "
          "--seq-length 1024 --max-position-embeddings 1024 --micro-batch-size 1 --global-batch-size 8 "
          "--vocab-size 32000 --bf16")


@pytest.mark.parametrize("name,expected", [
    ("t5", {"layers": 32, "hidden": 4096, "tp": 8}),  # the array the command expands, not the last one defined
    ("t6", {"tp": 2, "pp": 2}),  # "${PAR_ARGS[@]}" comes after the command's own --tensor-model-parallel-size 8
    ("t6b", {"tp": 4}),  # "${BASE[@]}" "${OVERRIDE[@]}": OVERRIDE, assigned first, comes last
    ("t7", {"recompute": "none"}),  # RECOMPUTE_ARGS="" before the command
    ("t20", {"tp": 4, "mbs": 1, "seq": 4096, "gpus_per_node": 8}),  # the training run, not the evaluation after it
    ("t12", {"tp": 2, "pp": 1}),  # a comment line ends the continued command: the flag after it is a command of its own
])
def test_the_commands_flags_in_its_order(name: str, expected: dict[str, object]) -> None:
    sc = api.load(SHELL / f"use_site_{name}.sh")
    got = {"layers": sc.model.num_layers, "hidden": sc.model.hidden_size, "tp": sc.plan.tp, "pp": sc.plan.pp,
           "recompute": sc.plan.recompute.granularity, "mbs": sc.training.micro_batch_size,
           "seq": sc.training.seq_length, "gpus_per_node": sc.cluster.gpus_per_node}
    assert {k: got[k] for k in expected} == expected
    # the origin is the line the flag was written on, inside the array where it comes from one
    if name == "t5":
        assert sc.origins["model.num_layers"].endswith("use_site_t5.sh:2 (--num-layers)")


def test_a_switch_given_a_value_is_refused(tmp_path: Path) -> None:
    """`--sequence-parallel false` was read as on (an audit): argparse takes no value after a switch and stops at
    the word, so the job would not start. Refused at the flag's line."""
    from projection.errors import ConfigError

    script = tmp_path / "run.sh"
    script.write_text(LAUNCH.format(layers=4) + " \\\n  --tensor-model-parallel-size 2 --sequence-parallel false\n")
    with pytest.raises(ConfigError) as err:
        api.load(script)
    (problem,) = [p for p in err.value.problems if p.key == "--sequence-parallel"]
    assert problem.line == 2 and "'false'" in problem.message
    script.write_text(script.read_text().replace(" false", ""))
    assert api.load(script).plan.sp_


def test_a_sourced_file_is_read_where_it_is_sourced(tmp_path: Path) -> None:
    """`source ./common.sh` was skipped (an audit: the script's tp 2 / pp 1 / 32 layers were read where the job
    runs common.sh's 8 / 4 / 80). The sourced file runs at its line, relative to the script's folder; one that
    cannot be read is named where a value it might have set is missing."""
    from projection.errors import ConfigError

    (tmp_path / "common.sh").write_text("TP=8\nPP=4\nNUM_LAYERS=80\n")
    command = ("torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers $NUM_LAYERS --hidden-size 8192 "
               "--num-attention-heads 64 --seq-length 4096 --max-position-embeddings 4096 --micro-batch-size 1 "
               "--global-batch-size 64 --tensor-model-parallel-size $TP --pipeline-model-parallel-size $PP "
               "--vocab-size 32000 --bf16\n")
    script = tmp_path / "run.sh"
    script.write_text("TP=2\nPP=1\nNUM_LAYERS=32\nsource ./common.sh\n" + command)
    sc = api.load(script, nodes=4)
    assert (sc.plan.tp, sc.plan.pp, sc.model.num_layers) == (8, 4, 80)
    script.write_text(". ./missing.sh\n" + command)
    with pytest.raises(ConfigError) as err:
        api.load(script, nodes=4)
    assert any("line 1 sources ./missing.sh, which projection could not read" in p.message
               for p in err.value.problems)


def test_a_decided_test_guards_the_command_after_and_or(tmp_path: Path) -> None:
    """`[ "$NNODES" -gt 8 ] && TP=8` set tp 8 on 4 nodes, and `[[ -z "$SKIP" ]] || TP=4` set 4 (an audit): the
    assignment after `&&` runs only when the test holds, after `||` only when it fails, as in bash."""
    from projection.formats.megatron_shell import parse_shell

    def tp(script: str) -> str:
        return parse_shell(script + "\ntorchrun pretrain_gpt.py --tensor-model-parallel-size $TP\n").flags[0].value

    assert tp('NNODES=4\nTP=1\n[ "$NNODES" -gt 8 ] && TP=8') == "1"
    assert tp('NNODES=16\nTP=1\n[ "$NNODES" -gt 8 ] && TP=8') == "8"
    assert tp('TP=1\n[[ -z "$SKIP" ]] || TP=4') == "1"
    assert tp('SKIP=yes\nTP=1\n[[ -z "$SKIP" ]] || TP=4') == "4"
    assert tp('TP=1\n[ -f /no/such/file ] && TP=2') == "2"  # undecided here: run, as before
    assert tp('TP=1\n[ 1 -eq 2 ] && TP=2 || TP=3') == "3"


def test_a_value_a_case_block_may_set_is_refused_naming_the_block(tmp_path: Path) -> None:
    """`LAYERS=32` then `case ... in llama70b) LAYERS=80 ;; esac` was read as 32 with no word (an audit; the job ran
    80): case patterns are not evaluated, so a flag using what the block may set is refused, naming the block, and
    --set gives the value."""
    from projection.errors import ConfigError

    script = tmp_path / "run.sh"
    script.write_text('LAYERS=32\ncase "${MODEL:-llama70b}" in\n  llama70b) LAYERS=80 ;;\nesac\n'
                      + LAUNCH.format(layers="$LAYERS") + "\n")
    with pytest.raises(ConfigError) as err:
        api.load(script)
    (problem,) = err.value.problems
    assert problem.key == "--num-layers" and "case block at line 2" in problem.message
    assert api.load(script, overrides={"num_layers": 80}).model.num_layers == 80
