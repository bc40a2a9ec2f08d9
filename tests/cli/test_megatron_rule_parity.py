"""What Megatron-LM (validate_args) and Megatron-Core 0.16.1 (TransformerConfig, ModelParallelConfig, parallel_state,
MoELayer) refuse at start-up is refused here too, at the flag the file gives, with exit 2 and no traceback; the twin
a framework accepts still loads. The rules and their sources: formats/megatron_checks.py, specs/validate_megatron.py,
specs/validate.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from projection.cli import main

BASE: dict[str, object] = {
    "--num-layers": 8, "--hidden-size": 1024, "--num-attention-heads": 16, "--seq-length": 2048,
    "--max-position-embeddings": 4096, "--micro-batch-size": 1, "--global-batch-size": 64,
    "--tokenizer-type": "NullTokenizer", "--vocab-size": 32000, "--bf16": True,
    "--position-embedding-type": "rope", "--swiglu": True, "--normalization": "RMSNorm",
    "--disable-bias-linear": True, "--untie-embeddings-and-output-weights": True,
}
MOE: dict[str, object] = {"--num-experts": 8, "--moe-router-topk": 2, "--moe-ffn-hidden-size": 1024,
                          "--moe-grouped-gemm": True, "--moe-token-dispatcher-type": "alltoall"}
T = True

# name -> (flags over BASE, MoE, flags dropped, the flag the problem names)
REFUSED: dict[str, tuple[dict[str, object], bool, tuple[str, ...], str]] = {
    "moe_tp2_ep1_no_sp": ({"--tensor-model-parallel-size": 2}, True, (), "--sequence-parallel"),
    "fp8_param_gather_no_distopt": ({"--fp8-format": "hybrid", "--fp8-param-gather": T}, False, (),
                                    "--fp8-param-gather"),
    "fp8_param_gather_no_fp8": ({"--fp8-param-gather": T, "--use-distributed-optimizer": T}, False, (),
                                "--fp8-param-gather"),
    "vpp_pp2_no_overlap_p2p": ({"--pipeline-model-parallel-size": 2, "--num-virtual-stages-per-pipeline-rank": 2,
                                "--no-overlap-p2p-communication": T}, False, (), "--no-overlap-p2p-communication"),
    "layers_per_vstage_beside_first": ({"--pipeline-model-parallel-size": 2, "--decoder-first-pipeline-num-layers": 4,
                                        "--num-layers-per-virtual-pipeline-stage": 2}, False, (),
                                       "--num-layers-per-virtual-pipeline-stage"),
    "layout_beside_first": ({"--pipeline-model-parallel-size": 2, "--pipeline-model-parallel-layout": "Ettt|tttttL",
                             "--decoder-first-pipeline-num-layers": 3}, False, (),
                            "--decoder-first-pipeline-num-layers"),
    "layout_beside_account_for_embedding": ({"--pipeline-model-parallel-size": 2,
                                             "--pipeline-model-parallel-layout": "Ettt|tttttL",
                                             "--account-for-embedding-in-pipeline-split": T}, False, (),
                                            "--account-for-embedding-in-pipeline-split"),
    "dense_tp_pp_dp_mapping_cp2": ({"--use-tp-pp-dp-mapping": T, "--pipeline-model-parallel-size": 2,
                                    "--context-parallel-size": 2}, False, (), "--use-tp-pp-dp-mapping"),
    "ep_fp16": ({"--expert-model-parallel-size": 2, "--fp16": T, "--moe-grouped-gemm": False}, True, ("--bf16",),
                "--expert-model-parallel-size"),
    "grouped_gemm_fp32": ({}, True, ("--bf16",), "--moe-grouped-gemm"),
    "moe_bias_etp2": ({"--tensor-model-parallel-size": 2, "--sequence-parallel": T}, True, ("--disable-bias-linear",),
                      "--disable-bias-linear"),
    "pad_without_capacity": ({"--moe-pad-expert-input-to-capacity": T}, True, (), "--moe-pad-expert-input-to-capacity"),
    "deepep_alltoall": ({"--moe-enable-deepep": T}, True, (), "--moe-enable-deepep"),
    "ep_overlap_ep1": ({"--overlap-moe-expert-parallel-comm": T}, True, (), "--overlap-moe-expert-parallel-comm"),
    "ep_overlap_pp_without_vpp": ({"--overlap-moe-expert-parallel-comm": T, "--expert-model-parallel-size": 4,
                                   "--pipeline-model-parallel-size": 2}, True, (),
                                  "--overlap-moe-expert-parallel-comm"),
    "moe_act_without_grouped_gemm": ({"--recompute-granularity": "selective", "--recompute-modules": "moe_act",
                                      "--moe-grouped-gemm": False}, True, (), "--recompute-modules"),
    "moe_layer_recompute_full": ({"--moe-layer-recompute": T, "--recompute-granularity": "full",
                                  "--recompute-method": "uniform", "--recompute-num-layers": 1}, True, (),
                                 "--moe-layer-recompute"),
    "distribute_saved_tp1": ({"--distribute-saved-activations": T, "--recompute-granularity": "full",
                              "--recompute-method": "uniform", "--recompute-num-layers": 1}, False, (),
                             "--distribute-saved-activations"),
    "distribute_saved_with_sp": ({"--distribute-saved-activations": T, "--recompute-granularity": "full",
                                  "--recompute-method": "uniform", "--recompute-num-layers": 1,
                                  "--tensor-model-parallel-size": 2, "--sequence-parallel": T}, False, (),
                                 "--distribute-saved-activations"),
    "delayed_fp8_layernorm_recompute": ({"--fp8-format": "hybrid", "--recompute-granularity": "selective",
                                         "--recompute-modules": "layernorm"}, False, (), "--recompute-modules"),
    "mla_up_proj_without_mla": ({"--recompute-granularity": "selective", "--recompute-modules": "mla_up_proj"}, False,
                                (), "--recompute-modules"),
    "fsdp2_with_distopt": ({"--use-torch-fsdp2": T, "--use-distributed-optimizer": T,
                            "--no-gradient-accumulation-fusion": T}, False, (), "--use-distributed-optimizer"),
    "distopt_instances": ({"--use-distributed-optimizer": T, "--num-distributed-optimizer-instances": 3}, False, (),
                          "--num-distributed-optimizer-instances"),
    "cpu_offload_fp8_param_gather_tensorwise": ({"--fp8-format": "hybrid", "--fp8-recipe": "tensorwise",
                                                 "--fp8-param-gather": T, "--use-distributed-optimizer": T,
                                                 "--optimizer-cpu-offload": T, "--use-precision-aware-optimizer": T},
                                                False, (), "--fp8-param-gather"),
    "defer_embedding_wgrad_pp1": ({"--defer-embedding-wgrad-compute": T}, False, (),
                                  "--defer-embedding-wgrad-compute"),
    "mtp_learned_positions": ({"--mtp-num-layers": 1, "--position-embedding-type": "learned_absolute"}, False, (),
                              "--mtp-num-layers"),
    "moe_ffn_without_experts": ({"--moe-ffn-hidden-size": 1024}, False, (), "--moe-ffn-hidden-size"),
    "squared_relu_with_swiglu": ({"--squared-relu": T}, False, (), "--squared-relu"),
    "attn_proj_offload_alone": ({"--fine-grained-activation-offloading": T, "--offload-modules": "attn_proj"}, False,
                                (), "--offload-modules"),
    "selective_num_layers": ({"--recompute-granularity": "selective", "--recompute-num-layers": 2}, False, (),
                             "--recompute-num-layers"),
}

ACCEPTED: dict[str, tuple[dict[str, object], bool]] = {
    "vpp_pp2_overlapped_p2p": ({"--pipeline-model-parallel-size": 2, "--num-virtual-stages-per-pipeline-rank": 2},
                               False),
    "moe_bias_etp1": ({"--tensor-model-parallel-size": 2, "--sequence-parallel": T,
                       "--expert-tensor-parallel-size": 1, "--disable-bias-linear": False}, True),
    "distribute_saved_full_tp2": ({"--distribute-saved-activations": T, "--recompute-granularity": "full",
                                   "--recompute-method": "uniform", "--recompute-num-layers": 1,
                                   "--tensor-model-parallel-size": 2}, False),
    "dense_tp_pp_dp_mapping": ({"--use-tp-pp-dp-mapping": T, "--pipeline-model-parallel-size": 2}, False),
    "deepep_flex": ({"--moe-enable-deepep": T, "--moe-token-dispatcher-type": "flex",
                     "--expert-model-parallel-size": 8}, True),
    "ep_overlap_vpp": ({"--overlap-moe-expert-parallel-comm": T, "--expert-model-parallel-size": 4,
                        "--pipeline-model-parallel-size": 2, "--num-virtual-stages-per-pipeline-rank": 2}, True),
    # validate_args drops --fp8-param-gather under --use-torch-fsdp2 (TE 2.0+) before TransformerConfig sees it
    "fsdp2_fp8_param_gather_no_fp8": ({"--use-torch-fsdp2": T, "--fp8-param-gather": T,
                                       "--no-gradient-accumulation-fusion": T, "--ckpt-format": "torch_dist"}, False),
}


def write(tmp_path: Path, flags: dict[str, object], moe: bool, drop: tuple[str, ...] = ()) -> Path:
    args = {**BASE, **(MOE if moe else {})}
    for k in drop:
        args.pop(k, None)
    args.update(flags)
    args = {k: v for k, v in args.items() if v is not False}
    path = tmp_path / "case" / "model_config.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(yaml.safe_dump({"MODEL_ARGS": args}, sort_keys=False))
    return path


def memory(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    rc = main(["memory", "--config", str(path), "--hardware", "h100-sxm", "--nodes", "1", "--gpus-per-node", "8"])
    return rc, capsys.readouterr().err


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_refused_as_megatron_refuses_it(name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    flags, moe, drop, flag = REFUSED[name]
    path = write(tmp_path, flags, moe, drop)
    rc, err = memory(path, capsys)
    assert rc == 2, err
    assert "Traceback" not in err
    assert str(path) in err and flag in err, err
    assert "fix:" in err


@pytest.mark.parametrize("name", sorted(ACCEPTED))
def test_the_accepted_twin_still_loads(name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    flags, moe = ACCEPTED[name]
    rc, err = memory(write(tmp_path, flags, moe), capsys)
    assert rc == 0, err


def test_the_flag_is_named_with_its_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A flag the file gives is the problem's key, with its line; every violation is listed at once."""
    path = write(tmp_path, {"--fp8-param-gather": T, "--squared-relu": T, "--moe-ffn-hidden-size": 512}, False)
    rc, err = memory(path, capsys)
    assert rc == 2 and "4 problems" in err, err  # --fp8-param-gather twice: no distributed optimizer, no fp8
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if "--squared-relu" in text)
    assert f"{path}:{line}: key '--squared-relu'" in err


def test_primus_names_its_own_keys(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    exp = tmp_path / "exp.yaml"
    exp.write_text("work_group: amd\nmodules:\n  pre_trainer:\n    framework: megatron\n    config: pre_trainer.yaml\n"
                   "    model: llama3.1_8B.yaml\n    overrides:\n      seq_length: 4096\n      micro_batch_size: 1\n"
                   "      global_batch_size: 64\n      tensor_model_parallel_size: 1\n      fp8_param_gather: true\n"
                   "      fp8: hybrid\n      use_distributed_optimizer: false\n")
    rc, err = memory(exp, capsys)
    assert rc == 2 and "Traceback" not in err, err
    assert "key 'modules.pre_trainer.overrides.fp8_param_gather'" in err, err
    assert "--fp8-param-gather needs" not in err.split("(Megatron")[0], err  # Primus's key, not Megatron-LM's flag


def test_megatron_bridge_names_its_own_fields(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Megatron-Core's rules reach Bridge, spelt as its fields; validate_args's (Bridge does not run it) do not."""
    from tests.unit.test_bridge_loader import SMALL

    run = tmp_path / "bridge.yaml"
    run.write_text(SMALL.replace("  vocab_size: 128256\n", "  vocab_size: 128256\n  moe_ffn_hidden_size: 512\n"))
    rc, err = memory(run, capsys)
    assert rc == 2 and "Traceback" not in err, err
    assert "key 'model.moe_ffn_hidden_size'" in err and "model.num_moe_experts" in err, err
    run.write_text(SMALL.replace("  vocab_size: 128256\n", "  vocab_size: 128256\n  defer_embedding_wgrad_compute: "
                                 "true\n  pipeline_model_parallel_size: 1\n").replace(
                                     "  pipeline_model_parallel_size: 2\n", ""))
    rc, err = memory(run, capsys)
    assert rc == 2 and "key 'model.defer_embedding_wgrad_compute'" in err, err


def test_fsdp2_drops_the_fp8_parameter_gather(tmp_path: Path) -> None:
    """Under --use-torch-fsdp2 Megatron-LM's validate_args sets fp8_param_gather False (TE 2.0+), so the weights are
    gathered in bf16: the memory is the same as without the flag."""
    from projection import api
    from projection.memory.estimate import estimate_memory

    fp8 = {"--use-torch-fsdp2": T, "--no-gradient-accumulation-fusion": T, "--ckpt-format": "torch_dist",
           "--fp8-format": "hybrid", "--fp8-recipe": "tensorwise"}
    peaks = []
    for extra in ({}, {"--fp8-param-gather": T}):
        sc = api.load(write(tmp_path, {**fp8, **extra}, False),
                      overrides=["cluster.nodes=1", "cluster.gpus_per_node=8"])
        assert sc.training.fp8 is not None and not sc.training.fp8.param_gather
        peaks.append(max(r.peak_bytes for r in estimate_memory(sc).ranks))
    assert peaks[0] == peaks[1]
