"""Ops another backend may replace: the NumPy form written here is the definition, and a registered
replacement (the same function, computed faster) runs in its place while a table is in force.

    @replaceable
    def rms_norm(x, w, eps): ...             the NumPy form; called as usual

    with replacing({rms_norm: other}):       inside the block (this thread only) rms_norm(...) runs other(...);
        ...                                  outside it, and on other threads, the NumPy form runs

The executor opens the block around a plan's kernels for `backend="fast"` (simulator/fast/replacements.py
holds that table); ops/ itself knows no backend. `op.__wrapped__` is the NumPy form, whatever is in force.
"""

from __future__ import annotations

import functools
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Callable, Iterator, Mapping, TypeVar

F = TypeVar("F", bound=Callable[..., Any])
_TABLE: ContextVar[Mapping[Callable[..., Any], Callable[..., Any]]] = ContextVar("replacements", default={})


def replaceable(fn: F) -> F:
    """`fn`, or its replacement in the table in force."""
    @functools.wraps(fn)
    def op(*args: Any, **kwargs: Any) -> Any:
        return _TABLE.get().get(op, fn)(*args, **kwargs)
    return op  # type: ignore[return-value]


@contextmanager
def replacing(table: Mapping[Callable[..., Any], Callable[..., Any]]) -> Iterator[None]:
    """Run the `replaceable` ops that are keys of `table` as their values inside the block."""
    token = _TABLE.set(table)
    try:
        yield
    finally:
        _TABLE.reset(token)
