"""Chrome trace JSON of a simulated step (opens in Perfetto, ui.perfetto.dev, and chrome://tracing).

One process per rank (pid = rank), one thread per stream (tid 0 compute, 1 p2p receives, 2 comm tasks, 6 p2p sends:
the runtime walks of sim/p2p_walk.py hold a sender for its transfer, which may overlap a receive); every interval is a
complete event ("ph": "X") with microsecond timestamps, named like "F s2 mb5". Events on one thread nest or follow
each other, as the format's viewers draw them; an interval that would partly overlap an earlier one of its thread
(two sends in flight at once) goes to the thread's next lane (tid + 100 per lane, named "p2p sends (2)"); a
zero-length interval (a collective over one rank) is not drawn. Format: the Trace Event Format document (Google,
"Trace Event Format", JSON Object Format with traceEvents and displayTimeUnit).
`tails` (from `projection performance`): per rank, what the step adds after the simulated pipeline (the optimizer
step, the exposed parameter all-gather), drawn on the compute thread after it, so that otherData's `step_time_s` is
the projection's step time; `pipeline_s` is the simulated pipeline alone. `rounds` > 1 (TorchTitan's gradient
accumulation under pipeline parallelism, perf/rounds.py): the pipeline runs that many times, each followed by its
exposed parameter all-gather, every round starting on all ranks when the slowest has ended the previous one, and
the optimizer step once at the end.
`priced` (the projection's PricedStages): the collectives an action launches on a stream of their own are drawn
where the action's pricing ran them (perf/action_time.run_items: its start in the simulated step plus their offset
in the action): FSDP's (zero_stage 3) per-unit parameter all-gathers, gradient reduce-scatters and HSDP replica
all-reduces, one thread per stream as perf/items.py runs them (tid 3 `fsdp`: the dense shard group, 4
`fsdp_expert`: the expert shard group, 5 `fsdp_replicate`: the replica all-reduces), named by collective and unit
("all-gather layer12", "reduce-scatter output (experts)", "all-reduce layer3 (replicas)"). Their durations summed
over a rank and the step's rounds are the in-action part of the rank's `comm_total_s["dp"]`; the rest of it (the
gradient buckets and parameter all-gathers of perf/dp.py) is priced per step, and is drawn only as far as the
simulation places it: the comm tasks on tid 2 and the exposed parameter all-gather in `tails`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from projection.fileio import atomic_write_text
from projection.report import trace_dp
from projection.schedule.action import Action
from projection.sim.result import SimResult, TimelineEntry

if TYPE_CHECKING:
    from projection.perf.dp import DPComm
    from projection.perf.pricing import PricedStages

STREAM_TID = {"compute": 0, "p2p": 1, "comm": 2}
SEND_TID = 6  # a p2p entry whose action is a SEND_F / SEND_B (module docstring)
LANE_TIDS = 100  # tid step between a thread's lanes
LAUNCH_TID = {"fsdp": 3, "fsdp_expert": 4, "fsdp_replicate": 5}
"""Threads of the in-action collectives drawn (module docstring), by the perf/items.py stream they run on."""
_SUFFIX = {"fsdp_expert": " (experts)", "fsdp_replicate": " (replicas)"}
Launched = tuple[str, str, float, float, int]  # (name, stream, start_s, end_s, unit) of a launch, in its action


def chrome_trace(result: SimResult, tails: Sequence[Sequence[tuple[str, float]]] = (),
                 rounds: int = 1, priced: PricedStages | None = None, dp: DPComm | None = None) -> dict[str, Any]:
    """The trace as a JSON-ready dict; `tails[rank]`: (label, seconds) intervals after the pipeline; `rounds`: runs
    of the pipeline in one step; `priced`: the stages' prices, whose launched FSDP collectives are drawn (module
    docstring); `dp` (with `priced`): the step's data-parallel communication, whose gradient buckets launched inside
    a backward are drawn bucket by bucket (report/trace_dp.py)."""
    events: list[dict[str, Any]] = []
    launched = _Launched(result, priced)
    after = [0.0] * len(result.timeline)
    pipeline = result.step_time_s
    # every round starts on all ranks together, when the slowest rank has ended the previous one (its pipeline and
    # its per-round tails): a rank's next round needs the previous rank's forwards
    round_s = pipeline + max((sum(s for label, s in (tails[r] if r < len(tails) else ()) if label != "optimizer"
                                  and s > 0.0) for r in range(len(result.timeline))), default=0.0)
    for r, entries in enumerate(result.timeline):
        events.append({"ph": "M", "name": "process_name", "pid": r, "tid": 0, "args": {"name": f"rank {r}"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": r, "tid": 0, "args": {"sort_index": r}})
        for stream, tid in [*STREAM_TID.items(), *((s, LAUNCH_TID[s]) for s in launched.streams(entries))]:
            events.append({"ph": "M", "name": "thread_name", "pid": r, "tid": tid, "args": {"name": stream}})
        drawn_apart = trace_dp.replaced(dp, r)
        if drawn_apart:
            events.append({"ph": "M", "name": "thread_name", "pid": r, "tid": trace_dp.BUCKET_TID,
                           "args": {"name": "dp grad buckets"}})
        mine = [(label, s) for label, s in (tails[r] if r < len(tails) else ()) if s > 0.0]
        each = [(label, s) for label, s in mine if label != "optimizer"]  # every round's; the optimizer once
        t = 0.0
        for k in range(rounds):
            t = k * round_s
            events += trace_dp.bucket_events(result, priced, dp, r, t, {"round": k} if rounds > 1 else {})
            for e in entries:
                if e.action is None and e.label in drawn_apart:
                    continue
                args: dict[str, Any] = {"start_s": t + e.start_s, "end_s": t + e.end_s}
                if e.action is not None:
                    args.update(stage=e.action.stage, microbatch=e.action.microbatch, kind=e.action.kind)
                if rounds > 1:
                    args.update(round=k)
                tid = SEND_TID if e.action is not None and e.action.kind.startswith("SEND") else STREAM_TID[e.stream]
                events.append({"ph": "X", "name": e.label, "cat": e.action.kind if e.action else "comm", "pid": r,
                               "tid": tid, "ts": (t + e.start_s) * 1e6,
                               "dur": (e.end_s - e.start_s) * 1e6, "args": args})
                if e.stream == "compute" and e.action is not None:
                    at = t + e.start_s
                    for name, stream, start, end, unit in launched.of(e.action):
                        events.append({"ph": "X", "name": name, "cat": "comm", "pid": r, "tid": LAUNCH_TID[stream],
                                       "ts": (at + start) * 1e6, "dur": (end - start) * 1e6,
                                       "args": {"start_s": at + start, "end_s": at + end, "action": e.label,
                                                "stage": e.action.stage, "microbatch": e.action.microbatch,
                                                "group": "dp", "stream": stream, "unit_from_last": unit,
                                                **({"round": k} if rounds > 1 else {})}})
            t += pipeline
            last = k == rounds - 1
            for label, seconds in mine if last else each:
                events.append({"ph": "X", "name": label, "cat": "step", "pid": r, "tid": STREAM_TID["compute"],
                               "ts": t * 1e6, "dur": seconds * 1e6, "args": {"start_s": t, "end_s": t + seconds}})
                t += seconds
        after[r] = t - (rounds - 1) * round_s - pipeline
    events = _in_lanes(events)
    meta = {"schedule": result.schedule.name, "engine": result.engine,
            "step_time_s": (rounds - 1) * round_s + pipeline + max(after, default=0.0), "pipeline_s": pipeline,
            "bubble_ratio": result.bubble_ratio, "rounds": rounds}
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": meta}


def write_chrome_trace(result: SimResult, path: str | Path,
                       tails: Sequence[Sequence[tuple[str, float]]] = (), rounds: int = 1,
                       priced: PricedStages | None = None, dp: DPComm | None = None) -> Path:
    """Write the trace to `path` (JSON), whole or not at all; returns the path."""
    return atomic_write_text(Path(path), json.dumps(chrome_trace(result, tails, rounds, priced, dp)))


class _Launched:
    """The drawn launches of each (model stage, action kind), in seconds from the action's start, with their names;
    computed once per pair."""

    def __init__(self, result: SimResult, priced: PricedStages | None) -> None:
        self.schedule, self.priced = result.schedule, priced
        self.memo: dict[tuple[int, str], tuple[Launched, ...]] = {}

    def of(self, action: Action) -> tuple[Launched, ...]:
        """The FSDP collectives `action` launches (none without prices, or for a kind the pricing does not run)."""
        if self.priced is None or action.kind not in ("F", "B", "I", "W"):
            return ()
        key = (self.schedule.model_stage(action.stage), action.kind)
        if key not in self.memo:
            sp = self.priced.stages[key[0]]
            units = [name for name, _, _ in sp.params.components]
            self.memo[key] = tuple(
                (f"{x.label or x.category} {_unit(units, x.unit)}".rstrip() + _SUFFIX.get(x.stream, ""), x.stream,
                 x.start_s, x.end_s, x.unit)
                for x in self.priced.action_time(key[0], action.kind).launches
                if x.category == "dp" and x.stream in LAUNCH_TID)
        return self.memo[key]

    def streams(self, entries: Sequence[TimelineEntry]) -> list[str]:
        """The launch streams drawn on a rank whose timeline is `entries`, in thread order."""
        used = {x[1] for e in entries if e.stream == "compute" and e.action is not None for x in self.of(e.action)}
        return [s for s in LAUNCH_TID if s in used]


def _unit(units: Sequence[str], from_last: int) -> str:
    """Name of the FSDP unit `from_last` units before the stage's last (StageParams.components: forward order; an
    MTP stage's embedding, which has no unit of its own, comes first and is never counted from the end)."""
    return units[len(units) - 1 - from_last] if 0 <= from_last < len(units) else ""


def _in_lanes(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`events` with every complete event on a lane of its thread where it nests in or follows the lane's earlier
    events (module docstring), lanes past the first named after their thread; zero-length events are dropped (a
    collective over one rank, nothing to draw)."""
    named = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    done = [e for e in events if e["ph"] != "X"]
    lanes: dict[tuple[int, int], list[list[float]]] = {}  # per thread, per lane: the ends of its open intervals
    eps = 1e-6  # us: float rounding between an interval's end and the next one's start
    for e in sorted((e for e in events if e["ph"] == "X" and e["dur"] > 0), key=lambda e: (e["ts"], -e["dur"])):
        start, end = e["ts"], e["ts"] + e["dur"]
        thread = lanes.setdefault((e["pid"], e["tid"]), [])
        k = 0
        while True:  # the first lane where it nests in the open intervals or follows them all
            open_ends = thread[k] if k < len(thread) else []
            while open_ends and open_ends[-1] <= start + eps:
                open_ends.pop()
            if not open_ends or end <= open_ends[-1] + eps:
                break
            k += 1
        if k == len(thread):
            thread.append(open_ends)
        open_ends.append(end)
        done.append({**e, "tid": e["tid"] + LANE_TIDS * k})
    for (pid, tid), thread in lanes.items():  # a name for each lane, and for the sends' thread
        base = named.get((pid, tid), "p2p sends")
        done += [{"ph": "M", "name": "thread_name", "pid": pid, "tid": tid + LANE_TIDS * k,
                  "args": {"name": base if k == 0 else f"{base} ({k + 1})"}}
                 for k in range(len(thread)) if k > 0 or (pid, tid) not in named]
    return done
