"""Measured on real GPUs: the projected reserved bytes (and allocated peak) against a published Megatron-LM training
log that prints both, `report_memory`'s `max allocated` and `max reserved` (torch.cuda.max_memory_allocated /
max_memory_reserved since the process started, data-parallel rank 0).

The case: a 1.71B dense model (open-sci-ref, LAION) trained with Megatron-LM on LEONARDO, 63 nodes x 4 A100 64 GB,
2025-03-31. Its command line and memory line are quoted in the docstring of a log-parsing script in the public-code
index (file id 40965174410, a copy of the job's `log.out`):
    [Rank 0] (after 50 iterations) memory (MB) | allocated: 9909.07763671875 | max allocated: 50277.15625 |
    reserved: 53386.0 | max reserved: 53386.0
`MB` there is MiB (Megatron divides by 1024 * 1024). The default caching allocator (no PYTORCH_CUDA_ALLOC_CONF in
the log), bf16, flash attention, selective recompute, distributed optimizer, tp 1 pp 1, micro batch 4 x 4096 tokens.
The tokenizer (a local copy of EleutherAI/gpt-neox-20b) is not in projection's table: its length, 50277, is given;
Megatron pads it to 50304, which the log's "parameters in embedding layers: 0.10 B" (50304 x 2048) agrees with.
The A100's 64 GB only changes the verdict, not the bytes: the a100-80g device is used.

Nothing is fitted to this log: the allocator's fragmentation allowance (memory/allocator.py, 10 % of the activation
peak) is an assumption stated before it was read. This is the only public pair found with a complete config on the
default allocator (docs/performance.md lists the others and why they are not scored). Limit: the allocated peak's
own median limit (3 %, issue 3), so that an allocator model with no fragmentation term (-6.1 % here) fails.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from projection import api
from projection.memory.allocator import reserved_bytes
from tests.oracle.bench_modules import load_benchmark

MiB = 2**20
LIMIT = 0.03
MEASURED_MAX_ALLOCATED = 50277.15625 * MiB
MEASURED_MAX_RESERVED = 53386.0 * MiB

LEONARDO_1_7B = (
    "python pretrain_gpt.py --num-layers 24 --hidden-size 2048 --ffn-hidden-size 8192 --num-attention-heads 32 "
    "--seq-length 4096 --max-position-embeddings 4096 --micro-batch-size 4 --global-batch-size 1008 "
    "--train-iters 242204 --weight-decay 0.05 --adam-beta1 0.9 --adam-beta2 0.95 --init-method-std 0.02 "
    "--clip-grad 1.0 --lr-decay-style WSD --lr-warmup-iters 25000 --lr-decay-iters 242204 --lr 4e-3 --min-lr 0 "
    "--lr-wsd-decay-style linear --lr-wsd-decay-iters 48440 --use-flash-attn --bf16 --qk-layernorm "
    "--ckpt-format torch_dist --position-embedding-type rope --rotary-base 100000 --rotary-percent 1.0 "
    "--normalization RMSNorm --norm-epsilon 1e-5 --swiglu --distributed-backend nccl --use-distributed-optimizer "
    "--overlap-param-gather --overlap-grad-reduce --recompute-activations --tensor-model-parallel-size 1 "
    "--pipeline-model-parallel-size 1 --sequence-parallel --tokenizer-model EleutherAI/gpt-neox-20b "
    "--tokenizer-type HuggingFaceTokenizer --split 989,10,1 --num-workers 4 --log-interval 50 --eval-iters 1\n")


def test_reserved_and_allocated_match_a_published_megatron_log(tmp_path: Path) -> None:
    script = tmp_path / "open_sci_ref_1.7b_leonardo.sh"
    script.write_text(LEONARDO_1_7B, encoding="utf-8")
    sc = api.load(script, hardware="a100-80g", nodes=63, gpus_per_node=4, overrides={"vocab_size": 50277})
    assert (sc.world_size, sc.plan.dp_(), sc.model.padded_vocab(1)) == (252, 252, 50304)
    (rank,) = api.estimate_memory(sc).ranks
    alloc_err = rank.peak_bytes / MEASURED_MAX_ALLOCATED - 1
    reserved_err = rank.reserved_bytes / MEASURED_MAX_RESERVED - 1
    print(f"\nmax allocated: measured {MEASURED_MAX_ALLOCATED / MiB:.0f} MiB, projected {rank.peak_bytes / MiB:.0f} "
          f"({alloc_err:+.1%}); max reserved: measured {MEASURED_MAX_RESERVED / MiB:.0f} MiB, projected "
          f"{rank.reserved_bytes / MiB:.0f} ({reserved_err:+.1%})")
    assert alloc_err == pytest.approx(0.0, abs=LIMIT)
    assert reserved_err == pytest.approx(0.0, abs=LIMIT)


# fixstars/mdk scripts/pretrain_megatron_lm/pretrain_7b_mpi.patch @43b4c04 (Megatron-LM core_r0.8.0, legacy models,
# Transformer Engine FP8 hybrid, expandable segments) and its log in doc/docs/how-to-guides/trainer/
# pretrain-megatron-lm.md (1 node x 8 GPUs, after 20 iterations, rank 0):
#     memory (MB) | allocated: 48465.28 | max allocated: 75078.43 | reserved: 75682 | max reserved: 75682
FIXSTARS_7B_FP8 = (
    "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\n"
    "python pretrain_gpt.py --num-layers 30 --hidden-size 4096 --num-attention-heads 32 --seq-length 4096 "
    "--max-position-embeddings 4096 --micro-batch-size 2 --global-batch-size 1024 --train-iters 500000 "
    "--weight-decay 0.1 --adam-beta1 0.9 --adam-beta2 0.95 --clip-grad 1.0 --bf16 --lr 6.0e-5 "
    "--lr-decay-style cosine --min-lr 6.0e-6 --lr-warmup-fraction .001 --lr-decay-iters 430000 "
    "--transformer-impl transformer_engine --fp8-format hybrid --fp8-interval 1024 --fp8-amax-history-len 1 "
    "--fp8-amax-compute-algo max --swiglu --hidden-dropout 0.0 --attention-dropout 0.0 --disable-bias-linear "
    "--no-masked-softmax-fusion --untie-embeddings-and-output-weights --use-distributed-optimizer "
    "--overlap-grad-reduce --sequence-parallel --use-legacy-models --attention-softmax-in-fp32 "
    "--tensor-model-parallel-size 1 --pipeline-model-parallel-size 1 --vocab-file gpt2-vocab.json "
    "--merge-file gpt2-merges.txt --log-interval 10 --eval-iters 10\n")


@pytest.mark.xfail(strict=True, reason=(
    "measured 2026-11-30: projected 85.4 GiB allocated peak against 73.3 GiB measured (+16 %); after the step the "
    "run holds 47.3 GiB where the estimate's model states are 56.4 GiB, about the 11.2 GiB of fp8 weight copies and "
    "transposes the estimate caches for the whole step (weights.fp8_copies): this legacy-model Transformer Engine "
    "run seems not to keep them; not investigated further (no GPU here to measure Transformer Engine)"))
def test_allocated_peak_of_a_published_fp8_megatron_log(tmp_path: Path) -> None:
    assert _fixstars_allocated_error(tmp_path) == pytest.approx(0.0, abs=LIMIT)


def _fixstars_allocated_error(tmp_path: Path) -> float:
    script = tmp_path / "fixstars_7b_fp8.sh"
    script.write_text(FIXSTARS_7B_FP8, encoding="utf-8")
    sc = api.load(script, hardware="h100-sxm", nodes=1)
    (rank,) = api.estimate_memory(sc).ranks
    err = rank.peak_bytes / (75078.43 * MiB) - 1
    print(f"\n7B FP8 max allocated: measured 75078 MiB, projected {rank.peak_bytes / MiB:.0f} ({err:+.1%})")
    return float(err)


def test_reserved_gap_of_a_published_log_with_expandable_segments(tmp_path: Path) -> None:
    """The same fixstars log, for the allocator alone: with expandable segments its reserved peak is 0.80 % above its
    allocated peak (75682 against 75078.43 MiB). The allocated peak is not right here (the xfail above), so the gap is
    compared, not the bytes: projected (reserved - allocated) / allocated within 1 point of the measured gap. The
    default allocator's allowance (10 % of the activations) would give 3.4 %, a miss of 2.6 points."""
    script = tmp_path / "fixstars_7b_fp8.sh"
    script.write_text(FIXSTARS_7B_FP8, encoding="utf-8")
    sc = api.load(script, hardware="h100-sxm", nodes=1)
    assert sc.training.kernels.expandable_segments  # read from the script's `export PYTORCH_CUDA_ALLOC_CONF`
    (rank,) = api.estimate_memory(sc).ranks
    measured = 75682 / 75078.43 - 1
    projected = rank.reserved_bytes / rank.peak_bytes - 1
    print(f"\nreserved above allocated with expandable segments: measured {measured:.2%}, projected {projected:.2%}")
    assert projected == pytest.approx(measured, abs=0.01)


# hisohara/ai-scripts training/04_megatron-pyxis (commit 97db03fb): ROCm Megatron-LM (rocm/megatron-lm v25.9 image,
# examples/llama/train_llama3.sh with FP8_WEIGHT_TRANSPOSE_CACHE=0 RECOMPUTE=1 MBS=4 BS=256 FSDP=1 TP=1 TE_FP8=1
# SEQ_LENGTH=8192 MODEL_SIZE=70 MOCK_DATA=1) on 8 nodes x 8 MI325X, 2025-11-24. The flags below are the run's own,
# read from the argument dump in its log megatron-pyxis-12384.out (403 arguments; the ones that change the estimate
# are all here), which also prints, once, on rank 0:
#     [Rank 0] (after 1 iterations) memory (MB) | allocated: 84470.69384765625 | max allocated: 140046.63720703125 |
#     reserved: 171836.0 | max reserved: 171836.0
MI325X_70B_FP8_FSDP2 = load_benchmark("accuracy_amd").LLAMA31_70B_FP8_FSDP2  # the U4 run of the accuracy table
MI325X_AFTER_STEP = 84470.69384765625 * MiB
MI325X_MAX_ALLOCATED = 140046.63720703125 * MiB
MI325X_MAX_RESERVED = 171836.0 * MiB


def _first_iteration_peak(sc: Any, rank: Any) -> int:
    """The projected forward/backward peak as it stands in a job's first iteration, which is when these logs report
    memory: Adam's state (moments, step counters) is created by the first optimizer step, and FSDP2's sharded
    gradients by the first backward's reduce-scatters, after the loss where these jobs peak; the distributed
    optimizer's gradient buffer and fp32 master shards exist from the start. A reading of the logs, stated."""
    assert rank.bytes["activations"] > 0  # the rank peaks in the forward/backward, not at the optimizer step
    adam = rank.terms.get("optimizer.moments", 0) + rank.terms.get("optimizer.step_counters", 0)
    return int(rank.peak_bytes - adam - (rank.bytes["gradients"] if sc.plan.sharding.fsdp != "none" else 0))


def _mi325x(tmp_path: Path) -> tuple[Any, Any]:
    script = tmp_path / "train_llama3_70b_fp8_fsdp2.sh"
    script.write_text(MI325X_70B_FP8_FSDP2, encoding="utf-8")
    sc = api.load(script, hardware="mi325x", nodes=8)
    assert (sc.world_size, sc.plan.dp_(), sc.model.padded_vocab(1)) == (64, 64, 128256)
    assert sc.training.fp8 is not None and not sc.training.fp8.weight_transpose_cache
    (rank,) = api.estimate_memory(sc).ranks
    return sc, rank


def test_fp8_weight_copies_of_an_fsdp2_run_on_mi325x(tmp_path: Path) -> None:
    """After the step the run holds 82.5 GiB on a GPU whose FSDP2 shards of a 70B model (bf16 weights, fp32 grads and
    Adam: 16 B / 64 ranks per parameter) are 16.4 GiB: the rest is Transformer Engine's fp8 copy of every GEMM
    weight, unsharded, kept for the step (no transpose: --no-fp8-weight-transpose-cache). Projected: the model
    states and buffers that outlive the step (FSDP2 frees the unsharded units after each backward). Without the
    transpose flag read the projection would hold another 63.8 GiB of transposes (+75 %)."""
    _, rank = _mi325x(tmp_path)
    after = sum(rank.bytes[k] for k in ("weights", "gradients", "optimizer", "buffers")) \
        - rank.terms.get("weights.unsharded_units", 0)
    err = after / MI325X_AFTER_STEP - 1
    print(f"\nMI325X 70B FP8 FSDP2, allocated after the step: measured {MI325X_AFTER_STEP / MiB:.0f} MiB, projected "
          f"{after / MiB:.0f} ({err:+.1%}); fp8 copies {rank.terms['weights.fp8_copies'] / MiB:.0f} MiB")
    assert err == pytest.approx(0.0, abs=LIMIT)


def test_first_iteration_peak_of_an_fsdp2_run_on_mi325x(tmp_path: Path) -> None:
    """The log reports memory once, after iteration 1, so its max allocated is iteration 1's peak: Adam's states do
    not exist until the first optimizer step, and FSDP2's sharded gradients are written by the first backward's
    reduce-scatters, after the loss, where this full-recompute job peaks. So the projected forward/backward peak is
    compared without its gradients and optimizer state."""
    sc, rank = _mi325x(tmp_path)
    first = _first_iteration_peak(sc, rank)
    err = first / MI325X_MAX_ALLOCATED - 1
    print(f"\nMI325X 70B FP8 FSDP2, iteration 1 max allocated: measured {MI325X_MAX_ALLOCATED / MiB:.0f} MiB, "
          f"projected {first / MiB:.0f} ({err:+.1%})")
    assert err == pytest.approx(0.0, abs=LIMIT)


@pytest.mark.xfail(strict=True, reason=(
    "measured 2026-11-30: the run reserves 167.8 GiB for a 136.8 GiB allocated peak (+22.7 %); the default "
    "allocator's allowance (10 % of the activations) projects 142.6 GiB (-15 %) for it. Iteration 1 creates the fp8 "
    "weight copies (63.8 GiB, in pieces of up to 448 MiB) between the activations of its forward, and FSDP2 gathers "
    "and frees each layer's weights in between: the segments they leave are not modelled"))
def test_reserved_of_an_fsdp2_run_on_mi325x(tmp_path: Path) -> None:
    assert _mi325x_reserved_error(tmp_path) == pytest.approx(0.0, abs=LIMIT)


def _mi325x_reserved_error(tmp_path: Path) -> float:
    sc, rank = _mi325x(tmp_path)
    reserved = reserved_bytes(_first_iteration_peak(sc, rank), rank.bytes["activations"])
    err = reserved / MI325X_MAX_RESERVED - 1
    print(f"\nMI325X 70B FP8 FSDP2, iteration 1 max reserved: measured {MI325X_MAX_RESERVED / MiB:.0f} MiB, "
          f"projected {reserved / MiB:.0f} ({err:+.1%})")
    return float(err)


# AMD Primus runs on MI325X (benchmarks/amd_runs/: each log's argument dump as a flat YAML, its memory line in the
# header), each reporting iteration 1's max allocated once, compared as _first_iteration_peak reads it.
PRIMUS_RUNS = {  # file, nodes, measured iteration-1 max allocated MiB (rank 0)
    "7b": ("primus_llama2_7b_fp8_64xmi325x.yaml", 8, 111506.17822265625),
    "mixtral": ("primus_mixtral_8x7b_bf16_ep8_64xmi325x.yaml", 8, 108035.423828125),
    "70b_fsdp2": ("primus_llama2_70b_fp8_fsdp2_16xmi325x.yaml", 2, 169964.1650390625),
}


def _primus_first_iteration_error(key: str) -> float:
    name, nodes, measured = PRIMUS_RUNS[key]
    sc = api.load(load_benchmark("accuracy_amd").RUNS / name, hardware="mi325x", nodes=nodes)
    (rank,) = api.estimate_memory(sc).ranks
    first = _first_iteration_peak(sc, rank)
    err = first / (measured * MiB) - 1
    print(f"\n{name}: iteration 1 max allocated measured {measured:.0f} MiB, projected {first / MiB:.0f} ({err:+.1%})")
    return err


@pytest.mark.parametrize("key", ["7b", "mixtral"])
def test_first_iteration_peak_of_primus_runs_on_mi325x(key: str) -> None:
    """Measured 2026-11-30: Llama-2-7B FP8 -0.3 %, Mixtral-8x7B BF16 with EP 8 -1.8 %."""
    assert abs(_primus_first_iteration_error(key)) <= LIMIT


@pytest.mark.xfail(strict=True, reason=(
    "measured 2026-11-30: Llama-2-70B FP8 with FSDP2 on 16 MI325X (Primus), iteration 1 max allocated projected "
    "-11.2 % and the allocated after the step -5.8 % (131,349 against 139,477 MiB): some 8,000 MiB that outlive the "
    "step are not in the estimate (the ROCm Megatron-LM 70B FSDP2 run above is within 2.5 %); not investigated "
    "further"))
def test_first_iteration_peak_of_a_primus_fsdp2_run_on_mi325x() -> None:
    assert abs(_primus_first_iteration_error("70b_fsdp2")) <= LIMIT


def test_misses_no_worse(tmp_path: Path) -> None:
    """The three strict xfails above stay green however far they move; each is held to the error it records, plus
    tests/oracle/test_known_misses.py's DRIFT (a regression guard, not an accuracy claim)."""
    from tests.oracle.test_known_misses import DRIFT

    for err, recorded in ((_fixstars_allocated_error(tmp_path), 0.164), (_mi325x_reserved_error(tmp_path), -0.150),
                          (_primus_first_iteration_error("70b_fsdp2"), -0.112)):
        assert abs(err) <= abs(recorded) + DRIFT, (err, recorded)
