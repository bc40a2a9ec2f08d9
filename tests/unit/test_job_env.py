"""The training job's allocator setting: where it is read (a functional test's ENV_VARS, a launch script, `--set
env.NAME`, TorchTitan's launcher default), how PyTorch spells it, and what it changes (the reserved peak only)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from projection import api
from projection.errors import ConfigError
from projection.memory.allocator import (
    BLOCK_ROUNDING_BYTES,
    EXPANDABLE_PAGE_BYTES,
    FRAGMENTATION_OF_ACTIVATIONS,
    reserved_bytes,
)
from projection.units import alloc_conf_expandable_segments

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO.parent / "shared" / "fixtures"
MiB = 2**20

SCRIPT = """\
#!/bin/bash
export CUDA_DEVICE_MAX_CONNECTIONS=1
{env}
torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers 4 --hidden-size 1024 --num-attention-heads 16 \\
    --seq-length 2048 --max-position-embeddings 2048 --micro-batch-size 2 --global-batch-size 16 --bf16 \\
    --vocab-size 32000 --tensor-model-parallel-size 2
"""


@pytest.mark.parametrize(("value", "expected"), [
    ("expandable_segments:True", True),
    ("expandable_segments:False", False),
    (" max_split_size_mb : 512 , expandable_segments : True", True),  # PyTorch's lexer drops the spaces
    ("garbage_collection_threshold:0.8,max_split_size_mb:512", None),
    ("roundup_power2_divisions:[256:1,512:2,>:8],expandable_segments:True", True),
    ("expandable_segments:True,expandable_segments:False", False),  # the last one wins, as in parseArgs
])
def test_alloc_conf_is_read_as_pytorch_parses_it(value: str, expected: bool | None) -> None:
    assert alloc_conf_expandable_segments(value) is expected


@pytest.mark.parametrize("value", ["expandable_segments:true", "expandable_segments:1", "expandable_segments",
                                   "expandable_segments:"])
def test_alloc_conf_spellings_pytorch_refuses(value: str) -> None:
    with pytest.raises(ValueError, match="True or False"):
        alloc_conf_expandable_segments(value)


def test_reserved_with_expandable_segments_is_the_peak_in_whole_pages() -> None:
    peak, act = 40 * 2**30 + 123, 10 * 2**30
    r = reserved_bytes(peak, act, expandable_segments=True)
    assert r % EXPANDABLE_PAGE_BYTES == 0 and peak <= r < peak + EXPANDABLE_PAGE_BYTES
    default = reserved_bytes(peak, act)
    assert default % BLOCK_ROUNDING_BYTES == 0
    assert peak + FRAGMENTATION_OF_ACTIVATIONS * act <= default < peak + FRAGMENTATION_OF_ACTIVATIONS * act + 2 * MiB


def _load(tmp_path: Path, env: str, *overrides: str) -> api.Scenario:
    script = tmp_path / "train.sh"
    script.write_text(SCRIPT.format(env=env))
    return api.load(script, hardware="h100-sxm", nodes=1, overrides=list(overrides))


def test_launch_script_export_and_its_precedence(tmp_path: Path) -> None:
    assert not _load(tmp_path, "").training.kernels.expandable_segments
    assert _load(tmp_path, "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True").training.kernels \
        .expandable_segments
    # a plain assignment stays in the shell; one prefixed to the launch command is the job's
    assert not _load(tmp_path, "PYTORCH_HIP_ALLOC_CONF='expandable_segments:True'").training.kernels \
        .expandable_segments
    prefixed = SCRIPT.replace("torchrun", "PYTORCH_HIP_ALLOC_CONF=expandable_segments:True torchrun")
    (tmp_path / "prefixed.sh").write_text(prefixed.format(env=""))
    # (the HIP variable is a ROCm build's: on an NVIDIA device PyTorch does not read it)
    assert api.load(tmp_path / "prefixed.sh", hardware="mi300x").training.kernels.expandable_segments
    assert not api.load(tmp_path / "prefixed.sh", hardware="h100-sxm").training.kernels.expandable_segments
    # which allocator variable PyTorch reads first depends on its version: two that disagree are refused
    both = "export PYTORCH_ALLOC_CONF=max_split_size_mb:512\nexport PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
    with pytest.raises(ConfigError, match="disagree on expandable segments"):
        _load(tmp_path, both)
    # --set env.NAME is the job's environment on the command line: its allocator variable replaces the file's, and a
    # variable set without the option is the default allocator
    for value in ("expandable_segments:False", "max_split_size_mb:512"):
        sc = _load(tmp_path, "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
                   f"env.PYTORCH_ALLOC_CONF={value}")
        assert not sc.training.kernels.expandable_segments
    assert not _load(tmp_path, "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
                     "env.PYTORCH_CUDA_ALLOC_CONF=null").training.kernels.expandable_segments
    with pytest.raises(ConfigError, match="CUBLAS_WORKSPACE_CONFIG 'garbage'"):
        _load(tmp_path, "", "env.CUBLAS_WORKSPACE_CONFIG=garbage")


def test_only_the_reserved_peak_changes(tmp_path: Path) -> None:
    plain = api.estimate_memory(_load(tmp_path, ""))
    expandable = api.estimate_memory(_load(tmp_path, "export PYTORCH_ALLOC_CONF=expandable_segments:True"))
    for a, b in zip(plain.ranks, expandable.ranks, strict=True):
        assert a.bytes == b.bytes and a.peak_bytes == b.peak_bytes
        assert b.reserved_bytes < a.reserved_bytes
        assert b.reserved_bytes == -(-b.peak_bytes // EXPANDABLE_PAGE_BYTES) * EXPANDABLE_PAGE_BYTES
    assert (plain.to_dict()["allocator"], expandable.to_dict()["allocator"]) == ("default", "expandable_segments")
    assert "expandable segments" in expandable.to_table()


def test_bad_job_environment_names_every_problem(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as e:
        _load(tmp_path, "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:true")
    (p,) = e.value.problems
    assert (p.key, p.line, "expandable_segments:True" in (p.fix or "")) == ("PYTORCH_CUDA_ALLOC_CONF", 3, True)
    with pytest.raises(ConfigError) as e:
        _load(tmp_path, "", "env.NCCL_ALGO=Ring", "env.PYTORCH_ALLOC_CONF=expandable_segments:yes")
    assert sorted(p.key or "" for p in e.value.problems) == ["--set env.NCCL_ALGO", "--set env.PYTORCH_ALLOC_CONF"]


def test_cli_bad_env_value_exits_2_without_traceback(tmp_path: Path) -> None:
    script = tmp_path / "train.sh"
    script.write_text(SCRIPT.format(env=""))
    p = subprocess.run([sys.executable, "-m", "projection", "memory", "--config", str(script), "--set",
                        "env.PYTORCH_ALLOC_CONF=expandable_segments:on"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "PYTORCH_ALLOC_CONF" in p.stderr and "expandable_segments:True" in p.stderr


@pytest.mark.skipif(not FIXTURES.is_dir(), reason="../shared/fixtures is not here (a user's clone)")
def test_real_configs() -> None:
    # a Megatron functional test that sets it in ENV_VARS, one that does not, and TorchTitan's launcher default
    meg = FIXTURES / "megatron"
    sc = api.load(meg / "gpt3_mcore_te_tp1_pp4_vp1" / "model_config.yaml", hardware="h100-sxm")
    assert sc.training.kernels.expandable_segments
    sc = api.load(meg / "gpt3_mcore_te_tp4_pp1_resume_torch_dist_dist_optimizer_overlap_grad_reduce"
                  / "model_config.yaml", hardware="h100-sxm")
    assert not sc.training.kernels.expandable_segments
    toml = FIXTURES / "torchtitan" / "llama3_8b.toml"
    assert api.load(toml).training.kernels.expandable_segments
    for other in ("env.PYTORCH_ALLOC_CONF=expandable_segments:False",
                  "env.PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:64"):
        assert not api.load(toml, overrides=[other]).training.kernels.expandable_segments


def test_environment_problems_come_with_the_files(tmp_path: Path) -> None:
    """A bad allocator value and an unknown key of the file are reported together, not one run at a time."""
    with pytest.raises(ConfigError) as e:
        _load(tmp_path, "export PYTORCH_ALLOC_CONF=expandable_segments:yes", "plan.bogus=1")
    assert {p.key for p in e.value.problems} >= {"PYTORCH_ALLOC_CONF"}
    assert any("unknown" in p.message or "bogus" in (p.key or "") for p in e.value.problems)


def test_exports_the_way_bash_hands_them_on_and_an_explicit_key_wins(tmp_path: Path) -> None:
    """`set -a` with export lines, `env NAME=v torchrun`, a prefix continued with a backslash; and a --set of the
    canonical key itself is not overwritten by the file's variable."""
    on = "expandable_segments:True"
    for env in (f"set -a\nexport PYTORCH_CUDA_ALLOC_CONF={on}", f"set -o allexport\nPYTORCH_CUDA_ALLOC_CONF={on}"):
        assert _load(tmp_path, env).training.kernels.expandable_segments, env
    for launch in (f"env PYTORCH_ALLOC_CONF={on} torchrun", f"PYTORCH_ALLOC_CONF={on} \\\n    torchrun"):
        (tmp_path / "launch.sh").write_text(SCRIPT.replace("torchrun", launch).format(env=""))
        assert api.load(tmp_path / "launch.sh", hardware="h100-sxm").training.kernels.expandable_segments, launch
    sc = _load(tmp_path, f"export CUBLAS_WORKSPACE_CONFIG=:4096:8 PYTORCH_CUDA_ALLOC_CONF={on}",
               "training.kernels.expandable_segments=false", "training.kernels.gemm_workspace_bytes=0")
    assert (sc.training.kernels.expandable_segments, sc.training.kernels.gemm_workspace_bytes) == (False, 0)


def test_environment_problems_survive_a_file_or_device_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as e:
        _load(tmp_path, "", "env.NCCL_ALGO=Ring", "plan.tp.x=1")  # the loader stops at the second
    assert {p.key for p in e.value.problems} >= {"--set env.NCCL_ALGO"}
    script = tmp_path / "bad.sh"
    script.write_text(SCRIPT.format(env="export CUBLAS_WORKSPACE_CONFIG=garbage"))
    with pytest.raises(ConfigError) as e:
        api.load(script, hardware="nosuchgpu", overrides=["env.NCCL_ALGO=Ring"])
    assert len(e.value.problems) >= 2


def test_a_variable_the_script_unsets_is_not_the_jobs(tmp_path: Path) -> None:
    """`unset NAME` empties a variable: an exported allocator setting unset before the launch is not the job's, and a
    flag's `${TP:-2}` takes its default again (both used to keep the value set before the unset)."""
    on = "expandable_segments:True"
    for unset in ("unset PYTORCH_CUDA_ALLOC_CONF", 'unset "PYTORCH_CUDA_ALLOC_CONF"'):
        assert not _load(tmp_path, f"export PYTORCH_CUDA_ALLOC_CONF={on}\n{unset}").training.kernels \
            .expandable_segments, unset
    assert _load(tmp_path, f"export PYTORCH_CUDA_ALLOC_CONF={on}\nunset -f PYTORCH_CUDA_ALLOC_CONF"
                 ).training.kernels.expandable_segments  # -f: a function of that name, not the variable
    script = tmp_path / "tp.sh"
    script.write_text(SCRIPT.format(env="TP=4\nunset -v TP").replace("--tensor-model-parallel-size 2",
                                                                      "--tensor-model-parallel-size ${TP:-2}"))
    assert api.load(script, hardware="h100-sxm").plan.tp == 2
