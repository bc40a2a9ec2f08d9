"""PNG of a weak-scaling table: tokens/s/GPU (top) and MFU (bottom) against the node count (log2 axis).

matplotlib (Agg backend, no display) is imported inside the function, so the package does not depend on it unless a
PNG is asked for. Each point is one `projection.perf.Projection` of `projection.perf.scaling.scaling_table`; a point
whose memory verdict is not `fits` (or unknown) is drawn hollow and labelled with the verdict.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from projection.errors import ConfigError, Problem


def _nodes(proj: Any) -> float:
    sc = getattr(proj, "scenario", None)
    if sc is not None:
        return float(sc.cluster.nodes)
    return float(proj.world_size)


def write_scaling_png(rows: Sequence[Any], path: str | Path, *, title: str | None = None, dpi: int = 120) -> Path:
    """Plot tokens/s/GPU and MFU of `rows` (Projections, one per node count) against nodes; returns the path."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ConfigError(Problem("writing a PNG scaling plot needs matplotlib", key="--png",
                                  fix="pip install matplotlib, or drop --png")) from err
    if not rows:
        raise ConfigError(Problem("nothing to plot", key="--scaling", fix="give at least one node count"))
    pts = sorted(rows, key=_nodes)
    x = [_nodes(p) for p in pts]
    tok = [float(p.tokens_per_s_per_gpu) for p in pts]
    mfu = [100.0 * float(p.mfu) for p in pts]
    verdicts = [str(getattr(getattr(p, "memory", None), "verdict", "fits")) for p in pts]
    fig, (ax, ax2) = plt.subplots(2, 1, sharex=True, figsize=(7.5, 5.6))
    for axis, values, colour, label in ((ax, tok, "#4c72b0", "tokens/s/GPU"), (ax2, mfu, "#c44e52", "MFU (%)")):
        axis.plot(x, values, "-", color=colour)
        for xi, yi, v in zip(x, values, verdicts, strict=True):
            hollow = v != "fits"
            axis.plot([xi], [yi], "o", color=colour, markerfacecolor="white" if hollow else colour)
            axis.annotate(f"{yi:,.0f}" if axis is ax else f"{yi:.1f}", (xi, yi), textcoords="offset points",
                          xytext=(0, 6), ha="center", fontsize=7)
            if hollow:
                axis.annotate(v, (xi, yi), textcoords="offset points", xytext=(0, -12), ha="center", fontsize=7)
        axis.set_ylabel(label, color=colour)
        axis.set_ylim(bottom=0, top=max(values) * 1.2 if max(values) > 0 else 1.0)
        axis.grid(True, which="major", alpha=0.3)
    ax2.set_xscale("log", base=2)
    ax2.set_xticks(x, [f"{int(n)}" for n in x])
    ax2.minorticks_off()
    ax2.set_xlabel("nodes")
    ax.set_title(title or "scaling at fixed global batch", fontsize=9)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=dpi)
    plt.close(fig)
    return out
