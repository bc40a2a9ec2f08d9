"""The calibration error: a measurement file that cannot be read, holds no benchmark table, or does not validate."""

from __future__ import annotations

from projection.errors import ProjectionError


class CalibrationError(ProjectionError):
    """A calibration input (benchmark log, profiler trace, calibration JSON) is missing, unreadable, of an unknown
    format, holds no benchmark table, or has values that do not validate. Each problem names the file, what is wrong
    and the fix; the CLI turns it into exit code 2."""
