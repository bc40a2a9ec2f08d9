"""Where the bundled data folders live (next to the package in a source checkout or editable install)."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
HARDWARE_DIR = REPO_ROOT / "hardware_specs"
MODELS_DIR = REPO_ROOT / "models"


def is_device_path(text: str) -> bool:
    """Whether a --hardware / cluster.hardware value names a device YAML file rather than a bundled device (looked up
    in HARDWARE_DIR): it ends in .yaml / .yml or holds a path separator."""
    return text.endswith((".yaml", ".yml")) or "/" in text or "\\" in text
