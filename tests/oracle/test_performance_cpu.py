"""Measured on this machine (issue 6, "Must show"): a small GPT trained on the CPU, data-parallel across 2 gloo
processes and in one process, against `projection.perf.project` fed only with calibrations that `projection
calibrate` measured on the same machine a moment before: projected step time within 20 % (2 processes) and 15 % (one
process) of the measured median step.

The job. GPT-style decoder (LayerNorm, GELU 4h MLP, biases, learned positions, tied embeddings; fp32; flash
attention = `F.scaled_dot_product_attention(is_causal=True)`, which runs the CPU flash kernel), Adam (`fused=True`:
one pass over gradient, parameter and moments per tensor). Like Megatron's DDP without overlap, gradients accumulate
into one contiguous fp32 buffer (the autograd accumulation adds each weight gradient into it: the scenario says
`gradient_accumulation_fusion: false`, which prices that add), the buffer is zeroed at the start of the step,
all-reduced over the data-parallel group after the backward, its norm is taken and all-reduced (gradient clipping's
norm), then the optimizer steps. One torch thread per process (`torch.set_num_threads(1)`, the calibrations too):
the 2 processes use 2 cores.

With 2 processes, each round's compute calibration runs as 2 concurrent `projection calibrate` processes (one
core each, both files merged): the job's ranks share this machine's caches, memory bandwidth and clocks, so the
speed a "device" reaches is the one it has while its neighbour works too.

The "device". The scenario's hardware is a device YAML written into tmp_path for this CPU, every number from the
calibrations of this test (peak fp32 FLOP/s = the fastest GEMM measured, memory bandwidth = the fastest memory-bound
row, link = the gloo all-reduce rows) or from the OS (memory size), each with its source; fields that mean nothing
for one CPU (NIC, link kind) are tagged A. The host issue time per kernel comes from `projection calibrate host`,
merged into the calibration (the device YAML has none, so the projection must take the calibration's).

Measurement. A shared virtual machine's speed drifts by 10-20 % over tens of seconds (seen here: the same step
0.69 s one minute, 0.94 s a few minutes later), so calibrating once and then measuring compares two different
machines. The test alternates instead: ROUNDS rounds of [the `projection calibrate` runs, then the training with
STEPS_PER_ROUND measured steps after WARMUP_STEPS warm-up steps]; the rounds' calibrations are merged by `projection
calibrate import` (repeated shapes: their mean), and the measured step is the median over every round's steps
(each step: barrier, then wall time to the end of the optimizer step, the slowest rank). Other processes on a
shared machine steal cores from the workers; the CPU time used by other processes during each round is computed
from /proc/stat and printed; a round during which they used more than a quarter of a core beyond the cores it
leaves free is repeated (twice at most), and if the machine stays that busy the test is skipped with the numbers,
since it would no longer measure this machine's speed. Interference that /proc/stat does not show (a VM host's other
tenants, shared caches) shows in the samples themselves: where the measured steps' own interquartile spread exceeds
the tolerance, they cannot resolve it, and the test says so and skips (CI, 2026-12-02: a 2-core host).
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from projection import api, cli  # noqa: E402
from projection.calibrate.calibration import Calibration, load_calibration  # noqa: E402
from tests.oracle.gpt_job import GPT, Job, config_text, contiguous_grads  # noqa: E402
from tests.oracle.spawn import free_port, run_spawned  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timing]  # times this machine: run alone (README)
T = TypeVar("T")

H, HEADS, LAYERS, VOCAB, SEQ, MBS = 512, 8, 2, 4096, 512, 2
WARMUP_STEPS, STEPS_PER_ROUND, ROUNDS = 2, 2, 4
SINGLE_LIMIT, DP_LIMIT = 0.15, 0.20  # issue 6
BUSY_LIMIT_CORES = 0.25
ATTEMPTS = 2

JOB = Job(h=H, heads=HEADS, layers=LAYERS, vocab=VOCAB, seq=SEQ, mbs=MBS)


# ------------------------------------------------------------------------------------------------ the job in torch
def _train(rank: int, world: int, port: int, out: str) -> None:
    """One data-parallel rank: WARMUP_STEPS + STEPS_PER_ROUND steps; rank 0 writes the per-step max over ranks."""
    torch.set_num_threads(1)
    if world > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = GPT(JOB)
    grads = contiguous_grads(model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, fused=True)
    gen = torch.Generator().manual_seed(rank)
    ids = torch.randint(0, VOCAB, (MBS, SEQ), generator=gen)
    targets = torch.randint(0, VOCAB, (MBS, SEQ), generator=gen)
    times = []
    for _ in range(WARMUP_STEPS + STEPS_PER_ROUND):
        if world > 1:
            dist.barrier()
        t0 = time.perf_counter()
        grads.zero_()
        loss = model(ids, targets) / world
        loss.backward()
        if world > 1:
            dist.all_reduce(grads)
        norm = torch.linalg.vector_norm(grads)  # the clipping norm (max norm not reached: no rescale)
        if world > 1:
            dist.all_reduce(norm)
        opt.step()
        times.append(time.perf_counter() - t0)
    if world > 1:
        slowest = torch.tensor(times, dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        times = slowest.tolist()
        dist.destroy_process_group()
    if rank == 0:
        Path(out).write_text(json.dumps(times[WARMUP_STEPS:]))


def measure_steps(world: int, tmp: Path, limit_s: float = 90.0) -> list[float]:
    """Seconds of each measured training step (the slowest rank)."""
    out = tmp / f"steps-{world}.json"
    if world == 1:
        threads = torch.get_num_threads()
        try:
            _train(0, 1, 0, str(out))
        finally:
            torch.set_num_threads(threads)
    else:
        run_spawned(_train, (world, free_port(), str(out)), world, limit_s, "data-parallel training")
    steps: list[float] = json.loads(out.read_text())
    return steps


# ------------------------------------------------------------------------------------------------ machine load
class Load:
    """CPU seconds used by other processes (not this one nor its reaped children) while the block runs, in cores."""

    def __init__(self) -> None:
        self.foreign_cores = 0.0

    @staticmethod
    def _busy_s() -> float:
        with open("/proc/stat", encoding="utf-8") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        idle = v[3] + (v[4] if len(v) > 4 else 0)
        return (sum(v[:8]) - idle) / os.sysconf("SC_CLK_TCK")

    @staticmethod
    def _own_s() -> float:
        me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime

    def __enter__(self) -> Load:
        self.t0, self.busy0, self.own0 = time.monotonic(), self._busy_s(), self._own_s()
        return self

    def __exit__(self, *exc: object) -> None:
        wall = max(time.monotonic() - self.t0, 1e-9)
        self.foreign_cores = max(0.0, (self._busy_s() - self.busy0) - (self._own_s() - self.own0)) / wall


class Busy(Exception):
    """The machine stayed too busy for a measurement; the message says how busy."""


def quiet(fn: Callable[[], T], what: str, need: int) -> tuple[T, float]:
    """Run fn (which needs `need` cores) until other processes left it those cores: they used at most
    cpu_count - need + BUSY_LIMIT_CORES during it. ATTEMPTS tries; Busy otherwise."""
    limit = (os.cpu_count() or 1) - need + BUSY_LIMIT_CORES
    loads = []
    for _ in range(ATTEMPTS):
        with Load() as load:
            result = fn()
        loads.append(load.foreign_cores)
        if load.foreign_cores <= limit:
            return result, load.foreign_cores
    raise Busy(f"machine busy during {what}: other processes used {', '.join(f'{c:.2f}' for c in loads)} of "
               f"{os.cpu_count()} cores (at most {limit:.2f} leaves the {need} core(s) it needs); last result "
               f"{result}")


def unresolved(what: str, samples: list[float], tolerance: float) -> str | None:
    """Why `samples` cannot judge a projection to `tolerance`, or None: their own interquartile range, relative to
    their median, exceeds it (interference the process check cannot see: a busy VM host, shared caches)."""
    q1, med, q3 = statistics.quantiles(samples, n=4)
    spread = (q3 - q1) / med
    if spread <= tolerance:
        return None
    return (f"{what}: the measured samples' own interquartile spread, {spread:.0%} of their median, exceeds the "
            f"{tolerance:.0%} tolerance: this machine cannot judge it now")


# ------------------------------------------------------------------------------------------------ calibration
def calibrate(*argv: str) -> None:
    assert cli.main(["calibrate", *argv]) == 0, argv


def write_config(path: Path, world: int, hardware: str) -> Path:
    path.write_text(config_text(JOB, hardware, world, name="cpu-gpt"), encoding="utf-8")
    return path


def dp_grad_bytes(config: Path) -> int:
    from projection.workload.shapes import step_shapes

    rows = [r for r in step_shapes(api.load(config)) if r.kind == "collective" and r.group == "dp"]
    assert rows, "no data-parallel gradient reduction in the job's shapes"
    return max(r.size_bytes for r in rows)


def device_yaml(cal: Calibration) -> str:
    """A device YAML for this CPU from the calibration rows (and the OS); every number with its source. Without
    collective rows (the single-process job runs none) the link fields are placeholders, tagged A."""
    gemm = max(cal.gemm, key=lambda r: r.flop_per_s)
    mem = max(cal.memory_bound, key=lambda r: r.size_bytes / r.time_s)
    mem_bw = mem.size_bytes / mem.time_s
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    with open("/proc/cpuinfo", encoding="utf-8") as f:
        model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "CPU")
    vendor = "amd" if "AMD" in model.upper() else "nvidia"  # the schema knows GPU vendors only
    by = "measured by tests/oracle/test_performance_cpu.py on this machine, 1 torch thread"
    ar = [r for r in cal.collective if r.kind == "all_reduce"]
    if ar:
        link = max(ar, key=lambda r: r.busbw_bytes_per_s)
        small = min(ar, key=lambda r: r.size_bytes)
        bw, lat = link.busbw_bytes_per_s, small.time_s / 2
        bw_src = (f"D: largest bus bandwidth of `projection calibrate collective --device cpu` (all_reduce, 2 gloo "
                  f"processes, {link.size_bytes} B), {by}")
        lat_src = f"D: smallest all_reduce time of the same calibration ({small.size_bytes} B) / 2 ring steps, {by}"
    else:
        bw, lat = mem_bw, 1e-6
        bw_src = "A: placeholder (the memory bandwidth); the single-process job runs no collective"
        lat_src = "A: placeholder 1 us; the single-process job runs no collective"
    return f"""\
name: cpu-test
vendor: {vendor}
marketing_name: "{model} (1 core, 1 torch thread)"
peak_flop_per_s: {{fp32: {gemm.flop_per_s:.6e}}}
hbm_bytes: {ram}
hbm_bandwidth_bytes_per_s: {mem_bw:.6e}
gpus_per_node: 2
intra_node: {{kind: pcie, topology: switch, links_per_gpu: 1, bandwidth_per_direction_bytes_per_s: {bw:.6e}, \
latency_s: {lat:.6e}}}
nic: {{count_per_node: 1, bandwidth_bytes_per_s: {bw:.6e}, latency_s: {lat:.6e}}}
sources:
  peak_flop_per_s.fp32: "D: fastest GEMM of `projection calibrate gemm --device cpu` ({gemm.m}x{gemm.n}x{gemm.k} \
{gemm.layout}, {gemm.flop_per_s / 1e9:.1f} GFLOP/s), {by}"
  hbm_bytes: "R: os.sysconf(SC_PAGE_SIZE x SC_PHYS_PAGES), {by}"
  hbm_bandwidth_bytes_per_s: "D: fastest row of `projection calibrate memory --device cpu` (add over \
{mem.size_bytes} B), {by}"
  gpus_per_node: "R: the test runs 2 data-parallel processes on this machine"
  intra_node.links_per_gpu: "A: processes exchange through the host (gloo over loopback); one logical link"
  intra_node.bandwidth_per_direction_bytes_per_s: "{bw_src}"
  intra_node.latency_s: "{lat_src}"
  nic.count_per_node: "A: one node, no scale-out traffic; mirrors the intra-node link"
  nic.bandwidth_bytes_per_s: "A: one node, no scale-out traffic; the intra-node value"
  nic.latency_s: "A: one node, no scale-out traffic; the intra-node value"
"""


def concurrent(runs: list[list[list[str]]]) -> None:
    """Each element of `runs` (a list of `projection calibrate` argument lists) in a process of its own, all at
    once, with one torch thread each."""
    script = "import sys, json, torch; torch.set_num_threads(1); from projection import cli; " \
             "sys.exit(max(cli.main(['calibrate', *a]) for a in json.loads(sys.argv[1])))"
    procs = [subprocess.Popen([sys.executable, "-c", script, json.dumps(argvs)]) for argvs in runs]
    codes = [p.wait(timeout=300) for p in procs]
    assert codes == [0] * len(runs), codes


class one_thread:  # noqa: N801 - a context manager, used like a function
    """torch.set_num_threads(1) inside the block (the calibrations run in this process)."""

    def __enter__(self) -> None:
        self.threads = torch.get_num_threads()
        torch.set_num_threads(1)

    def __exit__(self, *exc: object) -> None:
        torch.set_num_threads(self.threads)


class Machine:
    """This machine's calibrations and the device YAML built from them. `calibrate_round` runs one round of
    `projection calibrate` (compute on 1 core; with world 2 also the gloo all-reduce on 2 processes) into files of
    its own; `project` merges the given rounds' files and projects the job from them."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.shapes = write_config(tmp / "shapes.yaml", 2, "mi300x")  # any device: the shapes do not depend on it
        self.host = tmp / "host.json"
        with one_thread():
            calibrate("host", "--device", "cpu", "--quiet", "--out", str(self.host))
        self.grad_bytes = dp_grad_bytes(self.shapes)

    def compute_argv(self, tag: str) -> list[list[str]]:
        """The `projection calibrate` runs of the compute calibration (1 core), writing files tagged `tag`."""
        common = ["--device", "cpu", "--quiet", "--warmup", "1", "--repeat", "3", "--dtype", "fp32"]
        sizes = ",".join(str(4**k) for k in range(6, 15))  # 4 KiB .. 256 MiB read + written
        config = ["--config", str(self.shapes)]
        return [["gemm", *config, "--out", str(self.tmp / f"gemm-{tag}.json"), *common],
                ["attention", *config, "--out", str(self.tmp / f"attention-{tag}.json"), *common],
                ["memory", *config, "--sizes", sizes, "--out", str(self.tmp / f"memory-{tag}.json"), *common]]

    def calibrate_round(self, tag: str, world: int) -> list[Path]:
        """One round. With world > 1 the compute calibration runs as `world` concurrent `projection calibrate`
        processes of 1 thread each, as the job's ranks share this machine (caches, memory bandwidth, clocks)."""
        tags = [tag] if world == 1 else [f"{tag}-{w}" for w in range(world)]
        out = [self.tmp / f"{part}-{t}.json" for t in tags for part in ("gemm", "attention", "memory")]
        with one_thread():
            if world == 1:
                for argv in self.compute_argv(tag):
                    calibrate(*argv)
            else:
                concurrent([self.compute_argv(t) for t in tags])
            if world > 1:
                out.append(self.tmp / f"collective-{tag}.json")
                grad = self.grad_bytes
                sizes = ",".join(str(s) for s in (4, 4096, 65536, 2**20, 2**22, grad // 2, grad))
                calibrate("collective", "--kinds", "all_reduce", "--sizes", sizes, "--world-size", str(world),
                          "--device", "cpu", "--warmup", "2", "--repeat", "5", "--quiet", "--out", str(out[-1]))
        return out

    def project(self, world: int, files: list[Path]) -> Any:
        from projection.perf import default_cost_model, project

        cal_path = self.tmp / f"cpu-{world}.json"
        calibrate("import", *(str(f) for f in (*files, self.host)), "--out", str(cal_path))
        hardware = self.tmp / f"cpu-test-{world}.yaml"
        hardware.write_text(device_yaml(load_calibration(cal_path)), encoding="utf-8")
        config = write_config(self.tmp / f"job-{world}.yaml", world, str(hardware))
        sc = api.load(config, hardware=str(hardware))
        assert sc.world_size == world and sc.cluster.device.name == "cpu-test"
        proj = project(sc, default_cost_model(sc, calibration=cal_path))
        assert proj.priced.host_source == f"calibration {cal_path.name}" and proj.priced.host_kernel_issue_s > 0
        return proj, hardware


@pytest.fixture(scope="module")
def machine(tmp_path_factory: pytest.TempPathFactory) -> Machine:
    return Machine(tmp_path_factory.mktemp("cpu-perf"))


def rounds(machine: Machine, world: int, tmp: Path) -> tuple[list[Path], list[float], list[float]]:
    """ROUNDS x [calibrate, then train]: the calibration files, every measured step, and the other processes' load
    (cores) of each round. Raises Busy when a round stays too busy."""
    files: list[Path] = []
    steps: list[float] = []
    loads: list[float] = []
    for r in range(ROUNDS):
        def one_round(r: int = r) -> tuple[list[Path], list[float]]:
            t0 = time.perf_counter()
            cal = machine.calibrate_round(f"{world}p-r{r}", world)
            t1 = time.perf_counter()
            measured = measure_steps(world, tmp)
            print(f"\n  round {r}: calibrated in {t1 - t0:.1f} s, then steps {[round(t, 4) for t in measured]} s")
            return cal, measured

        (cal, measured), load = quiet(one_round, f"round {r}", need=world)
        files += cal
        steps += measured
        loads.append(load)
    return files, steps, loads


def _judge(what: str, measured: list[float], proj: Any, loads: list[float], limit: float) -> None:
    """Print the comparison; skip where the measured steps' own spread cannot resolve `limit`; else hold the
    projected step to it, a failure carrying its numbers on one line (a CI log keeps the short summary when it
    cuts the captured output)."""
    med = statistics.median(measured)
    err = proj.step_time_s / med - 1.0
    parts = ", ".join(f"{k} {v * 1e3:.1f}" for k, v in proj.breakdown_s.items() if v > 0)
    summary = (f"measured steps {[round(t, 4) for t in measured]} s, median {med:.4f} s (other processes "
               f"{', '.join(f'{c:.2f}' for c in loads)} cores in the {len(loads)} rounds); projected "
               f"{proj.step_time_s:.4f} s -> error {err:+.1%} (limit {limit:.0%}); projected breakdown (ms): {parts}")
    print(f"\n{what}: {summary}\n  cost sources: "
          + ", ".join(f"{k} {100 * v:.0f}%" for k, v in sorted(proj.provenance.items(), key=lambda kv: -kv[1])))
    if why := unresolved(what, measured, limit):
        pytest.skip(why)
    assert abs(err) <= limit, summary


def measured_and_projected(machine: Machine, world: int, tmp: Path) -> tuple[list[float], Any, Path, list[float]]:
    """The rounds' measured steps, the projection from their calibrations, the device YAML and the loads; skips
    when the machine stays too busy."""
    try:
        files, measured, loads = rounds(machine, world, tmp)
    except Busy as e:
        pytest.skip(str(e))
    proj, hardware = machine.project(world, files)
    return measured, proj, hardware, loads


def test_single_process_step(machine: Machine, tmp_path: Path) -> None:
    measured, proj, _, loads = measured_and_projected(machine, 1, tmp_path)
    _judge("1 process", measured, proj, loads, SINGLE_LIMIT)


def test_two_process_data_parallel_step(machine: Machine, tmp_path: Path) -> None:
    measured, proj, hardware, loads = measured_and_projected(machine, 2, tmp_path)
    print(f"\ndevice YAML {hardware}:\n{hardware.read_text()}")
    assert proj.world_size == 2 and proj.scenario.plan.dp_() == 2 and proj.comm_total_s["dp"] > 0
    _judge("2 gloo processes (data parallel)", measured, proj, loads, DP_LIMIT)
