"""Calibration: measured GEMM, attention and collective tables, their importers and fits (the only torch user)."""
