"""Seconds of one pipeline action (the F, I, W or B of one virtual stage for one microbatch) from its ops: a compute
stream, one communication stream per group, and the host that issues every kernel.

An action is a sequence of `Item`s, run in order by `run_items`:
- "run": the compute stream runs it (a kernel, or a collective the framework waits for: exposed communication);
- "launch": a collective issued on its group's stream; it starts when the compute stream reaches it (stream order),
  the host has issued it, its stream is free and the launches it names in `after` have finished, and overlaps what
  follows until a "wait" names it;
- "wait": the compute stream waits for the named launches (their unfinished time is exposed communication);
- "sync": the host reads a GPU value (`.item()`, `.cpu()`): it resumes issuing only when the compute stream has
  drained, so the kernels after it cannot be issued ahead; launches on other streams that nothing has waited for yet
  keep running.
Unwaited launches are waited for at the end of the action.

Host issue (the framework-overhead model): the host issues kernels one after another, `host_s` seconds each (Python,
dispatcher and launch call of eager PyTorch; projection/perf/overhead.py), starting with the action; a kernel cannot
start on the GPU before the host has issued it. When the GPU is busy the host runs ahead and costs nothing; when
kernels are short the GPU idles between them, and that idle time is booked as "overhead". This is the usual
launch-bound model of eager execution (e.g. PyTorch's CUDA Graphs motivation: the CPU launch cost per kernel exceeds
the GPU time of small kernels).

`ActionTime.by_category` splits the action's seconds into compute classes (gemm, grouped_gemm, attention,
memory_bound, recompute), exposed communication per group (tp, cp, ep, dp) and overhead; it sums to `seconds`.
`comm_s` is the full time of every collective per group, overlapped or not. `launches` says when each launched
collective or copy ran (seconds from the action's start, on its stream): what the Chrome trace draws.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

Mode = Literal["run", "launch", "wait", "sync"]


@dataclass(frozen=True)
class Item:
    """One step of an action. `seconds`: stream time (for a run collective pipelined with a GEMM, only its exposed
    part); `full_s`: the collective's whole duration (default `seconds`); `kernels`: host launches it costs;
    `token`: id of a launch; `waits`: ids a wait item waits for; `stream`: a launch's comm stream."""

    mode: Mode
    category: str = ""
    seconds: float = 0.0
    full_s: float | None = None
    kernels: int = 1
    token: int = -1
    waits: tuple[int, ...] = ()
    stream: str = ""
    comm: bool = False
    after: tuple[int, ...] = ()  # a launch's stream also waits for these launches to finish (an event wait)
    label: str = ""  # what a launch is ("all-gather", "reduce-scatter" ...), for the trace
    unit: int = -1  # a launch's FSDP unit, counted from the stage's last unit (0: its last), -1: none


@dataclass(frozen=True, slots=True)
class Launch:
    """When one launched collective or copy of an action ran: seconds from the action's start, on `stream`;
    `category` its group (tp, ep, dp, offload), `label` and `unit` those of its Item."""

    category: str
    stream: str
    start_s: float
    end_s: float
    label: str = ""
    unit: int = -1


@dataclass(frozen=True)
class ActionTime:
    seconds: float
    by_category: Mapping[str, float] = field(default_factory=dict)
    comm_s: Mapping[str, float] = field(default_factory=dict)
    kernels: int = 0
    launches: tuple[Launch, ...] = ()


def run(category: str, seconds: float, kernels: int = 1) -> Item:
    return Item("run", category, seconds, kernels=kernels)


def blocking(group: str, seconds: float, full_s: float | None = None, kernels: int = 1) -> Item:
    """A collective on the compute stream: `seconds` exposed of `full_s`."""
    return Item("run", group, seconds, full_s=seconds if full_s is None else full_s, kernels=kernels, comm=True)


def launch(group: str, seconds: float, token: int, kernels: int = 1, stream: str | None = None,
           after: tuple[int, ...] = (), label: str = "", unit: int = -1) -> Item:
    return Item("launch", group, seconds, kernels=kernels, token=token, stream=stream or group, comm=True,
                after=after, label=label, unit=unit)


def wait(*tokens: int) -> Item:
    return Item("wait", waits=tuple(tokens), kernels=0)


def sync() -> Item:
    """The host reads a GPU result (one device-to-host copy to issue), then waits for the GPU."""
    return Item("sync", kernels=1)


def run_items(items: Iterable[Item], host_s: float = 0.0, comm_host_s: float | None = None) -> ActionTime:
    """Simulate the action: seconds from its start to the end of its last kernel or collective. host_s: host seconds
    per compute kernel; comm_host_s: per collective or copy launch (default host_s)."""
    comm_host = host_s if comm_host_s is None else comm_host_s
    t = 0.0  # compute stream
    host = 0.0
    free: dict[str, float] = {}
    pending: dict[int, tuple[float, float, float, str]] = {}  # token -> start, end, host issue time, group
    ends: dict[int, float] = {}  # token -> end of every launch so far
    cat: dict[str, float] = {}
    comm: dict[str, float] = {}
    launches: list[Launch] = []
    kernels = 0

    def book(name: str, s: float) -> None:
        if s > 0.0:
            cat[name] = cat.get(name, 0.0) + s

    def settle(tokens: Iterable[int]) -> None:
        """Wait for launches: the time they run past the compute stream is exposed communication; time before a
        launch could start because the host had not issued it yet is overhead."""
        nonlocal t
        for tok in tokens:
            done = pending.pop(tok, None)
            if done is None or done[1] <= t:
                continue
            start, end, issued, group = done
            lag = max(0.0, min(issued, start) - t)
            book("overhead", lag)
            book(group, end - t - lag)
            t = end

    for it in items:
        if it.mode == "wait":
            settle(it.waits)
            continue
        kernels += it.kernels
        host += it.kernels * (comm_host if it.comm else host_s)
        if it.mode == "sync":
            # the host waits for the compute stream only (a device-to-host copy, or .item(), synchronises the stream
            # it runs on): collectives still running on their own streams go on
            if host > t:
                book("overhead", host - t)
                t = host
            host = t
            continue
        if it.mode == "run":
            if it.kernels and host > t:
                book("overhead", host - t)
                t = host
            book(it.category, it.seconds)
            t += it.seconds
            if it.comm:
                comm[it.category] = comm.get(it.category, 0.0) + (it.full_s if it.full_s is not None else it.seconds)
            continue
        start = max(t, host, free.get(it.stream, 0.0), *(ends.get(tok, 0.0) for tok in it.after))
        end = start + it.seconds
        free[it.stream] = end
        ends[it.token] = end
        pending[it.token] = (start, end, host, it.category)
        comm[it.category] = comm.get(it.category, 0.0) + it.seconds
        launches.append(Launch(it.category, it.stream, start, end, it.label, it.unit))
    settle(sorted(pending, key=lambda tok: pending[tok][1]))
    return ActionTime(t, cat, comm, kernels, tuple(launches))


def pipelined_exposed_s(comm_s: float, compute_s: float, chunks: int) -> float:
    """Exposed seconds of a collective split into `chunks` pieces pipelined with a dependent GEMM split the same way
    (Wang et al. 2023, "Overlap communication with dependent computation via decomposition", ASPLOS; Transformer
    Engine's userbuffer ring overlap splits by TP size): total = c/n + (n-1) max(c, g)/n + g/n, so the exposed part
    is c/n + (n-1)/n max(0, c - g)."""
    n = max(chunks, 1)
    return comm_s / n + (n - 1) / n * max(0.0, comm_s - compute_s)


def add_times(parts: Iterable[ActionTime]) -> ActionTime:
    """Actions run back to back (e.g. B = I + W)."""
    total = 0.0
    cat: dict[str, float] = {}
    comm: dict[str, float] = {}
    launches: list[Launch] = []
    kernels = 0
    for p in parts:
        launches += [replace(x, start_s=total + x.start_s, end_s=total + x.end_s) for x in p.launches]
        total += p.seconds
        kernels += p.kernels
        for src, dst in ((p.by_category, cat), (p.comm_s, comm)):
            for k, v in src.items():
                dst[k] = dst.get(k, 0.0) + v
    return ActionTime(total, cat, comm, kernels, tuple(launches))
