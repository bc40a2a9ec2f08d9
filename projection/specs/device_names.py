"""Which device YAML a device name printed by a tool stands for: nvidia-smi's and rccl-tests' product names
("NVIDIA H100 80GB HBM3", "AMD Instinct MI300X", "A100-SXM4-40GB"), and the ISA hipBLASLt prints for AMD parts
("gfx942:sramecc+:xnack-", shared by MI300X and MI325X). Used to say when a calibration was measured on another part
than the one projected, to merge one machine's GEMM and collective logs, and to find the bundled device of a log."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Literal

from projection.specs.hardware import DeviceSpec

Match = Literal["same", "arch", "other"]

_MEMORY = re.compile(r"\d+gb")
_FORMS = {"sxm": "sxm", "sxm2": "sxm", "sxm4": "sxm", "sxm5": "sxm", "pcie": "pcie", "nvl": "nvl"}


def device_match(measured: str, dev: DeviceSpec) -> Match:
    """How a printed device name matches a device YAML: "same" (its name, marketing name or an alias, with no
    memory size or form factor that differs from the marketing name's: "A100-SXM4-40GB" is not a100-80g, "H100
    PCIe" not h100-sxm), "arch" (only the ISA, e.g. hipBLASLt's gfx942), else "other"."""
    names = {_squash(n) for n in (dev.name, dev.marketing_name, *dev.aliases) if n}
    names = {n for n in names if len(n) >= 3}
    squashed = _squash(measured)
    if any(n in squashed for n in names):  # the printed name holds one of the part's (not the reverse: H20, H200)
        mine, theirs = _tokens(dev.marketing_name or dev.name), _tokens(measured)
        for kind in ("memory", "form"):
            if theirs[kind] and mine[kind] and not theirs[kind] & mine[kind]:
                return "other"
        return "same"
    return "arch" if dev.gpu_arch and _squash(dev.gpu_arch) in squashed else "other"


def identify(measured: str, devices: Iterable[DeviceSpec]) -> DeviceSpec | None:
    """The one device a printed name is ("same"), else the one device its ISA alone names; None when none or
    several do."""
    devices = list(devices)
    for kind in ("same", "arch"):
        found = [d for d in devices if device_match(measured, d) == kind]
        if found:
            return found[0] if len(found) == 1 else None
    return None


def _tokens(name: str) -> dict[str, set[str]]:
    words = re.split(r"[^a-z0-9]+", name.lower())
    return {"memory": {w for w in words if _MEMORY.fullmatch(w)}, "form": {_FORMS[w] for w in words if w in _FORMS}}


def _squash(text: str) -> str:
    return "".join(ch for ch in text.lower() if ch.isalnum())
