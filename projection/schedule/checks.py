"""Well-formedness of a Schedule: every problem as a sentence, and deadlock detection with the blocked actions named.

Rules (compute actions F, B, I, W; SEND/RECV actions are only range-checked, p2p follows from the data flow):
  * shape: one action list per rank, stage_to_rank covers every stage with a valid rank, routes (if any) list one
    route per microbatch, overlapped pairs point at an F followed by a B or I;
  * placement: a rank runs only the stages stage_to_rank gives it, on microbatches whose route passes the stage;
  * counts: each (stage, microbatch) on a route gets F once and either B once or I and W once each;
  * same-rank order: B/I after its own F, W after its I;
  * dependencies (across ranks): F(s, mb) after F of the previous stage on mb's route, B/I(s, mb) after B/I of the
    next stage; find_deadlock runs the per-rank queues (each rank executes its list in order, an action starts once
    its inputs exist) and returns the head actions that can never start.
"""

from __future__ import annotations

from collections import Counter, defaultdict

from projection.schedule.action import COMPUTE_KINDS, Action, Schedule

_GRAD = frozenset({"B", "I"})


def _key(kind: str, stage: int, mb: int) -> tuple[str, int, int]:
    """Completion key: F, G (input gradient: B or I) or W."""
    return ("G" if kind in _GRAD else kind, stage, mb)


def requirements(s: Schedule, a: Action) -> list[Action]:
    """Actions that must have finished before compute action `a` can start (B stands for "B or I" upstream)."""
    if a.kind == "F":
        prev = s.prev_stage(a.stage, a.microbatch)
        return [] if prev is None else [Action(prev, "F", a.microbatch)]
    if a.kind == "W":
        return [Action(a.stage, "I", a.microbatch)]
    if a.kind in _GRAD:
        need = [Action(a.stage, "F", a.microbatch)]
        nxt = s.next_stage(a.stage, a.microbatch)
        if nxt is not None:
            need.append(Action(nxt, "B", a.microbatch))
        return need
    return []


def _neighbours(s: Schedule) -> tuple[list[dict[int, int]], list[dict[int, int]]] | None:
    """Per-microbatch previous / next stage maps when the schedule has explicit routes (None: stage -+ 1)."""
    if not s.routes:
        return None
    return ([dict(zip(r[1:], r[:-1], strict=True)) for r in s.routes],
            [dict(zip(r[:-1], r[1:], strict=True)) for r in s.routes])


def _run(s: Schedule) -> tuple[list[int], set[tuple[str, int, int]]]:
    """Execute the per-rank queues as far as possible; returns each rank's stuck position and the completed keys."""
    lists = [[a for a in acts if a.kind in COMPUTE_KINDS] for acts in s.actions]
    links = _neighbours(s)
    last = s.n_stages - 1
    pos = [0] * len(lists)
    done: set[tuple[str, int, int]] = set()
    waiting: dict[tuple[str, int, int], list[int]] = defaultdict(list)
    todo = list(range(len(lists)))
    while todo:
        r = todo.pop()
        seq = lists[r]
        while pos[r] < len(seq):
            a = seq[pos[r]]
            st, mb, kind = a.stage, a.microbatch, a.kind
            missing: tuple[str, int, int] | None = None
            if kind == "F":
                prev = (st - 1 if st > 0 else None) if links is None else links[0][mb].get(st)
                if prev is not None and ("F", prev, mb) not in done:
                    missing = ("F", prev, mb)
            elif kind == "W":
                if ("G", st, mb) not in done:
                    missing = ("G", st, mb)
            elif ("F", st, mb) not in done:
                missing = ("F", st, mb)
            else:
                nxt = (st + 1 if st < last else None) if links is None else links[1][mb].get(st)
                if nxt is not None and ("G", nxt, mb) not in done:
                    missing = ("G", nxt, mb)
            if missing is not None:
                waiting[missing].append(r)
                break
            key = ("G" if kind in _GRAD else kind, st, mb)
            done.add(key)
            pos[r] += 1
            todo.extend(waiting.pop(key, ()))
    return pos, done


def find_deadlock(s: Schedule) -> list[Action]:
    """Head actions of the ranks that can never finish their list (empty when the schedule runs to completion)."""
    pos, _ = _run(s)
    heads = []
    for r, acts in enumerate(s.actions):
        compute = [a for a in acts if a.kind in COMPUTE_KINDS]
        if pos[r] < len(compute):
            heads.append(compute[pos[r]])
    return heads


def describe_deadlock(s: Schedule) -> list[str]:
    """One sentence per blocked rank: its head action and what it waits for."""
    pos, done = _run(s)
    out = []
    for r, acts in enumerate(s.actions):
        compute = [a for a in acts if a.kind in COMPUTE_KINDS]
        if pos[r] >= len(compute):
            continue
        head = compute[pos[r]]
        missing = [n for n in requirements(s, head) if _key(n.kind, n.stage, n.microbatch) not in done]
        what = " and ".join(_describe_need(s, n) for n in missing)
        out.append(f"rank {r} is blocked at {head} (action {pos[r]} of {len(compute)}), waiting for {what}")
    return out


def _describe_need(s: Schedule, n: Action) -> str:
    label = f"{n.stage}B{n.microbatch} or {n.stage}I{n.microbatch}" if n.kind == "B" else str(n)
    if 0 <= n.stage < s.n_stages:
        return f"{label} (rank {s.stage_to_rank[n.stage]})"
    return label


def _shape_problems(s: Schedule) -> list[str]:
    out = []
    if len(s.actions) != s.n_ranks:
        out.append(f"{len(s.actions)} action lists for n_ranks = {s.n_ranks}")
    if len(s.stage_to_rank) != s.n_stages:
        out.append(f"stage_to_rank has {len(s.stage_to_rank)} entries for n_stages = {s.n_stages}")
    out += [f"stage {st} is placed on rank {r}, outside 0..{s.n_ranks - 1}"
            for st, r in enumerate(s.stage_to_rank) if not 0 <= r < s.n_ranks]
    if s.routes:
        if len(s.routes) != s.n_microbatches:
            out.append(f"{len(s.routes)} routes for n_microbatches = {s.n_microbatches}")
        for mb, path in enumerate(s.routes):
            if len(set(path)) != len(path) or any(not 0 <= st < s.n_stages for st in path):
                out.append(f"route of microbatch {mb} {path} repeats a stage or leaves 0..{s.n_stages - 1}")
    if s.overlapped:
        if len(s.overlapped) != len(s.actions):
            out.append(f"overlapped has {len(s.overlapped)} entries for {len(s.actions)} ranks")
        for r, idx in enumerate(s.overlapped[:len(s.actions)]):
            acts = s.actions[r]
            for i in idx:
                if not (0 <= i < len(acts) - 1 and acts[i].kind == "F" and acts[i + 1].kind in _GRAD):
                    out.append(f"rank {r}: overlapped index {i} is not an F followed by a B or I")
    return out


def check_schedule(s: Schedule) -> list[str]:
    """Every problem found in `s` (empty list: well formed and deadlock free)."""
    problems = _shape_problems(s)
    if problems:
        return problems
    position: dict[tuple[str, int, int], tuple[int, int]] = {}
    counts: Counter[tuple[str, int, int]] = Counter()
    on_route = [frozenset(r) for r in s.routes]
    for r, acts in enumerate(s.actions):
        for i, a in enumerate(acts):
            if not (0 <= a.stage < s.n_stages and 0 <= a.microbatch < s.n_microbatches):
                problems.append(f"rank {r}: {a} is out of range (stages 0..{s.n_stages - 1}, microbatches "
                                f"0..{s.n_microbatches - 1})")
                continue
            if s.stage_to_rank[a.stage] != r:
                problems.append(f"rank {r}: {a} runs stage {a.stage}, which lives on rank {s.stage_to_rank[a.stage]}")
            if a.kind not in COMPUTE_KINDS:
                continue
            if on_route and a.stage not in on_route[a.microbatch]:
                problems.append(f"rank {r}: {a} but microbatch {a.microbatch} does not pass stage {a.stage}")
            counts[a.kind, a.stage, a.microbatch] += 1
            position.setdefault((a.kind, a.stage, a.microbatch), (r, i))
    problems += [f"{st}{kind}{mb} appears {n} times" for (kind, st, mb), n in sorted(counts.items()) if n > 1]
    for mb in range(s.n_microbatches):
        for st in s.route(mb):
            has = {k: counts[k, st, mb] > 0 for k in COMPUTE_KINDS}
            if not has["F"]:
                problems.append(f"{st}F{mb} is missing")
            if has["B"] and (has["I"] or has["W"]):
                problems.append(f"stage {st} microbatch {mb} has both a full backward B and a split I/W")
            elif not has["B"] and not (has["I"] and has["W"]):
                miss = "B (or I and W)" if not (has["I"] or has["W"]) else ("W" if has["I"] else "I")
                problems.append(f"stage {st} microbatch {mb} lacks {miss}")
            problems += _order_problem(position, st, mb)
    if not problems:
        problems += describe_deadlock(s)
    return problems


def _order_problem(position: dict[tuple[str, int, int], tuple[int, int]], st: int, mb: int) -> list[str]:
    out = []
    f = position.get(("F", st, mb))
    i = position.get(("I", st, mb))
    for grad in ("B", "I"):
        g = position.get((grad, st, mb))
        if f is not None and g is not None and g[0] == f[0] and g[1] < f[1]:
            out.append(f"rank {g[0]}: {st}{grad}{mb} (position {g[1]}) comes before its forward (position {f[1]})")
    w = position.get(("W", st, mb))
    if i is not None and w is not None and w[0] == i[0] and w[1] < i[1]:
        out.append(f"rank {w[0]}: {st}W{mb} (position {w[1]}) comes before {st}I{mb} (position {i[1]})")
    return out
