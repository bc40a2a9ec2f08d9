"""PNG timeline of a simulated step: one row per rank (compute), with p2p receives and comm tasks as thin bars.

matplotlib (Agg backend, no display) is imported inside the function, so the package does not depend on it unless a
PNG is asked for. Colours: F blue, B violet, I orange, W green, p2p grey, comm red; labels show the microbatch when
the bars are wide enough; a rank's second (fourth ...) chunk is drawn lighter.
"""

from __future__ import annotations

from pathlib import Path

from projection.errors import ConfigError, Problem
from projection.sim.result import SimResult

MAX_INCHES = 30.0  # the picture's largest side: 3,600 pixels at the default 120 dpi
COLOURS = {"F": "#4c72b0", "B": "#8172b3", "I": "#dd8452", "W": "#55a868", "p2p": "#999999", "comm": "#c44e52"}


def write_timeline_png(result: SimResult, path: str | Path, *, title: str | None = None, dpi: int = 120) -> Path:
    """Draw the timeline (seconds on x, rank 0 at the top) to `path`; returns the path."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ConfigError(Problem("writing a PNG timeline needs matplotlib", key="png",
                                  fix="pip install matplotlib, or drop --png")) from err
    n = result.n_ranks
    n_bars = sum(len(t) for t in result.timeline)
    # at most MAX_INCHES a side (a pp-1000 timeline was drawn 54,000 pixels tall: 195 M pixels, a minute); rows
    # thinner than that, their labels thinned, and bars without edges where they are too many to see them
    fig, ax = plt.subplots(figsize=(min(MAX_INCHES, 10.0 + n_bars / 400), min(MAX_INCHES, 1.2 + 0.45 * n)))
    edge = 0.3 if n_bars <= 20_000 else 0.0
    step = result.step_time_s or 1.0
    for r, entries in enumerate(result.timeline):
        chunk = {s: k for k, s in enumerate(sorted(result.schedule.stages_of(r)))}
        bars: dict[tuple[str, int], list[tuple[float, float]]] = {}
        for e in entries:
            compute = e.stream == "compute" and e.action is not None
            key: tuple[str, int] = (str(e.action.kind), chunk[e.action.stage] % 2) if compute and e.action else (
                e.stream, 0)
            bars.setdefault(key, []).append((e.start_s, e.end_s - e.start_s))
            if e.stream == "compute" and e.action is not None and (e.end_s - e.start_s) > 0.012 * step:
                ax.text(e.start_s + (e.end_s - e.start_s) / 2, r, str(e.action.microbatch), ha="center",
                        va="center", fontsize=6, color="white")
        for (name, odd), spans in bars.items():
            y, h = (r - 0.4, 0.8) if name in "FBIW" else ((r + 0.25, 0.15) if name == "p2p" else (r + 0.4, 0.15))
            ax.broken_barh(spans, (y, h), facecolors=COLOURS[name], edgecolor="white", linewidth=edge,
                           alpha=0.6 if odd else 1.0)
    ax.set_ylim(n - 0.4, -0.6)
    every = -(-n // 64)  # at most 64 rank labels
    ax.set_yticks(range(0, n, every), [f"rank {r}" for r in range(0, n, every)])
    ax.set_xlim(0, step)
    ax.set_xlabel("time (s)")
    ax.set_title(title or f"{result.schedule.name}: step {result.step_time_s:.4g} s, "
                 f"bubble {result.bubble_ratio:.1%}")
    used = {e.action.kind if e.stream == "compute" and e.action else e.stream for t in result.timeline for e in t}
    ax.legend(handles=[Patch(color=c, label=k) for k, c in COLOURS.items() if k in used], loc="upper right",
              fontsize=7, ncol=len(used))
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=dpi)
    plt.close(fig)
    return out
