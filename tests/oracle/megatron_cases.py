"""The measured Megatron-LM functional-test cases of shared/fixtures/megatron/CASES.md (DGX H100), parsed once for
the memory and the performance oracles."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

MEGATRON = Path(__file__).resolve().parents[2].parent / "shared" / "fixtures" / "megatron"

_ROW = re.compile(r"^\|\s*(?P<case>\S+)\s*\|\s*(?P<nodes>\d+)\s*x\s*(?P<gpus>\d+)\s*\|\s*(?P<mem>\d+)\s*\|"
                  r"\s*(?P<time>[0-9.]+)\s*\|[^|]*pp_rank (?P<pp_rank>\d+) of PP=(?P<pp>\d+)")


@dataclass(frozen=True)
class Case:
    name: str
    nodes: int
    gpus_per_node: int
    measured: int  # median mem-max-allocated-bytes
    iteration_s: float  # median iteration-time
    pp_rank: int  # the rank that logged (last pipeline stage)
    pp: int


def cases() -> list[Case]:
    if not (MEGATRON / "CASES.md").is_file():
        return []
    out = []
    for line in (MEGATRON / "CASES.md").read_text(encoding="utf-8").splitlines():
        m = _ROW.match(line)
        if m:
            out.append(Case(m["case"], int(m["nodes"]), int(m["gpus"]), int(m["mem"]), float(m["time"]),
                            int(m["pp_rank"]), int(m["pp"])))
    return out
