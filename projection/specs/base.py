"""Common base for every input spec: immutable, no unknown keys, no booleans where a number goes."""

from __future__ import annotations

import math
import types
import typing
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

MAX_INT = 2**53


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
        # a count past 2**53 is no job's (the largest are ~1e12 parameters, ~1e6 GPUs) and overflows the float
        # arithmetic downstream (`vocab_size: 999...9` used to end in an OverflowError traceback)
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INT:
            digits = len(str(abs(value)))
            raise PydanticCustomError("int_too_large", "a {digits}-digit number is too large (at most 2**53 = {limit})",
                                      {"digits": digits, "limit": MAX_INT})
        if isinstance(value, str) and info.field_name is not None:
            field = cls.model_fields.get(info.field_name)
            # YAML reads `1e400` (no dot) as a string, which pydantic would turn into an infinite float
            if field is not None and _is_number(field.annotation) and not math.isfinite(_as_float(value)):
                raise PydanticCustomError("not_finite", "expected a finite number, got {value}", {"value": value})
        if isinstance(value, float) and not math.isfinite(value):
            raise PydanticCustomError("not_finite", "expected a finite number, got {value}", {"value": value})
        return value


def _as_float(text: str) -> float:
    """The float a numeric string means (0.0 for one that is not a number: pydantic's own error follows)."""
    try:
        return float(text)
    except ValueError:
        return 0.0
