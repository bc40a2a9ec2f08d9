"""Accuracy of `projection performance` on published end-to-end training results (issue 6).

Run: python3 benchmarks/accuracy.py            (needs ../shared/reference/validation-public.md only for reading; the
                                               cases below are transcribed from it, section by section)

Every case of validation-public.md that pairs a configuration with a measured throughput is projected with the
shipped default calibration of its device (`projection.perf.default_cost_model`: calibrations/<device>.json, or the
device roofline where no calibration is shipped, said in the table) and no per-case constant. The
published numbers are validation only: nothing in projection is fitted to them.

Metrics and conversions (validation-public.md §0.2), error = projected / measured - 1 on a throughput:
* Narayanan 2021 Table 1 (A100): published "achieved TFLOP/s/GPU" counts recompute FLOPs, F96 = 96 B s l h^2 (1 +
  s/(6h) + V/(16 l h)); projected TFLOP/s/GPU = F96 / (projected step time x GPUs).
* Korthikanti 2022 (A100): published iteration time t (full recompute; SP + selective recompute); compared as
  tokens/s/GPU = GBS s / (t GPUs) against the projected tokens/s/GPU (the same as comparing 1/t).
* Megatron-LM README 2024 (H100): published TFLOP/s/GPU with Megatron's model FLOPs F72 = 72 B s l h^2 (1 + s/(6h) +
  V/(12 l h)) (no recompute counted, attention non-causal); projected = F72 / (projected step time x GPUs).
* NeMo 24.07 (H100, FP8): published tokens/s/GPU, compared directly (NeMo's TFLOP/s formula is not Megatron's).

Case construction (native scenarios; tag A = assumed, not stated by the source):
* GPT models: LayerNorm, GELU 4h MLP, biases, learned positions, tied embeddings, vocab 51,200 (Narayanan,
  Korthikanti, NeMo GPT3); the Megatron-LM 2024 table: vocab 131,072 and untied embeddings (validation-public.md §3 D).
* Narayanan: fp16, full uniform recompute of every layer, no distributed optimizer, unfused softmax attention (A:
  the 2021 code had no flash attention), dropout 0.1 (A: Megatron default), `torch` DDP overlaps the gradient
  all-reduce with the backward (rows marked torch), `local` DDP does not.
* Korthikanti: fp16, DP 1, unfused softmax attention (A), dropout 0.1 (A); "full" = TP without SP + full recompute,
  "sel" = TP + SP + selective (core attention) recompute.
* Megatron-LM 2024: bf16 (A), MBS 1 (A), no recompute (A), distributed optimizer, SP, overlap of gradient reduce,
  parameter gather and TP communication (R: README flags), flash attention, dropout 0.1 (A: Megatron default).
* NeMo 24.07: FP8 (hybrid, delayed scaling) with bf16 params (no fp8 params), distributed optimizer, no recompute
  (R2: NVIDIA/NeMo-Framework-Launcher training YAMLs of the period: `fp8_params` absent (NeMo default False),
  `activations_checkpoint_granularity: null`); gradients reduced in bf16 (R2: the launcher's H100 FP8 example
  scripts examples/training/{gpt,llama}/h100/*_fp8.sh pass `+optim.grad_sync_dtype=bf16`, and nemotron_340b.yaml
  sets `grad_sync_dtype: bf16`) except Nemotron-8B and -22B, whose scripts do not (fp32, Apex DistributedFusedAdam's
  default); A: those scripts and YAMLs are the runs' (the table names no config), and the word/output embeddings'
  gradients, which NeMo keeps in fp32, are priced in bf16 with the rest; SP, overlap of gradient reduce, parameter
  gather and TP communication (A: the stored YAMLs disagree between versions on `ub_tp_comm_overlap`); flash attention;
  Llama-2/3 from the bundled presets, Nemotron from NeMo's NemotronConfig (LayerNorm, squared-ReLU 4h MLP, no
  biases, RoPE, untied, vocab 256,000; 8B/22B MHA, 340B 8 KV heads), GPT3 from NeMo's GPTConfig (dropout 0 for 175B).
* Pipelines run Megatron's schedules.py (`pipeline_runtime: megatron`, sim/p2p_walk.py): Narayanan and
  Korthikanti without overlapped p2p (`overlap_p2p_comm` came to Megatron in 2023, so their interleaved runs made
  the blocking 4-way exchange) and with Megatron's 2021-22 scatter/gather of p2p tensors (its default then, off
  with SP: Narayanan §4.1); NeMo with overlapped p2p (R2: the launcher's training YAMLs, e.g.
  conf/training/llama/llama2_70b.yaml, set `overlap_p2p_comm: true`, `batch_p2p_comm: false`).
Not scored: the Korthikanti 530B / 2240-GPU MFU (global batch not published), the Megatron-LM strong-scaling plot (no
table), the NeMo long-sequence tables of §4.2 (other releases, TFLOP/s by NeMo's own formula only).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from projection import api  # noqa: E402

REFERENCE = REPO.parent / "shared" / "reference" / "validation-public.md"
GPUS_PER_NODE = 8


# ---------------------------------------------------------------------------------------------------------- FLOPs
def f96(b: int, s: int, l: int, h: int, v: int) -> float:  # noqa: E741
    """Narayanan 2021 Eq. 3 with full recompute (validation-public.md §0.2)."""
    return 96.0 * b * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))


def f72(b: int, s: int, l: int, h: int, v: int) -> float:  # noqa: E741
    """Megatron model FLOPs per iteration, no recompute, FFN 4h, MHA (validation-public.md §0.2)."""
    return 72.0 * b * s * l * h * h * (1 + s / (6 * h) + v / (12 * l * h))


# ---------------------------------------------------------------------------------------------------------- cases
@dataclass(frozen=True)
class Case:
    source: str                      # table it comes from
    name: str
    gpus: int
    scenario: dict[str, Any]         # native scenario YAML (model inline or a preset name)
    metric: str                      # what `measured` is
    measured: float
    projected_metric: Callable[[Any, Case], float] = field(compare=False)
    note: str = ""
    script: str = ""                 # a launch script loaded as the file itself, instead of `scenario`
    config: str = ""                 # or a config file (a path) loaded as it is
    hardware: str = ""               # with `script` or `config`: the device and node count it ran on
    nodes: int = 0
    pytorch: str = ""                # with `config`: the torch release the run used (api.load's pytorch), if known


def _gpt(name: str, layers: int, hidden: int, heads: int, seq: int, vocab: int = 51200, tied: bool = True,
         ffn: int | None = None) -> dict[str, Any]:
    return {"name": name, "num_layers": layers, "hidden_size": hidden, "num_attention_heads": heads,
            "ffn_hidden_size": ffn or 4 * hidden, "gated_mlp": False, "activation": "gelu", "norm": "layernorm",
            "add_bias_linear": True, "add_qkv_bias": True, "position_embedding": "learned",
            "max_position_embeddings": seq, "tie_embeddings": tied, "vocab_size": vocab, "vocab_divisible_by": 128,
            "vocab_pad_with_tp": True}


def _nemotron(name: str, layers: int, hidden: int, heads: int, kv: int | None) -> dict[str, Any]:
    return {"name": name, "num_layers": layers, "hidden_size": hidden, "num_attention_heads": heads,
            "num_kv_heads": kv, "ffn_hidden_size": 4 * hidden, "gated_mlp": False, "activation": "squared_relu",
            "norm": "layernorm", "add_bias_linear": False, "position_embedding": "rope",
            "max_position_embeddings": 4096, "tie_embeddings": False, "vocab_size": 256000, "vocab_divisible_by": 128,
            "vocab_pad_with_tp": True}


def _scenario(model: Any, *, gpus: int, hardware: str, seq: int, mbs: int, gbs: int, tp: int, pp: int = 1,
              vpp: int = 1, cp: int = 1, sp: bool = False, dtype: str = "bf16", recompute: dict[str, Any] | None = None,
              zero: int = 0, overlap: dict[str, bool] | None = None, attention: str = "flash", dropout: float = 0.0,
              fp8: bool = False, grad_reduce: str = "fp32", scatter_gather: bool = False) -> dict[str, Any]:
    training: dict[str, Any] = {"seq_length": seq, "micro_batch_size": mbs, "global_batch_size": gbs,
                                "params_dtype": dtype, "dropout": dropout, "attention_backend": attention}
    if grad_reduce != "fp32":
        training["optimizer"] = {"main_grads_dtype": grad_reduce}
    if fp8:
        training["fp8"] = {"format": "hybrid", "recipe": "delayed"}
    plan: dict[str, Any] = {"tp": tp, "sp": sp and tp > 1, "pp": pp, "cp": cp,
                            "schedule": "interleaved_1f1b" if vpp > 1 else "1f1b",
                            "sharding": {"zero_stage": zero}, "overlap": dict(overlap or {}),
                            "pipeline_runtime": "megatron", "p2p_scatter_gather": scatter_gather}
    if vpp > 1:
        plan["vpp"] = vpp
    if recompute:
        plan["recompute"] = recompute
    assert gpus % GPUS_PER_NODE == 0, gpus
    return {"model": model, "training": training, "plan": plan,
            "cluster": {"hardware": hardware, "nodes": gpus // GPUS_PER_NODE, "gpus_per_node": GPUS_PER_NODE}}


def _tflops(formula: Callable[[int, int, int, int, int], float]) -> Callable[[Any, Case], float]:
    def metric(proj: Any, case: Case) -> float:
        m, t = case.scenario["model"], case.scenario["training"]
        flop = formula(t["global_batch_size"], t["seq_length"], m["num_layers"], m["hidden_size"], m["vocab_size"])
        return flop / (proj.step_time_s * case.gpus) / 1e12
    return metric


def _tokens(proj: Any, case: Case) -> float:
    return float(proj.tokens_per_s_per_gpu)


FULL = {"granularity": "full", "method": "uniform", "num_layers": 1}
SELECTIVE = {"granularity": "selective", "modules": ["core_attn"]}
OVERLAP_ALL = {"grad_reduce": True, "param_gather": True, "tp_comm": True}

# Narayanan 2021 Table 1 (validation-public.md §1): model, heads, hidden, layers, TP, PP, VPP, GPUs, MBS, GBS, DDP,
# achieved TFLOP/s/GPU
NARAYANAN = [
    ("1.7B", 24, 2304, 24, 1, 1, 1, 32, 16, 512, "torch", 137),
    ("3.6B", 32, 3072, 30, 2, 1, 1, 64, 16, 512, "torch", 138),
    ("7.5B", 32, 4096, 36, 4, 1, 1, 128, 16, 512, "torch", 142),
    ("18B", 48, 6144, 40, 8, 1, 1, 256, 8, 1024, "torch", 135),
    ("39B", 64, 8192, 48, 8, 2, 1, 512, 4, 1536, "local", 138),
    ("76B", 80, 10240, 60, 8, 4, 3, 1024, 2, 1792, "local", 140),
    ("145B", 96, 12288, 80, 8, 8, 2, 1536, 2, 2304, "local", 148),
    ("310B", 128, 16384, 96, 8, 16, 2, 1920, 1, 2160, "local", 155),
    ("530B", 128, 20480, 105, 8, 35, 3, 2520, 1, 2520, "local", 163),
    ("1T", 160, 25600, 128, 8, 64, 1, 3072, 1, 3072, "local", 163),
]

# Korthikanti 2022 (validation-public.md §2): model, heads, hidden, layers, TP, PP, VPP, GPUs, MBS, GBS,
# iteration s full recompute, iteration s SP + selective
KORTHIKANTI = [
    ("22B", 64, 6144, 48, 8, 1, 1, 8, 4, 4, 1.42, 1.10),
    ("175B", 96, 12288, 96, 8, 8, 3, 64, 1, 64, 18.13, 13.75),
    ("530B", 128, 20480, 105, 8, 35, 3, 280, 1, 280, 49.05, 37.83),
    ("1T", 160, 25600, 128, 8, 64, 1, 512, 1, 512, 94.42, 71.49),
]

# Megatron-LM README 2024 H100 table (validation-public.md §3): model, heads, hidden, layers, TP, PP, GPUs, GBS,
# TFLOP/s/GPU
MEGATRON_2024 = [
    ("1.7B", 16, 2048, 24, 1, 1, 48, 192, 408.8),
    ("7.1B", 32, 4096, 30, 2, 1, 96, 192, 465.9),
    ("16B", 48, 6144, 32, 4, 1, 192, 192, 489.1),
    ("32B", 56, 7168, 48, 8, 1, 384, 192, 459.6),
    ("70B", 64, 8192, 84, 8, 2, 768, 384, 419.7),
    ("119B", 80, 10240, 92, 8, 4, 1536, 768, 420.5),
    ("177B", 96, 12288, 96, 8, 6, 2304, 1152, 432.8),
    ("314B", 128, 16384, 96, 8, 8, 3072, 1536, 474.4),
    ("462B", 144, 18432, 112, 8, 16, 6144, 3072, 459.9),
]

# NeMo 24.07 pretraining (validation-public.md §4.1): model, GPUs, GBS, MBS, seq, TP, PP, CP, VP, tokens/s/GPU
NEMO = [
    ("GPT3-5B", 64, 2048, 4, 2048, 1, 1, 1, 1, 23406),
    ("GPT3-20B", 64, 256, 2, 2048, 2, 1, 1, 1, 5851),
    ("GPT3-175B", 128, 256, 1, 2048, 4, 8, 1, 6, 716),
    ("GPT3-175B", 512, 2048, 2, 2048, 4, 8, 1, 6, 825),
    ("LLAMA2-7B", 8, 128, 1, 4096, 1, 1, 1, 1, 16934),
    ("LLAMA2-13B", 16, 128, 1, 4096, 1, 4, 1, 10, 8715),
    ("LLAMA2-70B", 64, 128, 1, 4096, 4, 4, 1, 20, 1728),
    ("Nemotron-8B", 64, 256, 4, 4096, 2, 1, 1, 1, 12507),
    ("Nemotron-22B", 64, 256, 2, 4096, 2, 4, 1, 10, 4312),
    ("Nemotron-340B", 128, 32, 1, 4096, 8, 8, 1, 12, 326),
    ("LLAMA3-8B", 8, 128, 1, 8192, 1, 1, 2, 1, 12273),
    ("LLAMA3-70B", 64, 128, 1, 8192, 4, 4, 2, 5, 1524),
]

NEMO_MODELS: dict[str, Any] = {
    "GPT3-5B": _gpt("gpt3-5b", 24, 4096, 32, 2048),
    "GPT3-20B": _gpt("gpt3-20b", 44, 6144, 48, 2048),
    "GPT3-175B": _gpt("gpt3-175b", 96, 12288, 96, 2048),
    "LLAMA2-7B": "llama2_7B",
    "LLAMA2-13B": "llama2_13B",
    "LLAMA2-70B": "llama2_70B",
    "Nemotron-8B": _nemotron("nemotron3-8b", 32, 4096, 32, None),
    "Nemotron-22B": _nemotron("nemotron3-22b", 40, 6144, 48, None),
    "Nemotron-340B": _nemotron("nemotron4-340b", 96, 18432, 96, 8),
    "LLAMA3-8B": "llama3_8B",
    "LLAMA3-70B": "llama3_70B",
}


def cases() -> list[Case]:
    out: list[Case] = []
    for name, heads, h, l, tp, pp, vpp, gpus, mbs, gbs, ddp, tflops in NARAYANAN:  # noqa: E741
        sc = _scenario(_gpt(f"gpt-{name}", l, h, heads, 2048), gpus=gpus, hardware="a100-80g", seq=2048, mbs=mbs,
                       gbs=gbs, tp=tp, pp=pp, vpp=vpp, dtype="fp16", recompute=FULL, attention="unfused",
                       dropout=0.1, overlap={"grad_reduce": ddp == "torch", "p2p_comm": False}, scatter_gather=True)
        out.append(Case("Narayanan 2021 T1", f"{name} tp{tp} pp{pp} vpp{vpp} dp{gpus // (tp * pp)} {ddp}", gpus, sc,
                        "TFLOP/s/GPU (F96)", float(tflops), _tflops(f96)))
    for name, heads, h, l, tp, pp, vpp, gpus, mbs, gbs, t_full, t_sel in KORTHIKANTI:  # noqa: E741
        for variant, t, sp, rc in (("full", t_full, False, FULL), ("sel", t_sel, True, SELECTIVE)):
            sc = _scenario(_gpt(f"gpt-{name}", l, h, heads, 2048), gpus=gpus, hardware="a100-80g", seq=2048, mbs=mbs,
                           gbs=gbs, tp=tp, pp=pp, vpp=vpp, sp=sp, dtype="fp16", recompute=rc, attention="unfused",
                           dropout=0.1, overlap={"p2p_comm": False}, scatter_gather=True)
            out.append(Case("Korthikanti 2022", f"{name} {variant} tp{tp} pp{pp} vpp{vpp}", gpus, sc, "tokens/s/GPU",
                            gbs * 2048 / (t * gpus), _tokens, note=f"iteration {t} s"))
    for name, heads, h, l, tp, pp, gpus, gbs, tflops in MEGATRON_2024:  # noqa: E741
        sc = _scenario(_gpt(f"gpt-{name}", l, h, heads, 4096, vocab=131072, tied=False), gpus=gpus,
                       hardware="h100-sxm", seq=4096, mbs=1, gbs=gbs, tp=tp, pp=pp, sp=True, zero=1,
                       overlap=OVERLAP_ALL, dropout=0.1)
        out.append(Case("Megatron-LM 2024", f"{name} tp{tp} pp{pp} dp{gpus // (tp * pp)}", gpus, sc,
                        "TFLOP/s/GPU (F72)", tflops, _tflops(f72)))
    for name, gpus, gbs, mbs, seq, tp, pp, cp, vp, tokens in NEMO:
        model = NEMO_MODELS[name]
        dropout = 0.1 if name in ("GPT3-5B", "GPT3-20B") else 0.0
        if isinstance(model, dict):
            model = {**model, "max_position_embeddings": seq}
        sc = _scenario(model, gpus=gpus, hardware="h100-sxm", seq=seq, mbs=mbs, gbs=gbs, tp=tp, pp=pp, vpp=vp, cp=cp,
                       sp=True, zero=1, overlap={**OVERLAP_ALL, "p2p_comm": True}, dropout=dropout, fp8=True,
                       grad_reduce="fp32" if name in ("Nemotron-8B", "Nemotron-22B") else "bf16")
        out.append(Case("NeMo 24.07 FP8", f"{name} {gpus}g tp{tp} pp{pp} cp{cp} vp{vp}", gpus, sc, "tokens/s/GPU",
                        float(tokens), _tokens))
    return out


# ---------------------------------------------------------------------------------------------------------- runs
@dataclass(frozen=True)
class Row:
    case: Case
    projected: float
    step_time_s: float
    cost_model: str
    memory: str

    @property
    def error(self) -> float:
        return self.projected / self.case.measured - 1.0


def load_case(case: Case, workdir: Path) -> Any:
    """The case as a validated Scenario: a native YAML written from `scenario`, or the launch script `script` as it
    was run, loaded with projection.api.load."""
    stem = f"{case.source.split()[0].lower()}-{case.name.replace(' ', '_')}"
    if case.config:
        return api.load(Path(case.config), hardware=case.hardware, nodes=case.nodes, pytorch=case.pytorch or None)
    if case.script:
        path = workdir / f"{stem}.sh"
        path.write_text(case.script, encoding="utf-8")
        return api.load(path, hardware=case.hardware, nodes=case.nodes)
    path = workdir / f"{stem}.yaml"
    path.write_text(yaml.safe_dump(case.scenario, sort_keys=False), encoding="utf-8")
    return api.load(path)


def _cost_model_label(scenario: Any, cost_model: Any) -> str:
    device = scenario.cluster.device.name
    shipped = REPO / "calibrations" / f"{device}.json"
    name = str(getattr(cost_model, "name", "") or type(cost_model).__name__)
    if "roofline" in name.lower() or "Roofline" in type(cost_model).__name__:
        return f"roofline ({device}: no shipped calibration)" if not shipped.is_file() else f"roofline ({device})"
    return f"calibrated {shipped.name}" if shipped.is_file() else name


def run_case(case: Case, workdir: Path) -> Row:
    from projection.perf import default_cost_model, project

    sc = load_case(case, workdir)
    assert sc.world_size == case.gpus, (case.name, sc.world_size)
    cm = default_cost_model(sc)
    proj = project(sc, cm)
    verdict = str(getattr(getattr(proj, "memory", None), "verdict", "-"))
    return Row(case, case.projected_metric(proj, case), proj.step_time_s, _cost_model_label(sc, cm), verdict)


def evaluate(selected: Iterable[Case] | None = None) -> list[Row]:
    with tempfile.TemporaryDirectory(prefix="projection-accuracy-") as tmp:
        return [run_case(c, Path(tmp)) for c in (cases() if selected is None else selected)]


def summary(rows: list[Row]) -> tuple[float, float]:
    """Median and largest absolute error (fractions)."""
    errs = [abs(r.error) for r in rows]
    return statistics.median(errs), max(errs)


def format_table(rows: list[Row]) -> str:
    head = (f"{'source':<18} {'case':<34} {'metric':<18} {'measured':>9} {'projected':>9} {'error':>7} "
            f"{'step s':>8}  {'memory':<12} cost model")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r.case.source:<18} {r.case.name:<34} {r.case.metric:<18} {r.case.measured:>9.1f} "
                     f"{r.projected:>9.1f} {r.error:>+7.1%} {r.step_time_s:>8.3f}  {r.memory:<12} {r.cost_model}")
    lines.append("")
    for source in dict.fromkeys(r.case.source for r in rows):
        sub = [r for r in rows if r.case.source == source]
        med, worst = summary(sub)
        lines.append(f"{source:<18} {len(sub):>3} cases: median |error| {med:.1%}, max |error| {worst:.1%}")
    med, worst = summary(rows)
    lines.append(f"{'all':<18} {len(rows):>3} cases: median |error| {med:.1%}, max |error| {worst:.1%}")
    return "\n".join(lines)


def main(selected: Iterable[Case] | None = None,
         what: str = "on the metric shown; see the module docstring for the conversions") -> int:
    t0 = time.perf_counter()
    rows = evaluate(selected)
    print(format_table(rows))
    print(f"({len(rows)} projections in {time.perf_counter() - t0:.1f} s; error = projected / measured - 1 {what})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
