"""Point-to-point call programs: how a framework's pipeline runtime posts and waits its sends and receives around a
schedule's passes (built by schedule/megatron_calls.py and schedule/torch_calls.py, walked by sim/p2p_walk.py).

A rank's program is a list of items in the order it runs them: a compute action, or a call. A call posts a batch of
ops (`batch_isend_irecv`) and is waited for at once (blocking) or by a later `wait` item (its handles kept). An op
is a send or a receive of one tensor, named by its key ("F", producer stage, microbatch) for an activation or ("B",
producer stage, microbatch) for a gradient; sends and receives pair up in order per (sender, receiver), as NCCL and
gloo match untagged p2p, and each pairing is checked.
"""

from __future__ import annotations

from dataclasses import dataclass

from projection.schedule.action import Action, Schedule

Key = tuple[str, int, int]
Op = tuple[int, bool, Key]  # (peer rank, is a send, key)

BLOCKING, POST, WAIT = 0, 1, 2


@dataclass(frozen=True)
class P2pCalls:
    """Per rank, its program: an int k >= 0 is the rank's k-th compute action; a negative item -1 - (3 c + mode) is
    call c with mode BLOCKING (post and wait), POST (post, handles kept) or WAIT (wait a call posted earlier). Per op:
    its rank, whether it sends, the tensor's key, and the op it pairs with on the peer (`partner`)."""

    programs: tuple[tuple[int, ...], ...]
    calls: tuple[tuple[int, ...], ...]
    op_rank: tuple[int, ...]
    op_send: tuple[bool, ...]
    op_key: tuple[Key, ...]
    partner: tuple[int, ...]


def decode(item: int) -> tuple[int, int]:
    """(call, mode) of a negative program item."""
    c, mode = divmod(-1 - item, 3)
    return c, mode


class CallBuilder:
    def __init__(self, pp: int) -> None:
        self.pp = pp
        self.programs: list[list[int]] = [[] for _ in range(pp)]
        self.calls: list[tuple[int, ...]] = []
        self.ops: list[tuple[int, int, bool, Key]] = []  # (rank, peer, send, key)

    def call(self, r: int, *ops: Op | None, mode: int = BLOCKING) -> int | None:
        """Rank r posts `ops` (None entries are the directions it skips) as one batch: blocking by default, or
        mode=POST to wait for it later (`wait`). Returns the call's index, None when it posts nothing."""
        idx = []
        for op in ops:
            if op is not None:
                idx.append(len(self.ops))
                self.ops.append((r, *op))
        if not idx:
            return None
        c = len(self.calls)
        self.programs[r].append(-1 - (3 * c + mode))
        self.calls.append(tuple(idx))
        return c

    def wait(self, r: int, c: int | None) -> None:
        """Rank r waits for call c, posted earlier with mode=POST (nothing for None)."""
        if c is not None:
            self.programs[r].append(-1 - (3 * c + WAIT))

    def run(self, r: int, k: int) -> None:
        self.programs[r].append(k)

    def finish(self, schedule: Schedule) -> P2pCalls:
        """Pair each send with the receive in the same place of its (sender, receiver) order; ValueError where keys
        or counts differ, where a call is waited twice or never, or where a pass runs before a waited call has
        received its input."""
        sends: dict[tuple[int, int], list[int]] = {}
        recvs: dict[tuple[int, int], list[int]] = {}
        for r, prog in enumerate(self.programs):
            for item in prog:
                c, mode = decode(item) if item < 0 else (-1, WAIT)
                if mode != WAIT:
                    for o in self.calls[c]:
                        _, peer, send, _ = self.ops[o]
                        (sends if send else recvs).setdefault((r, peer) if send else (peer, r), []).append(o)
        partner = [-1] * len(self.ops)
        for pair in sends.keys() | recvs.keys():
            ss, rr = sends.get(pair, []), recvs.get(pair, [])
            if len(ss) != len(rr) or any(self.ops[s][3] != self.ops[q][3] for s, q in zip(ss, rr, strict=False)):
                raise ValueError(f"schedule {schedule.name!r}: the sends and receives from rank {pair[0]} to "
                                 f"{pair[1]} do not pair up")
            for s, q in zip(ss, rr, strict=True):
                partner[s], partner[q] = q, s
        for r, prog in enumerate(self.programs):
            self._check_rank(schedule, r, prog)
        return P2pCalls(tuple(map(tuple, self.programs)), tuple(self.calls), tuple(o[0] for o in self.ops),
                        tuple(o[2] for o in self.ops), tuple(o[3] for o in self.ops), tuple(partner))

    def _check_rank(self, schedule: Schedule, r: int, prog: list[int]) -> None:
        have: set[Key] = set()
        pending: set[int] = set()
        acts = schedule.actions[r]
        for item in prog:
            if item >= 0:
                need = input_key(acts[item], schedule.n_stages)
                if need is not None and schedule.stage_to_rank[_producer(need)] != r and need not in have:
                    raise ValueError(f"schedule {schedule.name!r}: rank {r} runs {acts[item]} before receiving "
                                     "its input")
                continue
            c, mode = decode(item)
            if mode == POST:
                pending.add(c)
                continue
            if mode == WAIT:
                if c not in pending:
                    raise ValueError(f"schedule {schedule.name!r}: rank {r} waits for a call it has not posted")
                pending.discard(c)
            have.update(self.ops[o][3] for o in self.calls[c] if not self.ops[o][2])
        if pending:
            raise ValueError(f"schedule {schedule.name!r}: rank {r} never waits for {len(pending)} posted calls")


def input_key(a: Action, n_stages: int) -> Key | None:
    """The tensor pass `a` receives: a forward's activation from stage - 1, a backward's gradient from stage + 1."""
    if a.kind == "F":
        return ("F", a.stage - 1, a.microbatch) if a.stage > 0 else None
    return ("B", a.stage + 1, a.microbatch) if a.stage < n_stages - 1 else None


def _producer(key: Key) -> int:
    return key[1]


def recv_op(a: Action, pp: int, n_stages: int) -> Op | None:
    """The receive of pass a's input from its neighbour (stage s on rank s % pp; None at the model's ends)."""
    key = input_key(a, n_stages)
    return None if key is None else (key[1] % pp, False, key)


def send_op(a: Action, pp: int, n_stages: int) -> Op | None:
    """The send of pass a's output: a forward's activation to stage + 1, a backward's gradient to stage - 1."""
    if a.kind == "F":
        return ((a.stage + 1) % pp, True, ("F", a.stage, a.microbatch)) if a.stage < n_stages - 1 else None
    return ((a.stage - 1) % pp, True, ("B", a.stage, a.microbatch)) if a.stage > 0 else None
