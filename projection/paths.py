"""Where the bundled data folders live (next to the package in a source checkout or editable install)."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
HARDWARE_DIR = REPO_ROOT / "hardware_specs"
MODELS_DIR = REPO_ROOT / "models"
