"""The Python API refuses arguments of the wrong kind with ConfigError naming them (what a notebook user sees), not
with a TypeError or AttributeError from deep inside."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from projection import api
from projection.errors import ConfigError
from projection.perf import project
from projection.perf.scaling import extrapolate, scaling_table
from projection.report.ppvis import load_pp_data

E8 = Path(__file__).resolve().parents[2] / "examples" / "llama3_8b_inline.yaml"


@pytest.mark.parametrize(("kwargs", "key"), [
    ({"config": None}, "config"), ({"config": 123}, "config"),
    ({"overrides": "plan.tp=4"}, "overrides"), ({"overrides": 5}, "overrides"), ({"overrides": {1: 2}}, "overrides"),
    ({"env": 5}, "env"), ({"hardware_dir": 3}, "hardware_dir"), ({"primus_root": 123}, "primus_root"),
])
def test_load_names_the_argument(kwargs: dict[str, Any], key: str) -> None:
    args = {"config": E8, **kwargs}
    with pytest.raises(ConfigError) as err:
        api.load(args.pop("config"), **args)
    assert [p.key for p in err.value.problems] == [key]


def test_load_takes_folders_as_strings() -> None:
    from projection.paths import HARDWARE_DIR

    assert api.load(E8, hardware_dir=str(HARDWARE_DIR)).cluster.device.name == "mi300x"


def test_functions_name_what_they_need() -> None:
    sc = api.load(E8)
    for call, what in ((lambda: api.inspect(None), "a Scenario"), (lambda: api.estimate_memory(str(E8)), "a Scenario"),
                       (lambda: api.explain_memory(sc), "a MemoryReport"), (lambda: project(None), "a Scenario")):
        with pytest.raises(ConfigError, match=what):
            call()
    for counts in (["x"], [1.5], 4, [0]):
        with pytest.raises(ConfigError, match="node counts"):
            scaling_table(sc, counts)
    with pytest.raises(ConfigError, match="positive whole numbers"):
        extrapolate(sc, 1.5)  # type: ignore[arg-type]


def test_malformed_pp_data_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"pp_size": 1, "num_mbs": 2}))
    (tmp_path / "pp_rank_0.json").write_text(json.dumps(
        {"1": {"fwd_start": [0.0, 1.0], "fwd_end": [0.5], "total": 3.0}}))
    with pytest.raises(ConfigError, match="malformed pp_data record"):
        load_pp_data(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"pp_size": 1, "num_mbs": "x"}))
    with pytest.raises(ConfigError, match="whole numbers"):
        load_pp_data(tmp_path)


def test_a_missing_primus_root_is_refused_for_any_format(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist") as err:
        api.load(E8, primus_root=tmp_path / "nope")
    assert err.value.problems[0].key == "--primus-root"


def test_load_takes_any_path_like_and_any_iterable_of_overrides() -> None:
    class Where:  # an os.PathLike that is not a pathlib.Path (py.path, a notebook's own class)
        def __fspath__(self) -> str:
            return str(E8)

    assert api.load(Where(), overrides=(x for x in ["plan.tp=2"])).plan.tp == 2


@pytest.mark.parametrize("item", ["plan..tp=8", ".tp=8", "plan.=3"])
def test_set_key_with_an_empty_part_is_the_command_lines(item: str) -> None:
    """`--set plan..tp=8` was blamed on the config file as `key 'plan': unknown key` (fuzz audit)."""
    from projection.errors import COMMAND_LINE, ConfigError
    from projection.formats.common import parse_set

    with pytest.raises(ConfigError) as err:
        parse_set([item])
    assert err.value.problems[0].file == COMMAND_LINE and "empty part" in err.value.problems[0].message


def test_a_megatron_flag_without_its_value_says_so(tmp_path: Path) -> None:
    """`--hidden-size` written with no value was reported as "got True" (fuzz audit)."""
    from projection.errors import ConfigError

    path = tmp_path / "train.sh"
    path.write_text("MODEL_ARGS=(\n  --num-layers 4\n  --hidden-size\n  --num-attention-heads 8\n  --seq-length 1024\n"
                    "  --max-position-embeddings 1024\n  --micro-batch-size 1\n  --global-batch-size 8\n)\n"
                    "torchrun --nproc_per_node 8 pretrain_gpt.py ${MODEL_ARGS[@]}\n")
    with pytest.raises(ConfigError) as err:
        api.load(path, hardware="h100-sxm")
    assert any(p.key == "--hidden-size" and "no value (a bare flag)" in p.message for p in err.value.problems)
