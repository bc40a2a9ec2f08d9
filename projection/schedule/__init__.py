"""Pipeline schedules as data: per-rank lists of Actions (see action.py)."""
