"""One prepared session on a lent accelerator: calibrate it with `projection calibrate`, time a real training step of
a GPT on it, and compare the step with `projection performance` fed only with those calibrations (the GPU twin of
tests/oracle/test_performance_cpu.py, single process).

Run (on the device machine, from the repository root; everything it writes goes under --out):
    python3 benchmarks/device_check.py --out "$OUT" [--hardware h200] [--device cuda]
Dry run on a CPU (tiny model, minutes):
    python3 benchmarks/device_check.py --out /tmp/check --device cpu --small

The job: the GPT of tests/oracle/gpt_job.py, as tests/oracle/test_performance_cpu.py trains it (fp32 with TF32 off, a
contiguous fp32 gradient buffer, the clipping norm, fused Adam), sized for a GPU unless --small. Steps: `projection
calibrate host`, `gemm`, `attention` and `memory` on the job's shapes (fp32), merged by `projection calibrate import`
into OUT/calibration.json; then WARMUP + STEPS timed steps (device synchronised around each); then the projection with
that calibration on the `--hardware` device YAML. OUT/device_check.json records measured and projected seconds, the
error, the device and the library versions, and the achieved pinned host<->device copy rates beside the device YAML's
host link line rate; keep it in the repo with its provenance when the run is real. Then, where megatron-core is
importable, benchmarks/gpu_megatron_host.py measures Megatron-Core's layer host time on the GPU host into
OUT/megatron_host_gpu.json (the functional tests' missing number, docs/performance.md).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from projection import api, cli  # noqa: E402
from tests.oracle.gpt_job import GPT, Job, config_text, contiguous_grads  # noqa: E402

WARMUP, STEPS = 3, 10
FULL = Job(h=2048, heads=16, layers=8, vocab=32768, seq=2048, mbs=4)
SMALL = Job(h=256, heads=4, layers=2, vocab=2048, seq=256, mbs=2)


def measure(job: Job, device: torch.device) -> list[float]:
    """Seconds of each timed step (device synchronised before and after)."""
    torch.manual_seed(0)
    model = GPT(job).to(device)
    grads = contiguous_grads(model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, fused=True)
    ids = torch.randint(0, job.vocab, (job.mbs, job.seq), device=device)
    targets = torch.randint(0, job.vocab, (job.mbs, job.seq), device=device)
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


def host_link(device: torch.device, nbytes: int = 1 << 28, repeat: int = 10) -> dict[str, float]:
    """Achieved bytes/s of pinned host-to-device and device-to-host copies (the offload copies of projection/perf
    run at DeviceSpec.host_link_bytes_per_s, the PCIe line rate); empty on the CPU."""
    if device.type != "cuda":
        return {}
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
    out = {}
    for name, dst, src in (("h2d", dev, host), ("d2h", host, dev)):
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(repeat):
            dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        out[f"{name}_bytes_per_s"] = nbytes * repeat / (time.perf_counter() - t0)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description="Calibrate a device, time a real step, compare with the projection.")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--hardware", default="h200", help="device YAML of the machine (hardware_specs/)")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--small", action="store_true", help="the tiny model (a dry run)")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 GEMMs, as the calibration times them
    torch.backends.cudnn.allow_tf32 = False
    job = SMALL if args.small else FULL
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    cfg = out / "job.yaml"
    cfg.write_text(config_text(job, args.hardware, name="device-check-gpt"), encoding="utf-8")
    common = ["--device", args.device, "--quiet", "--warmup", "2", "--repeat", "5"]
    files = []
    for kind in ("host", "gemm", "attention", "memory"):
        path = out / f"{kind}.json"
        shapes = [] if kind == "host" else ["--config", str(cfg), "--dtype", "fp32"]
        t0 = time.perf_counter()
        if cli.main(["calibrate", kind, *shapes, *common, "--out", str(path)]) != 0:
            return 1
        print(f"calibrate {kind}: {time.perf_counter() - t0:.1f} s", flush=True)
        files.append(str(path))
    cal = out / "calibration.json"
    if cli.main(["calibrate", "import", *files, "--out", str(cal)]) != 0:
        return 1
    steps = measure(job, torch.device(args.device))
    from projection.perf import default_cost_model, project

    sc = api.load(cfg)
    proj = project(sc, default_cost_model(sc, calibration=cal))
    measured = statistics.median(steps)
    error = proj.step_time_s / measured - 1.0
    record = {"measured_steps_s": steps, "measured_median_s": measured, "projected_s": proj.step_time_s,
              "error": error, "breakdown_s": dict(proj.breakdown_s), "job": vars(job), "hardware": args.hardware,
              "device": args.device, "torch": torch.__version__, "host_link": host_link(torch.device(args.device)),
              "host_link_yaml_bytes_per_s": sc.cluster.device.host_link_bytes_per_s,
              "device_name": torch.cuda.get_device_name() if args.device == "cuda" else "cpu"}
    (out / "device_check.json").write_text(json.dumps(record, indent=2), encoding="utf-8")
    print(f"measured {measured:.4f} s (median of {len(steps)}), projected {proj.step_time_s:.4f} s, "
          f"error {error:+.1%}", flush=True)
    return megatron_host(out, args.device, args.hardware)


def megatron_host(out: Path, device: str, hardware: str) -> int:
    """benchmarks/gpu_megatron_host.py into OUT/megatron_host_gpu.json where megatron-core is importable (its wheel
    carried to the device: benchmarks/README.md); a note, not a failure, where it is not."""
    try:
        import megatron.core  # noqa: F401
    except ImportError:
        print("megatron-core is not importable here: the Megatron host-time check is skipped (carry its wheel)")
        return 0
    import subprocess

    # its own process: it starts a process group and (on the CPU) patches torch.cuda for Megatron-Core
    script = REPO / "benchmarks" / "gpu_megatron_host.py"
    short = ["--rounds", "1", "--per-round", "3"] if device == "cpu" else []  # the dry run only checks it runs
    return subprocess.run([sys.executable, str(script), "--device", device, "--hardware", hardware, *short,
                           "--out", str(out / "megatron_host_gpu.json")], check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
