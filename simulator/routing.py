"""How a step's tokens spread over the routed experts: the input of U, the experts the cost model streams.

    U = E (1 - (1 - k/E)^M)                          uniform routing: M independent tokens, top-k of E each
    U = sum_e 1 - (1 - q_e)^M                        skewed: expert e in a token's top-k with probability q_e

`RoutingStats` holds the two assumptions a user states (the popularity skew and the draft tokens' correlation);
the plans' routed-expert kernels declare the U experts' weights they read (plans/moe_kernels.py).

Dimension legend: M tokens, E experts, k experts per token.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import numpy.typing as npt

from simulator.errors import UserError


@dataclass(frozen=True, slots=True)
class RoutingStats:
    """How a step's tokens spread over the experts: the input of U, the experts the cost model streams.

    skew               Zipf exponent s of expert popularity, p_e ~ rank_e^-s (0 = uniform). Measured
                       routers are heavy-tailed: AIConfigurator fits s = 1.01 to DeepSeek-V3 and 1.2 to
                       Qwen3-235B (ai-dynamo/aiconfigurator docs/POWER_LAW_DISTRIBUTION.md).
    draft_correlation  rho in [0, 1]: the share of a draft token's routing that repeats the previous
                       token of its sequence (verification of a draft reuses experts; MoE-Spec, arXiv
                       2602.16052). A B x T verify then routes like B (1 + (T - 1)(1 - rho)) free tokens.
                       No published value for Kimi K3: an assumption the user states.
    """

    skew: float = 0.0
    draft_correlation: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.skew) and 0.0 <= self.skew <= 4.0):
            raise UserError(f"--expert-skew = {self.skew} must be a number in [0, 4] (0 = uniform routing).")
        if not (math.isfinite(self.draft_correlation) and 0.0 <= self.draft_correlation <= 1.0):
            raise UserError(f"--draft-correlation = {self.draft_correlation} must be a number in [0, 1].")

    def free_tokens(self, batch: int, tokens_per_seq: int) -> float:
        """Independent routing draws of a B x T forward."""
        return batch * (1.0 + (tokens_per_seq - 1) * (1.0 - self.draft_correlation))


UNIFORM = RoutingStats()


def expected_unique_experts(tokens: float, num_experts: int, top_k: int, skew: float = 0.0) -> float:
    """Distinct experts touched by `tokens` independent tokens, each picking top_k of num_experts.

    Uniform (skew 0): U = E (1 - (1 - k/E)^M). Skewed: a token's top-k is k draws without replacement
    with probabilities p_e ~ rank^-s (a top-k of noisy scores: Gumbel top-k sampling). Expert e is in it
    with probability q_e = 1 - exp(-lam p_e), lam set so that sum q_e = k (Rosen's approximation for
    successive sampling; within 2 % of Monte Carlo for E = 896, k = 16, s = 1.01 and 1.2, M = 8..256,
    tests/test_routing.py), and U = sum_e 1 - (1 - q_e)^M."""
    if skew == 0.0:
        return num_experts * (1.0 - (1.0 - top_k / num_experts) ** tokens)
    q = inclusion_probabilities(num_experts, top_k, skew)
    return float(np.sum(1.0 - (1.0 - q) ** tokens))


@lru_cache(maxsize=256)  # 100 bisection steps over E experts: a sweep asks for the same few (E, k, s) again
def inclusion_probabilities(num_experts: int, top_k: int, skew: float) -> npt.NDArray[np.float64]:
    """q_e = 1 - exp(-lam p_e) with sum q = k, p_e ~ rank^-s: solved for lam by bisection on log lam.
    Read-only (it is shared by every caller)."""
    p = np.arange(1, num_experts + 1, dtype=np.float64) ** -skew
    p /= p.sum()
    lo, hi = math.log(top_k), math.log(1e12)
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if np.sum(-np.expm1(-math.exp(mid) * p)) < top_k:
            lo = mid
        else:
            hi = mid
    q = -np.expm1(-math.exp(0.5 * (lo + hi)) * p)
    q.flags.writeable = False
    return q
