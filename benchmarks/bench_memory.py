"""Memory estimator speed: one config in-process (cold and warm), the numpy grid over 100,000 plans, and the
`projection memory` CLI wall time (which must not import torch).

Run: python3 benchmarks/bench_memory.py
Targets (issue 3): single-config estimate < 1 ms in-process; 100,000 plans < 1 s; CLI < 0.5 s.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from projection import api  # noqa: E402
from projection.memory.estimate import estimate_memory  # noqa: E402
from projection.memory.grid import memory_grid  # noqa: E402

EXAMPLE = REPO / "examples" / "llama3.1_70B-mi300x.yaml"


def main() -> None:
    sc = api.load(EXAMPLE)
    t0 = time.perf_counter()
    estimate_memory(sc)
    cold = time.perf_counter() - t0
    runs = []
    for _ in range(200):
        t0 = time.perf_counter()
        estimate_memory(sc)
        runs.append(time.perf_counter() - t0)
    print(f"single config (llama3.1_70B, tp8 pp4 vpp5, 128 microbatches): cold {cold * 1e3:.2f} ms "
          f"(builds the schedule), warm median {statistics.median(runs) * 1e3:.3f} ms")

    rng = np.random.default_rng(0)
    n = 100_000
    grid = {k: rng.choice(v, n) for k, v in {"tp": [1, 2, 4, 8], "pp": [1, 2, 4, 8], "dp": [1, 2, 4, 8, 16],
                                             "mbs": [1, 2], "zero_stage": [0, 1, 2, 3]}.items()}
    t0 = time.perf_counter()
    memory_grid(sc.model, sc.training, **grid, device=sc.cluster.device)
    print(f"numpy grid over {n:,} plans: {time.perf_counter() - t0:.3f} s")

    walls = []
    for _ in range(5):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "projection", "memory", "--config", str(EXAMPLE)], check=True,
                       capture_output=True, cwd=REPO)
        walls.append(time.perf_counter() - t0)
    out = subprocess.run([sys.executable, "-c", "import sys, projection.cli as c; c.main(['memory', '--config', "
                          f"'{EXAMPLE}']); print('torch' in sys.modules)"], capture_output=True, text=True,
                         cwd=REPO).stdout.strip().splitlines()[-1]
    print(f"projection memory CLI wall time: median {statistics.median(walls):.3f} s; torch imported: {out}")


if __name__ == "__main__":
    main()
