"""A Megatron-LM argument dump (the rank-0 `args` block a log prints, read as a flat YAML of dests) records the run's
`world_size` (Megatron's parse_args takes it from the launcher's WORLD_SIZE): the job is projected on
world_size / GPUs-per-node nodes, not on one node. `--nodes` and `--set cluster.nodes` still win, `--gpus-per-node`
changes the node count, and a world size that is not whole nodes exits 2 naming the file, line and key.

The expected values are the runs' own: benchmarks/amd_runs/ holds the dumps of AMD's public Primus logs, whose
headers and file names say 8 nodes x 8 MI325X (world_size 64) and 2 nodes x 8 (world_size 16); the default device
(mi300x) has 8 GPUs per node as well (hardware_specs/mi300x.yaml)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from projection.cli import main

REPO = Path(__file__).resolve().parents[2]
RUNS = REPO / "benchmarks" / "amd_runs"
DUMP_7B = RUNS / "primus_llama2_7b_fp8_64xmi325x.yaml"  # tp 1, pp 1, cp 1, micro batch 4, global batch 2048
# file -> (world_size the file records, nodes of 8 GPUs the log ran on: its header / name)
DUMPS = {"primus_llama2_7b_fp8_64xmi325x.yaml": (64, 8), "primus_mixtral_8x7b_bf16_ep8_64xmi325x.yaml": (64, 8),
         "primus_llama2_70b_fp8_fsdp2_16xmi325x.yaml": (16, 2)}


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main([*argv, "--format", "json"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def _error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(list(argv)) == 2
    return capsys.readouterr().err


def _with_world_size(tmp_path: Path, world: str) -> tuple[Path, int]:
    """The 7B dump with its world_size line rewritten, and that line's number (1-based)."""
    lines = DUMP_7B.read_text().splitlines()
    (at,) = [i for i, line in enumerate(lines) if line.startswith("world_size:")]
    lines[at] = f"world_size: {world}"
    path = tmp_path / "dump.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path, at + 1


@pytest.mark.parametrize("name", DUMPS)
def test_dump_is_projected_on_its_world_size(capsys: pytest.CaptureFixture[str], name: str) -> None:
    world, nodes = DUMPS[name]
    assert re.search(rf"^world_size: {world}$", (RUNS / name).read_text(), re.M)  # the fixture says so
    cluster = _json(capsys, "inspect", "--config", str(RUNS / name))["cluster"]
    assert (cluster["hardware"], cluster["gpus_per_node"]) == ("mi300x", 8)
    assert (cluster["nodes"], cluster["world_size"]) == (nodes, world)


def test_performance_and_memory_use_the_dumped_cluster(capsys: pytest.CaptureFixture[str]) -> None:
    perf = _json(capsys, "performance", "--config", str(DUMP_7B))
    assert (perf["nodes"], perf["world_size"]) == (8, 64)
    assert perf["n_microbatches"] == 2048 // (4 * 64)  # global batch / (micro batch x dp), dp = 64 at tp = pp = 1
    assert _json(capsys, "memory", "--config", str(DUMP_7B))["world_size"] == 64
    assert main(["memory", "--config", str(DUMP_7B)]) == 0
    assert "on 64 x mi300x" in capsys.readouterr().out.splitlines()[0]


def test_inspect_names_the_world_size_line(capsys: pytest.CaptureFixture[str]) -> None:
    (line,) = [i + 1 for i, text in enumerate(DUMP_7B.read_text().splitlines()) if text.startswith("world_size:")]
    origins = _json(capsys, "inspect", "--config", str(DUMP_7B))["origins"]
    assert origins["cluster.nodes"] == f"{DUMP_7B}:{line} (world_size)"


def test_command_line_nodes_win(capsys: pytest.CaptureFixture[str]) -> None:
    perf = _json(capsys, "performance", "--config", str(DUMP_7B), "--nodes", "2")
    assert (perf["nodes"], perf["world_size"]) == (2, 16)
    perf = _json(capsys, "performance", "--config", str(DUMP_7B), "--set", "cluster.nodes=4")
    assert (perf["nodes"], perf["world_size"]) == (4, 32)


def test_gpus_per_node_changes_the_node_count(capsys: pytest.CaptureFixture[str]) -> None:
    perf = _json(capsys, "performance", "--config", str(DUMP_7B), "--gpus-per-node", "4")
    assert (perf["nodes"], perf["world_size"]) == (16, 64)
    cluster = _json(capsys, "inspect", "--config", str(DUMP_7B), "--set", "cluster.gpus_per_node=2")["cluster"]
    assert (cluster["nodes"], cluster["world_size"]) == (32, 64)


def test_set_world_size_replaces_the_files(capsys: pytest.CaptureFixture[str]) -> None:
    assert _json(capsys, "inspect", "--config", str(DUMP_7B), "--set", "world_size=16")["cluster"]["nodes"] == 2
    # null drops it: the default of one node, said to be a default
    d = _json(capsys, "inspect", "--config", str(DUMP_7B), "--set", "world_size=null")
    assert d["cluster"]["nodes"] == 1 and d["origins"]["cluster.nodes"].startswith("default")


def test_world_size_not_whole_nodes_exits_2_with_file_line_and_key(capsys: pytest.CaptureFixture[str],
                                                                   tmp_path: Path) -> None:
    path, line = _with_world_size(tmp_path, "4")  # half a node of 8; global batch 2048 = 4 x 4 x 128
    err = _error(capsys, "performance", "--config", str(path))
    assert f"{path}:{line}: key 'world_size'" in err
    assert "--gpus-per-node" in err and "--nodes N" in err
    # with --gpus-per-node 2 (2 nodes) or --nodes it loads
    assert _json(capsys, "inspect", "--config", str(path), "--gpus-per-node", "2")["cluster"]["nodes"] == 2
    assert _json(capsys, "inspect", "--config", str(path), "--nodes", "1")["cluster"]["world_size"] == 8
    # the GPUs per node named on the command line are what the world size does not divide
    err = _error(capsys, "performance", "--config", str(DUMP_7B), "--gpus-per-node", "6")
    assert "key 'world_size'" in err and "6 GPUs" in err and "--gpus-per-node" in err


def test_world_size_problem_is_listed_with_the_others(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path, line = _with_world_size(tmp_path, "12")
    err = _error(capsys, "performance", "--config", str(path), "--set", "env.NOT_READ=1")
    assert "problems:" in err
    assert f"{path}:{line}: key 'world_size'" in err and "env.NOT_READ" in err


def test_malformed_world_size_is_refused_at_its_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path, line = _with_world_size(tmp_path, "sixty-four")
    err = _error(capsys, "inspect", "--config", str(path))
    assert f"{path}:{line}: key 'world_size'" in err and "sixty-four" in err
    path, line = _with_world_size(tmp_path, "0")
    assert f"{path}:{line}: key 'world_size'" in _error(capsys, "inspect", "--config", str(path))


def test_target_nodes_scales_from_the_dumped_node_count(capsys: pytest.CaptureFixture[str]) -> None:
    # pp 16 does not fit one node of 8 GPUs: a file without a node count would start from the fewest nodes its plan
    # fits (2) and say so; the dump's 8 nodes are the starting point, with no such note
    perf = _json(capsys, "performance", "--config", str(DUMP_7B), "--set", "pipeline_model_parallel_size=16",
                 "--target-nodes", "16")
    assert (perf["nodes"], perf["world_size"]) == (16, 128)
    assert not any("smallest count" in n for n in perf["notes"])
    # without --target-nodes the dump's own count loads (before: pp 16 on 8 GPUs, refused)
    perf = _json(capsys, "performance", "--config", str(DUMP_7B), "--set", "pipeline_model_parallel_size=16")
    assert (perf["nodes"], perf["world_size"]) == (8, 64)
