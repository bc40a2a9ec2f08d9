"""One prepared session on a lent accelerator: calibrate it with `projection calibrate`, time a real training step of
a GPT on it, and compare the step with `projection performance` fed only with those calibrations (the GPU twin of
tests/oracle/test_performance_cpu.py, single process).

Run (on the device machine, from the repository root; everything it writes goes under --out):
    python3 benchmarks/device_check.py --out "$OUT" [--hardware h200] [--device cuda]
Dry run on a CPU (tiny model, minutes):
    python3 benchmarks/device_check.py --out /tmp/check --device cpu --small

The job: the GPT of tests/oracle/test_performance_cpu.py (LayerNorm, GELU 4h MLP, biases, learned positions, tied
embeddings, fp32 with TF32 off, SDPA causal attention, a contiguous fp32 gradient buffer the autograd accumulation
adds into, the clipping norm, fused Adam), sized for a GPU unless --small. Steps: `projection calibrate host`,
`gemm`, `attention` and `memory` on the job's shapes (fp32), merged by `projection calibrate import` into
OUT/calibration.json; then WARMUP + STEPS timed steps (device synchronised around each); then the projection with
that calibration on the `--hardware` device YAML. OUT/device_check.json records measured and projected seconds, the
error, the device and the library versions; keep it in the repo with its provenance when the run is real.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from projection import api, cli  # noqa: E402

WARMUP, STEPS = 3, 10
FULL = {"h": 2048, "heads": 16, "layers": 8, "vocab": 32768, "seq": 2048, "mbs": 4}
SMALL = {"h": 256, "heads": 4, "layers": 2, "vocab": 2048, "seq": 256, "mbs": 2}


def config_text(d: dict[str, int], hardware: str) -> str:
    return f"""\
model: {{name: device-check-gpt, num_layers: {d['layers']}, hidden_size: {d['h']}, num_attention_heads: {d['heads']},
        ffn_hidden_size: {4 * d['h']}, gated_mlp: false, activation: gelu, norm: layernorm, add_bias_linear: true,
        add_qkv_bias: true, position_embedding: learned, max_position_embeddings: {d['seq']}, tie_embeddings: true,
        vocab_size: {d['vocab']}}}
training: {{seq_length: {d['seq']}, micro_batch_size: {d['mbs']}, global_batch_size: {d['mbs']}, params_dtype: fp32,
           attention_backend: flash, gradient_accumulation_fusion: false}}
plan: {{tp: 1, pp: 1}}
cluster: {{hardware: {hardware}, nodes: 1, gpus_per_node: 1}}
"""


class Block(nn.Module):
    def __init__(self, h: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.qkv, self.proj = nn.LayerNorm(h), nn.Linear(h, 3 * h), nn.Linear(h, h)
        self.ln2, self.fc1, self.fc2 = nn.LayerNorm(h), nn.Linear(h, 4 * h), nn.Linear(4 * h, h)

    def forward(self, x: Any) -> Any:
        b, t, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, h))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, d: dict[str, int]) -> None:
        super().__init__()
        self.vocab = d["vocab"]
        self.wte, self.wpe = nn.Embedding(d["vocab"], d["h"]), nn.Embedding(d["seq"], d["h"])
        self.blocks = nn.ModuleList(Block(d["h"], d["heads"]) for _ in range(d["layers"]))
        self.ln_f = nn.LayerNorm(d["h"])

    def forward(self, ids: Any, targets: Any) -> Any:
        x = self.wte(ids) + self.wpe.weight[: ids.shape[1]]
        for block in self.blocks:
            x = block(x)
        return F.cross_entropy(F.linear(self.ln_f(x), self.wte.weight).view(-1, self.vocab), targets.view(-1))


def measure(d: dict[str, int], device: torch.device) -> list[float]:
    """Seconds of each timed step (device synchronised before and after)."""
    torch.manual_seed(0)
    model = GPT(d).to(device)
    params = list(model.parameters())
    grads = torch.zeros(sum(p.numel() for p in params), device=device)
    offset = 0
    for p in params:  # contiguous gradient buffer, as in Megatron's DDP
        p.grad = grads[offset: offset + p.numel()].view_as(p)
        offset += p.numel()
    opt = torch.optim.Adam(params, lr=1e-4, fused=True)
    ids = torch.randint(0, d["vocab"], (d["mbs"], d["seq"]), device=device)
    targets = torch.randint(0, d["vocab"], (d["mbs"], d["seq"]), device=device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    times = []
    for _ in range(WARMUP + STEPS):
        sync()
        t0 = time.perf_counter()
        grads.zero_()
        model(ids, targets).backward()
        torch.linalg.vector_norm(grads)
        opt.step()
        sync()
        times.append(time.perf_counter() - t0)
    return times[WARMUP:]


def main() -> int:
    ap = argparse.ArgumentParser(description="Calibrate a device, time a real step, compare with the projection.")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--hardware", default="h200", help="device YAML of the machine (hardware_specs/)")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--small", action="store_true", help="the tiny model (a dry run)")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 GEMMs, as the calibration times them
    torch.backends.cudnn.allow_tf32 = False
    d = SMALL if args.small else FULL
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    cfg = out / "job.yaml"
    cfg.write_text(config_text(d, args.hardware), encoding="utf-8")
    common = ["--device", args.device, "--quiet", "--warmup", "2", "--repeat", "5"]
    files = []
    for kind in ("host", "gemm", "attention", "memory"):
        path = out / f"{kind}.json"
        job = [] if kind == "host" else ["--config", str(cfg), "--dtype", "fp32"]
        t0 = time.perf_counter()
        if cli.main(["calibrate", kind, *job, *common, "--out", str(path)]) != 0:
            return 1
        print(f"calibrate {kind}: {time.perf_counter() - t0:.1f} s", flush=True)
        files.append(str(path))
    cal = out / "calibration.json"
    if cli.main(["calibrate", "import", *files, "--out", str(cal)]) != 0:
        return 1
    steps = measure(d, torch.device(args.device))
    from projection.perf import default_cost_model, project

    sc = api.load(cfg)
    proj = project(sc, default_cost_model(sc, calibration=cal))
    measured = statistics.median(steps)
    error = proj.step_time_s / measured - 1.0
    record = {"measured_steps_s": steps, "measured_median_s": measured, "projected_s": proj.step_time_s,
              "error": error, "breakdown_s": dict(proj.breakdown_s), "job": d, "hardware": args.hardware,
              "device": args.device, "torch": torch.__version__,
              "device_name": torch.cuda.get_device_name() if args.device == "cuda" else "cpu"}
    (out / "device_check.json").write_text(json.dumps(record, indent=2), encoding="utf-8")
    print(f"measured {measured:.4f} s (median of {len(steps)}), projected {proj.step_time_s:.4f} s, "
          f"error {error:+.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
