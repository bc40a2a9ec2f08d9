"""Common base for every input spec: immutable, no unknown keys, no booleans where a number goes."""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError


def _is_number(annotation: Any) -> bool:
    """int, float, or a union of them with None (pydantic's lax mode would read True as 1 for these)."""
    if annotation in (int, float):
        return True
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return bool(args) and all(a in (int, float) for a in args)
    return False


class Spec(BaseModel):
    """Frozen pydantic model that rejects unknown keys."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)

    @field_validator("*", mode="before")
    @classmethod
    def _bool_is_not_a_number(cls, value: Any, info: ValidationInfo) -> Any:
        # `tp: true` is a typo, not tp = 1 (pydantic's lax int/float coercion accepts booleans)
        if isinstance(value, bool) and info.field_name is not None:
            field = cls.model_fields.get(info.field_name)
            if field is not None and _is_number(field.annotation):
                raise PydanticCustomError("bool_for_number", "expected a number, got a boolean (true/false)")
        return value
