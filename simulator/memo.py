"""A bounded memo: values kept in a dict by key, every one forgotten once the dict holds `limit` of them.

The cost model and the plan builders remember what a sweep asks for again and again (a kernel's priced terms,
its drawn terms, a context-free kernel), in dicts that would otherwise grow with the grid. Forgetting all at
once keeps the bookkeeping to one length check; a sweep's neighbouring points refill what they share.
"""

from __future__ import annotations

from typing import Any, Callable, Hashable


def remember(cache: dict, key: Hashable, make: Callable[..., Any], *args: Any, limit: int) -> Any:
    """cache[key], made by make(*args) and kept when it is not there (made values must not be None)."""
    seen = cache.get(key)
    if seen is None:
        if len(cache) >= limit:
            cache.clear()
        seen = cache[key] = make(*args)
    return seen
