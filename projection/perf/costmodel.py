"""The cost model `project` uses by default: the shipped calibration of the scenario's device
(calibrations/<device>.json, built from published microbenchmarks only) over the roofline model of its DeviceSpec,
or a calibration file of the user's own.

The roofline fallback is built with the cluster's fabric (collectives) and the plan's group placements, computed by
projection/perf/placement.py (vectorised: a 16,384-GPU cluster costs milliseconds, where the generic
projection.cost.model.group_placements loops over every rank).
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from projection.calibrate.calibration import load_calibration
from projection.cost.calibrated import CalibratedCostModel
from projection.cost.collectives import Fabric
from projection.cost.model import CostModel
from projection.cost.roofline import RooflineCostModel
from projection.errors import ConfigError, Problem
from projection.paths import REPO_ROOT
from projection.perf.placement import op_placements
from projection.specs.hardware import DeviceSpec
from projection.specs.scenario import Scenario, runs_megatron

CALIBRATIONS_DIR = REPO_ROOT / "calibrations"
COST_MODEL_METHODS = ("op_seconds", "collective_seconds", "provenance", "collective_provenance")


def check_arguments(function: str, scenario: object, cost_model: object = None) -> None:
    """ConfigError naming the argument when `scenario` is not a Scenario or `cost_model` not a cost model."""
    if not isinstance(scenario, Scenario):
        raise ConfigError(Problem(f"{function} needs a Scenario, got {type(scenario).__name__}", key="scenario",
                                  file="<api>", fix="pass a Scenario from projection.api.load"))
    if cost_model is not None and not all(callable(getattr(cost_model, m, None)) for m in COST_MODEL_METHODS):
        raise ConfigError(Problem(f"{function}'s cost_model must be a CostModel, got {type(cost_model).__name__} "
                                  f"{cost_model!r}"[:200], key="cost_model", file="<api>",
                                  fix="pass projection.perf.default_cost_model(scenario), or None for it"))


def shipped_calibration(device_name: str, search_dir: Path = CALIBRATIONS_DIR) -> Path | None:
    """calibrations/<device>.json if it exists."""
    path = search_dir / f"{device_name}.json"
    return path if path.is_file() else None


def default_cost_model(scenario: Scenario, calibration: Path | None = None) -> CostModel:
    """Calibrated model (the given file, else the device's shipped calibration) falling back to the roofline of the
    device's spec; the bare roofline when neither exists. Raises CalibrationError for an unreadable file."""
    check_arguments("default_cost_model", scenario)
    if calibration is not None and not isinstance(calibration, str | Path):
        raise ConfigError(Problem(f"default_cost_model's calibration must be a path, got "
                                  f"{type(calibration).__name__} {calibration!r}"[:200], key="calibration",
                                  file="<api>", fix="pass the path of a calibration JSON, or None for the shipped one"))
    device, cluster = scenario.cluster.device, scenario.cluster
    roofline = RooflineCostModel(device, fabric=Fabric.from_specs(device, cluster, nic_gpus=nic_gpus(scenario)))
    roofline.groups = op_placements(cluster, scenario.plan)
    path = Path(calibration) if calibration is not None else shipped_calibration(device.name)
    if path is None:
        return roofline
    # the compute tables' device: the shipped file's bundled part, or for one's own file the device before the
    # what-if edits (None without edits: measured on the device as priced)
    measured_device = (_bundled_device(device.name) if calibration is None else scenario.device_as_loaded) \
        if scenario.device_as_loaded is not None else None
    return CalibratedCostModel(load_calibration(path), roofline, groups=roofline.groups, name=path.name, path=path,
                               measured_on=_shipped_machine(scenario) if calibration is None else _unedited(scenario),
                               measured_device=measured_device)


def nic_gpus(scenario: Scenario) -> int | None:
    """The GPUs that share a node's NICs where the NIC count is stated for the cluster's own node (a what-if edit of
    `cluster.device.nic.count_per_node`): the cluster's GPUs per node; None (the device's node) otherwise, so that
    `--gpus-per-node` keeps each GPU's NIC share (Fabric.from_specs)."""
    # stated, whatever its value (the device's own count stated for a node of other GPUs is a what-if too)
    edited = scenario.device_as_loaded is not None and "cluster.device.nic.count_per_node" in scenario.origins
    return scenario.cluster.gpus_per_node if edited else None


def _unedited(scenario: Scenario) -> Fabric | None:
    """The fabric a calibration of one's own was measured on: the scenario's cluster before its device what-ifs
    (`--set cluster.device.*`); None without them (measured on the cluster as given)."""
    device = scenario.device_as_loaded
    if device is None:
        return None
    return Fabric.from_specs(device, scenario.cluster.model_copy(update={"device": device}))


def _shipped_machine(scenario: Scenario) -> Fabric | None:
    """The fabric a shipped calibration's collectives were measured on: the bundled device YAML of the same name on
    its typical node (a scenario with other NICs, links or GPUs per node, e.g. `--set cluster.device.nic.
    count_per_node=4` or `--gpus-per-node 4`, is priced from it by the ratio of the two; a calibration of one's own
    is taken as measured on the scenario's cluster before its what-ifs: `_unedited`)."""
    cluster = scenario.cluster
    shipped = _bundled_device(cluster.device.name)
    if shipped is None:
        return None
    return Fabric.from_specs(shipped, cluster.model_copy(update={"device": shipped,
                                                                 "gpus_per_node": shipped.gpus_per_node}))


@lru_cache(maxsize=16)
def _bundled_device(name: str) -> DeviceSpec | None:
    """hardware_specs/<name>.yaml, read once per process (a layout search or scaling table builds a cost model per
    candidate); None for a name no bundled device has. DeviceSpec is frozen, so the cached one is shared safely."""
    from projection.errors import ConfigError
    from projection.specs.hardware import load_device

    try:
        return load_device(name)
    except ConfigError:
        return None


def host_issue(scenario: Scenario, cost_model: CostModel) -> tuple[float, str]:
    """Host seconds per kernel launch (the framework-overhead model of projection/perf/action_time.py) and where it
    comes from: the cost model's calibration when it has host rows (`projection calibrate host`, or a profiler trace
    imported with `projection calibrate import`), else the device YAML's `host_kernel_issue_s`, else 0 (not
    modelled)."""
    measured = getattr(cost_model, "host_kernel_issue_s", None)
    if measured:
        return float(measured), f"calibration {getattr(cost_model, 'name', '')}".strip()
    device = scenario.cluster.device
    if device.host_kernel_issue_s:
        return device.host_kernel_issue_s, f"device {device.name}"
    return 0.0, "not modelled"


FRAMEWORK_HOST_FILE = CALIBRATIONS_DIR / "framework_host.json"


def framework_host_factors(scenario: Scenario, host_source: str,
                           path: Path | None = None) -> tuple[float, float, str]:
    """Factors (forward, backward) on the host issue time per kernel of a stage's actions, and what they are.

    The device YAML's `host_kernel_issue_s` is an eager Hugging Face forward's host time per kernel (from a profiled
    trace). Megatron's modules spend more host time per kernel that the op list models than that:
    `benchmarks/bench_megatron_host.py` measures Megatron-Core's GPT layer, and the HF reference layer under the
    trace's profiler settings, on one host and writes their ratio per modelled kernel to
    calibrations/framework_host.json. The pricing applies it to compute kernels, not collectives or copies, of
    Megatron and Primus-Megatron jobs priced with the device YAML's figure. A calibration's own host rows (a profiler
    trace of the job's step, or `projection calibrate host`) are used as they are. Other frameworks get factor 1
    (calibrations/README.md says why that understates them too)."""
    path = FRAMEWORK_HOST_FILE if path is None else path
    if not runs_megatron(scenario.framework) or not host_source.startswith("device") or not path.is_file():
        return 1.0, 1.0, ""
    row = json.loads(path.read_text(encoding="utf-8")).get("megatron") or {}
    fwd, bwd = float(row.get("forward", 1.0)), float(row.get("backward", 1.0))
    return fwd, bwd, f"x {fwd:.2f} forward, {bwd:.2f} backward for Megatron's modules ({path.name})"
