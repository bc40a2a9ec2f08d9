"""Chrome trace JSON of a simulated step (opens in Perfetto, ui.perfetto.dev, and chrome://tracing).

One process per rank (pid = rank), one thread per stream (tid 0 compute, 1 p2p receives, 2 comm tasks); every
interval is a complete event ("ph": "X") with microsecond timestamps, named like "F s2 mb5". Format: the Trace Event
Format document (Google, "Trace Event Format", JSON Object Format with traceEvents and displayTimeUnit).
`tails` (from `projection performance`): per rank, what the step adds after the simulated pipeline (the optimizer
step, the exposed parameter all-gather), drawn on the compute thread after it, so that otherData's `step_time_s` is
the projection's step time; `pipeline_s` is the simulated pipeline alone. `rounds` > 1 (TorchTitan's gradient
accumulation under pipeline parallelism, perf/rounds.py): the pipeline runs that many times, each followed by its
exposed parameter all-gather, every round starting on all ranks when the slowest has ended the previous one, and
the optimizer step once at the end.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from projection.fileio import atomic_write_text
from projection.sim.result import SimResult

STREAM_TID = {"compute": 0, "p2p": 1, "comm": 2}


def chrome_trace(result: SimResult, tails: Sequence[Sequence[tuple[str, float]]] = (),
                 rounds: int = 1) -> dict[str, Any]:
    """The trace as a JSON-ready dict; `tails[rank]`: (label, seconds) intervals after the pipeline; `rounds`: runs
    of the pipeline in one step (module docstring)."""
    events: list[dict[str, Any]] = []
    after = [0.0] * len(result.timeline)
    pipeline = result.step_time_s
    # every round starts on all ranks together, when the slowest rank has ended the previous one (its pipeline and
    # its per-round tails): a rank's next round needs the previous rank's forwards
    round_s = pipeline + max((sum(s for label, s in (tails[r] if r < len(tails) else ()) if label != "optimizer"
                                  and s > 0.0) for r in range(len(result.timeline))), default=0.0)
    for r, entries in enumerate(result.timeline):
        events.append({"ph": "M", "name": "process_name", "pid": r, "tid": 0, "args": {"name": f"rank {r}"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": r, "tid": 0, "args": {"sort_index": r}})
        for stream, tid in STREAM_TID.items():
            events.append({"ph": "M", "name": "thread_name", "pid": r, "tid": tid, "args": {"name": stream}})
        mine = [(label, s) for label, s in (tails[r] if r < len(tails) else ()) if s > 0.0]
        each = [(label, s) for label, s in mine if label != "optimizer"]  # every round's; the optimizer once
        t = 0.0
        for k in range(rounds):
            t = k * round_s
            for e in entries:
                args: dict[str, Any] = {"start_s": t + e.start_s, "end_s": t + e.end_s}
                if e.action is not None:
                    args.update(stage=e.action.stage, microbatch=e.action.microbatch, kind=e.action.kind)
                if rounds > 1:
                    args.update(round=k)
                events.append({"ph": "X", "name": e.label, "cat": e.action.kind if e.action else "comm", "pid": r,
                               "tid": STREAM_TID[e.stream], "ts": (t + e.start_s) * 1e6,
                               "dur": (e.end_s - e.start_s) * 1e6, "args": args})
            t += pipeline
            last = k == rounds - 1
            for label, seconds in mine if last else each:
                events.append({"ph": "X", "name": label, "cat": "step", "pid": r, "tid": STREAM_TID["compute"],
                               "ts": t * 1e6, "dur": seconds * 1e6, "args": {"start_s": t, "end_s": t + seconds}})
                t += seconds
        after[r] = t - (rounds - 1) * round_s - pipeline
    meta = {"schedule": result.schedule.name, "engine": result.engine,
            "step_time_s": (rounds - 1) * round_s + pipeline + max(after, default=0.0), "pipeline_s": pipeline,
            "bubble_ratio": result.bubble_ratio, "rounds": rounds}
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": meta}


def write_chrome_trace(result: SimResult, path: str | Path,
                       tails: Sequence[Sequence[tuple[str, float]]] = (), rounds: int = 1) -> Path:
    """Write the trace to `path` (JSON), whole or not at all; returns the path."""
    return atomic_write_text(Path(path), json.dumps(chrome_trace(result, tails, rounds)))
