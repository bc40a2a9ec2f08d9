"""`projection shapes`: the GEMM, grouped-GEMM, attention and collective shapes one training step runs, per rank
type, with their counts per step (projection/workload/shapes.py), as CSV (default) or JSON on stdout.

    projection shapes --config F [--format csv|json] [--hardware NAME] [--nodes N] [--gpus-per-node G]
                      [--set KEY=VALUE ...] [--primus-root DIR]

Wiring (cli.py): `add_parser(subparsers)` adds the sub-command; `run(args, env)` prints and returns the exit code
(2 with the message on stderr for a user error).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from collections.abc import Mapping
from typing import Any

from projection.cli_args import add_scenario_args, load_scenario
from projection.errors import ProjectionError
from projection.workload.shapes import COLUMNS, step_shapes


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "shapes", help="GEMM / attention / memory-bound kernel / collective shapes of one step, per rank type "
        "(input of a calibration)",
        description="Kernel shapes one training step runs on each rank type, with counts per step. GEMMs use the "
        "BLAS convention of hipblaslt-bench (m, n, k, layout = transA transB).")
    add_scenario_args(p, formats=("csv", "json"))
    return p


def run(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> int:
    try:
        scenario = load_scenario(args, env)
        rows = step_shapes(scenario)
    except ProjectionError as err:
        print(f"error: {err.render()}", file=sys.stderr)
        return 2
    if args.format == "json":
        plan = scenario.plan
        doc = {"config": scenario.source, "model": scenario.model.name, "hardware": scenario.cluster.device.name,
               "world_size": scenario.world_size,
               "parallel": {"tp": plan.tp, "sp": plan.sp_, "cp": plan.cp, "ep": plan.ep, "etp": plan.etp_,
                            "pp": plan.pp, "vpp": plan.vpp_, "dp": plan.dp_()},
               "microbatches_per_step": scenario.training.num_microbatches(plan.dp_()),
               "conventions": "GEMM m, n, k and layout in the BLAS (hipBLASLt) convention; attention m = seq_q, "
                              "n = seq_kv, k = head dim, batch = sequences; memory_bound: op = kernel, m = rows, "
                              "n = row length, size_bytes = bytes read + written; collective size_bytes in the "
                              "nccl-tests size convention; phase F forward, I input gradient, W weight gradient",
               "rows": [r.to_dict() for r in rows]}
        print(json.dumps(doc, indent=2))
        return 0
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(COLUMNS), lineterminator="\n")
    writer.writeheader()
    for r in rows:
        writer.writerow({**r.to_dict(), "flop_per_step": f"{r.flop_per_step:.6g}"})
    sys.stdout.write(out.getvalue())
    return 0
