"""Performance projection: step time, tokens/s/GPU, MFU and where the time goes (issue: `projection performance`).

    from projection import api
    from projection.perf import project, compare_schedules, scaling_table
    sc = api.load("examples/llama3.1_70B-mi300x.yaml")
    p = project(sc)                 # Projection: step_time_s, tokens_per_s_per_gpu, mfu, breakdown_s, sim, memory
    print(p.to_table()); p.to_dict()
    compare_schedules(sc)           # every schedule the plan's pp / vpp / microbatches admit
    scaling_table(sc, [4, 8, 16])   # fixed global batch, every collective re-priced

Modules: costmodel (default_cost_model), pricing (price_stages), items / action_time (what overlaps what inside an
action, host issue), dp (dp_comm_tasks), optimizer (optimizer_step_seconds), project (project, compare_schedules),
result (Projection), scaling (extrapolate, scaling_table), placement, stage_params.
"""

from projection.perf.costmodel import default_cost_model
from projection.perf.dp import Bucket, DPComm, dp_comm_tasks, param_gather_exposed_s
from projection.perf.optimizer import optimizer_step_seconds
from projection.perf.pricing import PricedStages, StagePrice, price_stages
from projection.perf.project import applicable_schedules, compare_schedules, project, with_schedule
from projection.perf.result import BREAKDOWN_KEYS, Projection
from projection.perf.scaling import extrapolate, scaling_table

__all__ = ["BREAKDOWN_KEYS", "Bucket", "DPComm", "PricedStages", "Projection", "StagePrice", "applicable_schedules",
           "compare_schedules", "default_cost_model", "dp_comm_tasks", "extrapolate", "optimizer_step_seconds",
           "param_gather_exposed_s", "price_stages", "project", "scaling_table", "with_schedule"]
