"""A bounded memo: values kept in a dict by key, every one forgotten once the dict holds `limit` of them.

The cost model and the plan builders remember what a sweep asks for again and again (a kernel's priced terms,
its drawn terms, a context-free kernel), in dicts that would otherwise grow with the grid. Forgetting all at
once keeps the bookkeeping to one length check; a sweep's neighbouring points refill what they share.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Hashable, TypeVar


def remember(cache: dict, key: Hashable, make: Callable[..., Any], *args: Any, limit: int) -> Any:
    """cache[key], made by make(*args) and kept when it is not there (made values must not be None)."""
    seen = cache.get(key)
    if seen is None:
        if len(cache) >= limit:
            cache.clear()
        seen = cache[key] = make(*args)
    return seen


F = TypeVar("F", bound=Callable[..., Any])
KERNEL_MEMO = True  # tests turn it off to build every kernel from the dims it is given
_KERNELS: dict[tuple, Any] = {}
KERNEL_MEMO_SIZE = 1 << 16  # entries kept at most (then all are dropped): a 10^5-point grid makes ~10^4


def context_free(factory: F) -> F:
    """A plan's kernel factory `factory(d: plans.common.Dims, ...)` that does not read the context
    (`d.shape.context`, `d.cache_len`): its kernels are built once per (dims without the context, arguments)
    and shared, the same object, by the plans of every context. Only an MLA layer's plan reads the context
    (its cache insert and decode attention; the other layers' plans are built at context 0,
    `cost.step.plan_shape`), so a sweep over 70 contexts built each of its ~25 other kernels 70 times (~30 µs
    each), and the pricing's caches then compared each new object with the one before. The factory is called
    with `d.sans_context`, so a factory that did read the context would build a kernel that differs from the
    one its plan needs: tests/test_plans.py builds every plan of every model both ways and compares kernels,
    consts and ops included. Lists come back as new lists (the builders extend them)."""
    def build(d: Any, args: tuple, kw: dict) -> Any:
        made = factory(d, *args, **kw)
        return tuple(made) if isinstance(made, list) else made

    @functools.wraps(factory)
    def memo(d: Any, *args: Any, **kw: Any) -> Any:
        if not KERNEL_MEMO:
            return factory(d, *args, **kw)
        key = (factory, d.sans_context, args, tuple(kw.items()))
        made = remember(_KERNELS, key, build, d.sans_context, args, kw, limit=KERNEL_MEMO_SIZE)
        return list(made) if isinstance(made, tuple) else made
    return memo  # type: ignore[return-value]
