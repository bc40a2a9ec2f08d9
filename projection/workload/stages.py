"""Pipeline stage split: which decoder layers, embedding, loss and MTP layers each (pp rank, virtual chunk) holds.

Virtual stage s runs in data-flow order 0 .. pp*vpp-1. Megatron places virtual stage s on rank s % pp, chunk s // pp
(interleaved 1F1B). V-shaped schedules (ZB-V, V-half, V-min, DualPipeV) with two chunks place stage s on rank s for
s < pp and on rank 2*pp-1-s otherwise (TorchTitan `stage_ids_this_rank(style="v")`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from projection.errors import shown
from projection.specs.model import ModelSpec
from projection.specs.plan import ParallelPlan

V_SCHEDULES = frozenset({"zbv", "v_half", "v_min", "dualpipev"})


@dataclass(frozen=True)
class StageSlot:
    """The contents of one virtual pipeline stage."""

    stage: int  # virtual stage index in data-flow order
    pp_rank: int
    chunk: int
    layers: tuple[int, ...]  # global 0-based decoder layer indices
    embedding: bool
    loss: bool  # final norm + output layer + loss
    mtp_layers: int


class LayoutError(ValueError):
    """A pipeline layout that cannot be realised; the message says why."""


MAX_LAYOUT_SYMBOLS = 1_000_000  # a layout has a symbol per layer and stage: far fewer


def expand_layout(layout: str) -> list[str]:
    """Expand a Megatron `--pipeline-model-parallel-layout` string into one token string per virtual stage.

    Grammar (megatron/core/transformer/pipeline_parallel_layer_layout.py): E embedding, t decoder layer, m MTP layer,
    L loss, '|' separates stages, 'X*n' and '(...)*n' repeat, commas and spaces are cosmetic.
    """
    text = layout.replace(",", "").replace(" ", "")
    group = re.compile(r"\(([^()]*)\)\*(\d+)")

    too_long = LayoutError(f"layout {shown(layout)} expands to more than {MAX_LAYOUT_SYMBOLS:,} symbols")

    def capped(expanded: str) -> str:
        if len(expanded) > MAX_LAYOUT_SYMBOLS:
            raise too_long
        return expanded

    def repeat(m: re.Match[str]) -> str:  # refused before it is multiplied out
        if len(m.group(2)) > 7 or len(m.group(1)) * int(m.group(2)) > MAX_LAYOUT_SYMBOLS:
            raise too_long
        return m.group(1) * int(m.group(2))

    while "(" in text:
        new = capped(group.sub(repeat, text))
        if new == text:
            raise LayoutError(f"unbalanced parentheses in layout {shown(layout)}")
        text = new
    text = capped(re.sub(r"([EtmL])\*(\d+)", repeat, text))
    bad = set(text) - set("EtmL|")
    if bad:
        raise LayoutError(f"layout {layout!r} has unknown symbols {sorted(bad)} (allowed: E t m L | * ( ) ,)")
    return text.split("|")


def stage_rank(stage: int, pp: int, v_shape: bool) -> tuple[int, int]:
    """(pp_rank, chunk) of virtual stage `stage`."""
    chunk = stage // pp
    if v_shape and chunk % 2 == 1:
        return pp - 1 - stage % pp, chunk
    return stage % pp, chunk


def layer_counts(model: ModelSpec, plan: ParallelPlan) -> list[int]:
    """Decoder layers per virtual stage (data-flow order). Raises LayoutError when the split is impossible."""
    pp, vpp, n = plan.pp, plan.vpp_, model.num_layers
    stages = pp * vpp
    if plan.pipeline_layout is not None:
        tokens = expand_layout(plan.pipeline_layout)
        if len(tokens) != stages:
            raise LayoutError(f"layout has {len(tokens)} stages, but pp * vpp = {pp} * {vpp} = {stages}")
        counts = [t.count("t") for t in tokens]
        if sum(counts) != n:
            raise LayoutError(f"layout places {sum(counts)} decoder layers, the model has {n}")
        return counts
    if plan.stage_layers is not None:
        counts = list(plan.stage_layers)
        if len(counts) != stages:
            raise LayoutError(f"stage_layers has {len(counts)} entries, but pp * vpp = {stages}")
        if sum(counts) != n:
            raise LayoutError(f"stage_layers sum to {sum(counts)}, the model has {n} layers")
        return counts
    if plan.first_stage_layers is not None or plan.last_stage_layers is not None:
        return _uneven_counts(n, pp, vpp, plan.first_stage_layers, plan.last_stage_layers)
    # Megatron get_num_layers_to_build: embedding / loss may each take one layer slot on the first / last stage.
    slots = n + int(plan.account_for_embedding) + int(plan.account_for_loss)
    if slots % stages:
        what = f"{n} layers" + (" (+ embedding/loss slots)" if slots != n else "")
        raise LayoutError(f"{what} cannot be split evenly over pp * vpp = {pp} * {vpp} = {stages} stages")
    counts = [slots // stages] * stages
    counts[0] -= int(plan.account_for_embedding)
    counts[-1] -= int(plan.account_for_loss)
    return counts


def _uneven_counts(n: int, pp: int, vpp: int, first: int | None, last: int | None) -> list[int]:
    """--decoder-first/last-pipeline-num-layers: first and last ranks get the given counts, the middle ranks share
    the rest equally; each rank's count is then divided equally over its vpp chunks."""
    given = (first or 0) + (last or 0)
    middle_ranks = pp - (first is not None) - (last is not None)
    rest = n - given
    if rest < 0:
        raise LayoutError(f"first/last stage layers ({first}, {last}) add up to {given}, more than the model's {n} "
                          "layers")
    if (middle_ranks == 0 and rest != 0) or (middle_ranks > 0 and rest % middle_ranks):
        others = f"the other {middle_ranks} pipeline rank{'s' if middle_ranks > 1 else ''}"
        raise LayoutError(f"first/last stage layers ({first}, {last}) leave {rest} of the {n} layers for "
                          + (f"{others}, which share them evenly: not an even split" if middle_ranks else
                             "no other pipeline rank (the first and last stages must hold all of them)"))
    per_rank = [rest // middle_ranks if middle_ranks else 0] * pp
    if first is not None:
        per_rank[0] = first
    if last is not None:
        per_rank[-1] = last
    if any(c % vpp for c in per_rank):
        raise LayoutError(f"per-rank layer counts {per_rank} are not divisible by vpp = {vpp}")
    return [per_rank[s % pp] // vpp for s in range(pp * vpp)]


def split_stages(model: ModelSpec, plan: ParallelPlan) -> tuple[StageSlot, ...]:
    """Every virtual stage with its layers, in data-flow order."""
    counts = layer_counts(model, plan)
    stages = len(counts)
    tokens = expand_layout(plan.pipeline_layout) if plan.pipeline_layout is not None else None
    v_shape = plan.schedule in V_SCHEDULES
    out = []
    start = 0
    for s, c in enumerate(counts):
        rank, chunk = stage_rank(s, plan.pp, v_shape)
        if tokens is not None:
            emb, loss, mtp = "E" in tokens[s], "L" in tokens[s], tokens[s].count("m")
        else:
            emb, loss = s == 0, s == stages - 1
            mtp = model.mtp_num_layers if loss else 0
        out.append(StageSlot(s, rank, chunk, tuple(range(start, start + c)), emb, loss, mtp))
        start += c
    return tuple(out)


def tied_embedding_ranks(model: ModelSpec, plan: ParallelPlan) -> tuple[int, ...]:
    """The pipeline ranks that all-reduce the word-embedding gradient once per step (Megatron finalize_model_grads:
    _allreduce_word_embedding_grads): the embedding's rank and the rank holding a copy of the word embedding, when they
    differ (a V-shaped schedule puts both on rank 0: nothing to reduce). The copy is the output layer's with tied
    embeddings, and the multi-token-prediction stage's with MTP, tied or not ("If use Multi-Token Prediction (MTP), we
    also need to maintain duplicated embedding weights in mtp process stage"); () with neither."""
    if not (model.tie_embeddings or model.mtp_num_layers) or plan.pp == 1:
        return ()
    slots = split_stages(model, plan)
    first = next(s.pp_rank for s in slots if s.embedding)
    copy = next(s.pp_rank for s in slots if (s.mtp_layers if model.mtp_num_layers else s.loss))
    return () if first == copy else (first, copy)
