"""Speed of config loading + validation + `inspect` (parameter counts per rank) for every bundled preset.

Run: python3 benchmarks/bench_load.py [--repeat N]
Prints milliseconds per preset (median of N runs). Not part of the test suite: speed targets live here.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from projection import api  # noqa: E402
from projection.paths import MODELS_DIR  # noqa: E402

# 4096 tokens, or the preset's max_position_embeddings where it is shorter (GPT-3: 2048; a longer sequence is refused)
SCENARIO = """model: {preset}
training: {{seq_length: {seq}, micro_batch_size: 1, global_batch_size: 1024}}
plan: {{tp: 1, pp: 1}}
cluster: {{hardware: mi300x, nodes: 16}}
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        print(f"{'preset':<24} {'load ms':>9} {'inspect ms':>11}")
        for preset in sorted(p.stem for p in MODELS_DIR.glob("*.yaml")):
            path = Path(tmp) / f"{preset}.yaml"
            limit = (yaml.safe_load((MODELS_DIR / f"{preset}.yaml").read_text()) or {}).get("max_position_embeddings")
            path.write_text(SCENARIO.format(preset=preset, seq=min(4096, limit or 4096)))
            loads, inspects = [], []
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                sc = api.load(path)
                t1 = time.perf_counter()
                api.inspect(sc)
                t2 = time.perf_counter()
                loads.append(t1 - t0)
                inspects.append(t2 - t1)
            print(f"{preset:<24} {1e3 * statistics.median(loads):>9.2f} {1e3 * statistics.median(inspects):>11.2f}")


if __name__ == "__main__":
    main()
