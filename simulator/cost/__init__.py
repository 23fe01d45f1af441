"""The analytic cost model: price each kernel on a hardware profile, then schedule the plan on streams.

    pricing.price_kernel(kernel, hw) -> KernelCost      one kernel alone: fixed + max(mem, math) + comm
    collectives.choose_algorithm(op, n, P, hw)           alpha-beta all-reduce / reduce-scatter / all-gather
    timeline.schedule(plan, hw) -> Timeline              streams, gaps, PDL, shared HBM, prefetch, floor

docs/cost-model.md derives every equation and lists every constant with its source.
"""

from simulator.cost.collectives import CollectiveCost, choose_algorithm
from simulator.cost.pricing import KernelCost, price_kernel
from simulator.cost.timeline import Span, Timeline, schedule

__all__ = ["CollectiveCost", "KernelCost", "Span", "Timeline", "choose_algorithm", "price_kernel", "schedule"]
