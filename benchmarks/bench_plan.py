"""`projection plan` wall time: the bundled Llama-3.1-70B example (4 MI300X nodes) over tp {2,4,8} x pp {1,2,4,8} x
vpp {1,5} (21 layouts: pp 1 is searched at vpp 1 only), the same with --recompute none,selective,full (63 layouts),
and, where the shared fixtures are present, a TorchTitan TOML whose every layout is the file loaded again
(tp {1,2,4,8} x recompute: 8 layouts).

    python3 benchmarks/bench_plan.py [--repeat 3]

Prints each command's median CLI wall time and its layout counts; writes nothing.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "llama3.1_70B-mi300x.yaml"
TITAN = REPO.parent / "shared" / "fixtures" / "torchtitan" / "llama3_8b.toml"


def _cases() -> list[tuple[str, list[str]]]:
    grid = ["--tp", "2,4,8", "--pp", "1,2,4,8", "--vpp", "1,5"]
    cases = [("70B example, 21 layouts", ["--config", str(EXAMPLE), *grid]),
             ("70B example with recompute, 63 layouts", ["--config", str(EXAMPLE), *grid,
                                                         "--recompute", "none,selective,full"])]
    if TITAN.is_file():
        cases.append(("TorchTitan Llama-3 8B TOML (reloaded per layout), 8 layouts",
                      ["--config", str(TITAN), "--tp", "1,2,4,8", "--recompute", "selective,full"]))
    return cases


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    for name, flags in _cases():
        cmd = [sys.executable, "-m", "projection", "plan", *flags, "--top", "3"]
        walls, out = [], ""
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            out = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, check=True).stdout
            walls.append(time.perf_counter() - t0)
        print(f"{name}: median {statistics.median(walls):.2f} s over {len(walls)} runs "
              f"(min {min(walls):.2f}, max {max(walls):.2f}); {out.splitlines()[0]}")
    if not TITAN.is_file():
        print(f"(TorchTitan case skipped: {TITAN} is absent)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
