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
# Board names some drivers print instead of the product's: the memory and form factor the board stands for.
# "NVIDIA A100-PG509-200" is PCI device 20B0 (subsystem 10DE 1450), the device ID of the A100-SXM4-40GB (NVIDIA
# Linux driver README, Appendix A "Supported NVIDIA GPU Products"; the 80 GB SXM4 part is 20B2), and the HTA traces
# that print it report totalGlobalMem 42.3 GB = 39.4 GiB, a 40 GB part's usable memory (an 80 GB one reports
# 81920 MiB = 85.9 GB): ../shared/reference/hardware.md lists it as "A100-PG509-200 (40 GB)".
_BOARDS = {"pg509200": ("40gb", "sxm")}


def device_match(measured: str, dev: DeviceSpec) -> Match:
    """How a printed device name matches a device YAML: "same" (its name, marketing name or an alias, with no
    memory size or form factor that differs from the marketing name's: "A100-SXM4-40GB" is not a100-80g, "H100
    PCIe" not h100-sxm, nor is the board name "A100-PG509-200", a 40 GB part: `_BOARDS`), "arch" (only the ISA,
    e.g. hipBLASLt's gfx942), else "other"."""
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
    boards = [board for code, board in _BOARDS.items() if code in _squash(name)]
    return {"memory": {w for w in words if _MEMORY.fullmatch(w)} | {b[0] for b in boards},
            "form": {_FORMS[w] for w in words if w in _FORMS} | {b[1] for b in boards}}


def _squash(text: str) -> str:
    return "".join(ch for ch in text.lower() if ch.isalnum())
