"""Common base for every input spec: immutable, no unknown keys."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Spec(BaseModel):
    """Frozen pydantic model that rejects unknown keys."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)
