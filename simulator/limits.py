"""The range every number a user types must lie in: one table for CLI flags and scenario keys.

Sizes are capped at INT32_MAX = 2^31 - 1 because the kernels this tool prices index with 32-bit
integers: cuBLAS / CUTLASS take GEMM sizes m, n, k as `int`, FlashInfer's MLA decode takes
`seq_lens` as int32. A decode step with more than 2^31 token rows or cache positions is not a
configuration any of them can launch, so the cost of one would be fiction. The seed is whatever
NumPy's `SeedSequence` accepts that also fits a signed 64-bit integer.

`problem(name, value)` returns the sentence fragment that says what is wrong, or None.
"""

from __future__ import annotations

import math
from typing import Any

from simulator.errors import UserError

INT32_MAX = 2**31 - 1
# name -> (kind, low, high): ints are checked as ints, floats must also be finite
LIMITS: dict[str, tuple[type, float, float]] = {
    "tp": (int, 1, INT32_MAX),
    "batch": (int, 1, INT32_MAX),
    "tokens_per_seq": (int, 1, INT32_MAX),
    "context": (int, 0, INT32_MAX),
    "draft_tokens": (int, 0, INT32_MAX - 1),  # tokens per sequence = draft tokens + 1
    "acceptance_length": (float, 1, INT32_MAX),  # the upper bound draft tokens + 1 is checked with them
    "seed": (int, 0, 2**63 - 1),
    "expert_skew": (float, 0, 4),  # Zipf exponent of expert popularity (routing.RoutingStats)
    "draft_correlation": (float, 0, 1),
}


def flag(name: str) -> str:
    """The CLI spelling of a parameter: tokens_per_seq -> --tokens-per-seq."""
    return "--" + name.replace("_", "-")


def problem(name: str, value: Any) -> str | None:
    """What is wrong with `value` for `name` (None when it is fine), e.g. 'must be an integer in [1, ...]'."""
    kind, low, high = LIMITS[name]
    if value is None and name == "acceptance_length":
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"must be a number, not {type(value).__name__}"
    if kind is int and not isinstance(value, int):
        return f"must be an integer in [{low}, {high}]"
    if not math.isfinite(value) or not low <= value <= high:
        return f"must be {'an integer' if kind is int else 'a finite number'} in [{low}, {high}]"
    return None


def check_flags(**values: Any) -> None:
    """Raise one sentence for the first flag out of range, named as the user typed it (`--batch = 0 ...`)."""
    for name, value in values.items():
        why = problem(name, value)
        if why:
            raise UserError(f"{flag(name)} = {value!r} {why}.")
    batch, context = values.get("batch", 1), values.get("context", 0)
    tokens = values.get("tokens_per_seq", values.get("draft_tokens", 0) + 1)  # step: 1 + draft tokens
    if batch * tokens > INT32_MAX:
        raise UserError(f"--batch {batch} x {tokens} token(s) per sequence = {batch * tokens} token rows exceeds "
                        f"{INT32_MAX} (GEMM sizes are 32-bit in the kernels priced here).")
    if context + tokens > INT32_MAX:
        raise UserError(f"--context {context} + {tokens} new token(s) per sequence = {context + tokens} cache "
                        f"positions exceeds {INT32_MAX} (FlashInfer's seq_lens are int32).")
