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
from dataclasses import dataclass
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
    """Per-rank ordered action lists. `stage_to_rank[s]` is the rank holding virtual stage s."""

    name: str
    n_ranks: int
    n_stages: int
    n_microbatches: int
    stage_to_rank: tuple[int, ...]
    actions: tuple[tuple[Action, ...], ...]  # actions[rank] in execution order

    def stages_of(self, rank: int) -> tuple[int, ...]:
        return tuple(s for s, r in enumerate(self.stage_to_rank) if r == rank)
