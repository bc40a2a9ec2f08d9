"""torch.distributed.pipelining CSV notation <-> Schedule.

One row per rank, one cell per action in execution order: "0F0", "1I3", "2W5", "0SEND_F0"; empty cells are idle
slots and are skipped. An overlapped forward-backward pair is written as torch writes `OVERLAP_F_B`:
"(1F6;6B2)OVERLAP_F_B" (it loads as the two actions, F first, and its index goes to Schedule.overlapped).
UNSHARD, RESHARD and REDUCE_GRAD cells (FSDP and gradient-reduction markers torch adds when lowering) are dropped.

On load, n_stages and n_microbatches are one past the largest stage and microbatch of the compute actions,
stage_to_rank comes from the rank whose row runs each stage, and when some microbatch does not visit every stage
(DualPipe) each microbatch's route is the ascending list of stages that run its F.
"""

from __future__ import annotations

import csv as _csv
import io
import re
from pathlib import Path

from projection.fileio import atomic_write_text, require_regular
from projection.schedule.action import COMPUTE_KINDS, Action, Schedule
from projection.schedule.registry import MAX_STAGE_MICROBATCHES

_OVERLAP = re.compile(r"^\s*\(([^()]*)\)\s*OVERLAP_F_B\s*$")
_DROPPED = re.compile(r"^\s*\d+(UNSHARD|RESHARD|REDUCE_GRAD)\d*\s*$")


def _parse_row(rank: int, row: list[str]) -> tuple[list[Action], list[int]]:
    acts: list[Action] = []
    pairs: list[int] = []
    for cell in row:
        if not cell.strip() or _DROPPED.match(cell):
            continue
        m = _OVERLAP.match(cell)
        if m:
            subs = [Action.parse(t) for t in m.group(1).split(";") if t.strip()]
            if len(subs) != 2 or subs[0].kind != "F" or subs[1].kind not in ("B", "I"):
                raise ValueError(f"rank {rank}: {cell!r} is not an overlapped forward-backward pair (F;B)")
            pairs.append(len(acts))
            acts += subs
            continue
        try:
            acts.append(Action.parse(cell))
        except ValueError as e:
            raise ValueError(f"rank {rank}: {e}") from None
    return acts, pairs


def loads_csv(text: str, name: str = "custom") -> Schedule:
    """Schedule from CSV text in torch.distributed.pipelining notation (see module docstring)."""
    rows = list(_csv.reader(io.StringIO(text)))
    if not rows:
        raise ValueError("empty schedule CSV: expected one row of actions per rank")
    per_rank: list[tuple[Action, ...]] = []
    overlapped: list[tuple[int, ...]] = []
    for r, row in enumerate(rows):
        acts, pairs = _parse_row(r, row)
        per_rank.append(tuple(acts))
        overlapped.append(tuple(pairs))
    compute = [(r, a) for r, acts in enumerate(per_rank) for a in acts if a.kind in COMPUTE_KINDS]
    if not compute:
        raise ValueError("schedule CSV has no compute actions (F, B, I, W)")
    n_stages = 1 + max(a.stage for _, a in compute)
    n_mb = 1 + max(a.microbatch for _, a in compute)
    if n_stages * n_mb > MAX_STAGE_MICROBATCHES:  # before anything is sized by them (0F99999999999 is one cell)
        raise ValueError(f"the largest stage and microbatch indices ({n_stages - 1}, {n_mb - 1}) make a schedule of "
                         f"{n_stages:,} stages x {n_mb:,} microbatches, more than the {MAX_STAGE_MICROBATCHES:,} "
                         "this simulator builds; number stages and microbatches from 0 without gaps")
    owner: dict[int, int] = {}
    for r, a in compute:
        if owner.setdefault(a.stage, r) != r:
            raise ValueError(f"stage {a.stage} runs on rank {owner[a.stage]} and on rank {r}; "
                             "a stage lives on one rank")
    absent = [s for s in range(n_stages) if s not in owner]
    if absent:
        shown = ", ".join(str(a) for a in absent[:10]) + (f", ... ({len(absent):,} in all)" if len(absent) > 10 else "")
        raise ValueError(f"stages {shown} have no actions, so their rank is unknown "
                         f"(stages must be 0..{n_stages - 1})")
    visits: list[set[int]] = [set() for _ in range(n_mb)]
    for _, a in compute:
        if a.kind == "F":
            visits[a.microbatch].add(a.stage)
    routes: tuple[tuple[int, ...], ...] = ()
    if any(len(v) != n_stages for v in visits) and all(visits):
        routes = tuple(tuple(sorted(v)) for v in visits)
    return Schedule(
        name=name,
        n_ranks=len(per_rank),
        n_stages=n_stages,
        n_microbatches=n_mb,
        stage_to_rank=tuple(owner[s] for s in range(n_stages)),
        actions=tuple(per_rank),
        routes=routes,
        overlapped=tuple(overlapped) if any(overlapped) else (),
    )


def load_csv(path: str | Path, name: str | None = None) -> Schedule:
    """Schedule from a CSV file; the name defaults to the file's stem."""
    p = Path(path)
    require_regular(p)
    return loads_csv(p.read_text(), name or p.stem)


def dumps_csv(s: Schedule) -> str:
    """CSV text in torch.distributed.pipelining notation, one row per rank."""
    buf = io.StringIO()
    writer = _csv.writer(buf, lineterminator="\n")
    for r, acts in enumerate(s.actions):
        cells: list[str] = []
        i = 0
        while i < len(acts):
            if s.is_overlapped(r, i):
                cells.append(f"({acts[i]};{acts[i + 1]})OVERLAP_F_B")
                i += 2
            else:
                cells.append(str(acts[i]))
                i += 1
        writer.writerow(cells)
    return buf.getvalue()


def dump_csv(s: Schedule, path: str | Path) -> None:
    """Write `s` to `path` in torch.distributed.pipelining CSV notation, whole or not at all."""
    atomic_write_text(path, dumps_csv(s))
