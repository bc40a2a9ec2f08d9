"""projection: per-rank memory and step-time projection for large-model training.

The flow (see DESIGN): config file(s) -> Scenario (validated once) -> pure functions -> reports.
"""

__version__ = "0.1.0"
