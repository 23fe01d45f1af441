"""Schedule one layer's plan on streams: launch gaps, dependencies, shared HBM bandwidth and prefetch.

Each kernel runs as phases, priced alone by `price_kernel`:
    fixed (latency) -> work (bytes S at up to eta BW, or math) -> comm (collective alpha + transfer).
Rules:
- Start:  start_i = max(end_pred + gap(pdl_i), end_dep + gap) over its same-stream predecessor and its
  cross-stream `deps` (an event wait gets the plain, non-PDL gap). The first kernel pays a gap too, the
  one from the previous layer, so `layer_us` times a layer count is a step.
- Sharing (fluid / processor sharing): latency phases use no bandwidth. Work phases in flight at once
  demand d_i = S_i / t_work_i; if sum d_i exceeds C = eta BW, all progress at rate C / sum d_i.
  Two 16 MB streaming kernels on two streams (GB300, C = 6.08 TB/s) therefore take 2.6 + 5.3 us,
  not 2 x (2.6 + 2.6): more than either alone, less than their sum.
- Prefetch: a kernel with `prefetch_bytes` > 0 may load min(prefetch_bytes, weight_bytes) from
  start_pred + gap_pdl until its predecessor ends (a PDL prologue: launched early, blocked before its
  dependent read). Under a collective, which uses ~no HBM bandwidth, those bytes come for free.

The rules run as an event loop, in four forms held equal to the bit (events, fastsim, lockstep, streams):
cost/events.py's docstring is the one description of that loop; cost/layout.py lays a plan out as its arrays.

Speed-of-light floor (never above the estimate; tests check it on random plans):
    floor = max( B / BW,  max over streams s of [ sum_{collectives on s} alpha_min + (B_s - PF_s) / BW ] )
B: weight bytes + attention (KV cache / recurrent state) traffic of the plan at peak BW; B_s, PF_s: the
same and the declared prefetch bytes of stream s. A single-stream plan without prefetch gets the textbook
B / BW + n alpha_min (sources.md §7.5); overlap the plan declares lowers it by what it can hide.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from simulator import attention
from simulator.cost.collectives import min_alpha_us
from simulator.cost.events import simulate
from simulator.cost.laws import law_keys
from simulator.cost.layout import plan_arrays
from simulator.cost.lockstep import simulate_plans
from simulator.cost.pricing import Bound, KernelCost, prefetch_target, price_kernel
from simulator.hardware import HardwareProfile
from simulator.plans.kernel import Kernel, Plan


@dataclass(frozen=True, slots=True)
class Span:
    """One kernel placed on the timeline. `cost` is its price alone; the span may be longer (sharing)."""

    key: str
    name: str
    stream: str
    kind: str
    start_us: float
    end_us: float
    launch_us: float  # idle gap paid between its last input and its start
    prefetch_start_us: float | None  # when early weight loading began, if it did
    prefetch_end_us: float | None
    prefetched_bytes: float
    cost: KernelCost

    @property
    def duration_us(self) -> float:
        return self.end_us - self.start_us

    @property
    def bytes(self) -> int:
        return self.cost.bytes

    @property
    def flops(self) -> int:
        return self.cost.flops

    @property
    def bound(self) -> Bound:
        return self.cost.bound


@dataclass(frozen=True)
class Timeline:
    """A scheduled layer: spans in launch order, the makespan and its speed-of-light floor."""

    label: str
    hardware: str
    spans: tuple[Span, ...]
    floor_us: float

    @property
    def layer_us(self) -> float:
        return max((s.end_us for s in self.spans), default=0.0)

    @property
    def kernel_count(self) -> int:
        return len(self.spans)

    @property
    def streams(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(s.stream for s in self.spans))

    @property
    def hbm_bytes(self) -> int:
        return sum(s.bytes for s in self.spans)

    def span(self, key: str) -> Span:
        for s in self.spans:
            if s.key == key:
                return s
        raise KeyError(key)


def _name(kernel: Kernel, hw: HardwareProfile) -> str:
    """The kernel's name under the GPU's implementation set: an attention kernel priced by a measured
    implementation takes that implementation's name (FlashMLA's on an H200 priced with vLLM's kernels)."""
    if hw.kernel_set is None or kernel.family not in attention.KINDS:
        return kernel.name
    return attention.kernel_name(kernel, tuple(key.impl for key in law_keys(kernel, hw.kernel_set)))


Loop = Callable[..., tuple]  # events.simulate, or fastsim.simulate (the same loop compiled): same arguments, result


def schedule(plan: Plan, hw: HardwareProfile, loop: Loop = simulate) -> Timeline:
    """Place every kernel of `plan` on its stream; see the module docstring for the rules. `loop` runs the
    events: the plain one by default, `fastsim.simulate` where thousands of plans amortise Numba's load."""
    costs = [price_kernel(k, hw) for k in plan]
    arrays = plan_arrays(plan, hw)
    start, end, pf_start, pf_end, pf_bytes = loop(*arrays)
    spans, pred, deps = [], arrays[0], arrays[1]  # each kernel's same-stream predecessor, other-stream deps (-1: none)
    for i, (k, c) in enumerate(zip(plan, costs)):
        inputs_end = max([0.0] + [end[j] for j in (pred[i], *deps[i]) if j >= 0])
        prefetched = pf_start[i] >= 0
        spans.append(Span(k.key, _name(k, hw), k.stream, k.kind, float(start[i]), float(end[i]),
                          float(start[i] - inputs_end), float(pf_start[i]) if prefetched else None,
                          float(pf_end[i]) if prefetched else None, float(pf_bytes[i]) if prefetched else 0.0, c))
    label = f"{plan.variant} {plan.layer} TP{plan.tp} M={plan.shape.tokens}"
    return Timeline(label, hw.name, tuple(spans), floor_us(plan, hw))


@dataclass(frozen=True)
class Makespan:
    """Just the layer time of a plan on a GPU, without building spans, by one event loop. A plain number per
    (plan, GPU), so `estimate_step` remembers it (unlike the uncertainty draws, which also price plans).
    `draws` is the loop that schedules plans under an interval's draws (`uncertainty.schedule_plans`):
    lockstep's NumPy by default, the compiled rows loop in `fastsim.makespan_us`."""

    loop: Loop = simulate
    draws: Callable[..., list] = simulate_plans

    def __call__(self, plan: Plan, hw: HardwareProfile) -> float:
        return float(self.loop(*plan_arrays(plan, hw))[1].max())


makespan_us = Makespan()  # the plain loop: ~2 ms a layer, no compiler to load


def floor_us(plan: Plan, hw: HardwareProfile) -> float:
    """Speed-of-light floor of the plan (module docstring): bytes at peak BW plus unhidden alphas."""
    per_us = hw.hbm_bandwidth * 1e-6  # B/µs
    best = sum(_floor_bytes(k) for k in plan) / per_us
    for stream in plan.streams:
        mine = [k for k in plan if k.stream == stream]
        alpha = sum(min_alpha_us(k.collective.op, k.collective.ranks, hw) for k in mine if k.collective)
        own = sum(_floor_bytes(k) - prefetch_target(k) for k in mine)
        best = max(best, alpha + own / per_us)
    return best


def _floor_bytes(kernel: Kernel) -> int:
    """Bytes no schedule avoids: weights, and all traffic of attention (KV cache, recurrent state)."""
    return kernel.hbm_bytes if kernel.kind == "attention" else kernel.weight_bytes
