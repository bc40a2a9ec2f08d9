"""Pipeline simulators over priced stages: exact walk (dag.py), event loop (des.py), closed forms (closed_form.py).

Entry point: projection.sim.api.simulate(schedule, costs, engine="dag" | "des"). Times are seconds.
"""
