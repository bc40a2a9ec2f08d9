"""Results cannot be changed in place (DESIGN.md: pure functions of immutable values): the dictionaries inside a
Projection and a MemoryReport's ranks were plain dicts a notebook could edit, unnoticed by every later use of the
same result. They are read-only mappings now, that still pickle, deep-copy and compare equal to dicts."""

from __future__ import annotations

import copy
import json
import pickle
from pathlib import Path

import pytest

from projection import api
from projection.perf import project

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "llama3_8b_inline.yaml"


def test_projection_and_memory_mappings_are_read_only() -> None:
    proj = project(api.load(EXAMPLE))
    rank = api.estimate_memory(api.load(EXAMPLE)).ranks[0]
    mappings = [proj.breakdown_s, proj.comm_total_s, proj.provenance, rank.bytes, rank.terms, rank.inflight,
                rank.microbatch_activation_bytes]
    for m in mappings:
        key = next(iter(m), "x")
        with pytest.raises(TypeError):
            m[key] = 0  # type: ignore[index]
        with pytest.raises(AttributeError):
            m.pop(key)  # type: ignore[attr-defined]
        with pytest.raises(AttributeError):
            m._items = {}  # type: ignore[attr-defined]
    assert proj.breakdown_s == dict(proj.breakdown_s) and sum(proj.breakdown_s.values()) == pytest.approx(
        proj.step_time_s)
    for obj in (proj.breakdown_s, rank.terms):  # a process pool pickles, a notebook deep-copies
        assert pickle.loads(pickle.dumps(obj)) == obj and copy.deepcopy(obj) == obj
    again = pickle.loads(pickle.dumps(rank))
    assert again == rank and again.terms == rank.terms
    assert json.loads(json.dumps(proj.to_dict()))["breakdown_s"] == dict(proj.breakdown_s)
