"""The schedule language shared by builders, checks, the memory estimator and the simulators.

An Action is one unit of pipeline work on one rank. Kinds (torch.distributed.pipelining notation):
  F  forward of (stage, microbatch)
  B  full backward (input-grad and weight-grad together)
  I  input-gradient half of a split backward ("BACKWARD_INPUT")
  W  weight-gradient half of a split backward ("BACKWARD_WEIGHT")
  SEND_F / RECV_F / SEND_B / RECV_B  explicit point-to-point communication (optional in built-in schedules: the
  simulators insert p2p between consecutive stages on different ranks when a schedule has none)
`stage` is the virtual stage index in data-flow order (0 .. n_stages-1); a rank may hold several stages.
CSV notation: "0F0" = stage 0, F, microbatch 0; "1I3", "2W5", "0SEND_F0".
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

Kind = Literal["F", "B", "I", "W", "SEND_F", "RECV_F", "SEND_B", "RECV_B"]
COMPUTE_KINDS: frozenset[str] = frozenset({"F", "B", "I", "W"})
_CSV = re.compile(r"^\s*(\d+)(SEND_F|RECV_F|SEND_B|RECV_B|F|B|I|W)(\d+)\s*$")


@dataclass(frozen=True, slots=True)
class Action:
    stage: int
    kind: Kind
    microbatch: int

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.microbatch}"

    @staticmethod
    def parse(text: str) -> Action:
        m = _CSV.match(text)
        if not m:
            raise ValueError(f"not an action: {text!r} (expected e.g. 0F0, 1I3, 2W5)")
        return Action(int(m.group(1)), m.group(2), int(m.group(3)))  # type: ignore[arg-type]


@dataclass(frozen=True)
class Schedule:
    """Per-rank ordered action lists. `stage_to_rank[s]` is the rank holding virtual stage s.

    `routes` (optional): routes[mb] is the sequence of stages microbatch mb flows through, in data-flow order. Empty
    means every microbatch visits stages 0 .. n_stages-1 in order (all schedules except DualPipe). DualPipe feeds half
    of the microbatches from each end of the pipeline: stages 0..pp-1 carry the first half, stages pp..2pp-1 (the
    reverse-direction copies, on ranks pp-1..0) the second half. Use `prev_stage` / `next_stage` for dependencies.
    `overlapped` (optional): overlapped[rank] lists the indices i at which actions[rank][i] (an F) and
    actions[rank][i+1] (a B) run as one overlapped forward-backward pair (DualPipe, DualPipeV). Empty: none.
    """

    name: str
    n_ranks: int
    n_stages: int
    n_microbatches: int
    stage_to_rank: tuple[int, ...]
    actions: tuple[tuple[Action, ...], ...]  # actions[rank] in execution order
    routes: tuple[tuple[int, ...], ...] = ()
    overlapped: tuple[tuple[int, ...], ...] = ()
    # per rank, the warm-up forwards its builder chose (Megatron's orders): what Megatron's calls follow; derived from
    # the order and the builder, so not part of equality (a CSV holds the order alone: read back, a schedule has no
    # warm-up counts, and is not combined)
    warmup: tuple[int, ...] = field(default=(), compare=False)
    # Megatron-Core's combined 1F1B (interleaved_1f1b): each steady forward runs with the backward after it, layer
    # by layer, the forward's activations saved as the backward's are freed (schedule/inflight.py)
    combined: bool = False

    def stages_of(self, rank: int) -> tuple[int, ...]:
        return tuple(s for s, r in enumerate(self.stage_to_rank) if r == rank)

    def route(self, microbatch: int) -> tuple[int, ...]:
        """Stages `microbatch` flows through, in data-flow order."""
        return self.routes[microbatch] if self.routes else tuple(range(self.n_stages))

    def prev_stage(self, stage: int, microbatch: int) -> int | None:
        """Stage whose forward output feeds `stage` for `microbatch` (None at the route's start or off-route)."""
        if not self.routes:
            return stage - 1 if stage > 0 else None
        path = self.routes[microbatch]
        i = path.index(stage) if stage in path else 0
        return path[i - 1] if i > 0 else None

    def next_stage(self, stage: int, microbatch: int) -> int | None:
        """Stage whose input gradient feeds the backward of `stage` for `microbatch` (None at the route's end)."""
        if not self.routes:
            return stage + 1 if stage + 1 < self.n_stages else None
        path = self.routes[microbatch]
        i = path.index(stage) if stage in path else len(path) - 1
        return path[i + 1] if i + 1 < len(path) else None

    def model_stage(self, stage: int) -> int:
        """Block of layers virtual stage `stage` runs: its position along the routes through it. Equal to `stage`
        except for DualPipe, whose stage pp+k is the reverse-direction copy of model stage k."""
        if not self.routes:
            return stage
        for path in self.routes:
            if stage in path:
                return path.index(stage)
        return stage

    def is_overlapped(self, rank: int, index: int) -> bool:
        """True when actions[rank][index] is the forward half of an overlapped forward-backward pair."""
        return bool(self.overlapped) and index in self.overlapped[rank]
