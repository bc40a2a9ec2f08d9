"""`FrozenMap`: a read-only mapping for the dictionaries inside frozen results (a Projection's breakdown, a rank's
memory terms), so that a notebook cannot change a result, or a value cached beside it, in place. Unlike
types.MappingProxyType it pickles and deep-copies (results cross process pools in a notebook)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class FrozenMap(Mapping[K, V], Generic[K, V]):
    """A copy of a mapping that cannot be changed; equal to any mapping with the same items."""

    __slots__ = ("_items",)
    _items: dict[K, V]

    def __init__(self, items: Mapping[K, V] | None = None) -> None:
        object.__setattr__(self, "_items", dict(items or {}))

    def __getitem__(self, key: K) -> V:
        return self._items[key]

    def __iter__(self) -> Iterator[K]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return repr(self._items)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} cannot be changed")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self._items,))

    def __hash__(self) -> int:
        return hash(frozenset(self._items.items()))


def frozen_fields(obj: Any, *names: str) -> None:
    """In a frozen dataclass's __post_init__: replace each named mapping field by a FrozenMap of it."""
    for name in names:
        value = getattr(obj, name)
        if not isinstance(value, FrozenMap):
            object.__setattr__(obj, name, FrozenMap(value))
