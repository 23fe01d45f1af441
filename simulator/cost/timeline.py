"""Schedule one layer's plan on streams: launch gaps, dependencies, shared HBM bandwidth and prefetch.

Each kernel runs as phases, priced alone by `price_kernel`:
    fixed (latency) -> work (bytes S at up to eta BW, or math) -> comm (collective alpha + transfer).
Rules:
- Start:  start_i = max(end_pred + gap(pdl_i), end_dep + gap) over its same-stream predecessor and its
  cross-stream `deps` (an event wait gets the plain, non-PDL gap). The first kernel pays a gap too, the
  one from the previous layer, so `layer_us` times a layer count is a step.
- Sharing (fluid / processor sharing): latency phases use no bandwidth. Work phases in flight at once
  demand d_i = S_i / t_work_i; if sum d_i exceeds C = eta_max BW, all progress at rate C / sum d_i.
  Two 16 MB streaming kernels on two streams (GB300, C = 6.8 TB/s) therefore take 2.4 + 4.7 us,
  not 2 x (2.4 + 2.4): more than either alone, less than their sum.
- Prefetch: a kernel with `prefetch_bytes` > 0 may load min(prefetch_bytes, weight_bytes) from
  start_pred + gap_pdl until its predecessor ends (a PDL prologue: launched early, blocked before its
  dependent read). Under a collective, which uses ~no HBM bandwidth, those bytes come for free.

Speed-of-light floor (never above the estimate; tests check it on random plans):
    floor = max( B / BW,  max over streams s of [ sum_{collectives on s} alpha_min + (B_s - PF_s) / BW ] )
B: weight bytes + attention (KV cache / recurrent state) traffic of the plan at peak BW; B_s, PF_s: the
same and the declared prefetch bytes of stream s. A single-stream plan without prefetch gets the textbook
B / BW + n alpha_min (hardware.md §7.5); overlap the plan declares lowers it by what it can hide.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from simulator.cost.collectives import min_alpha_us
from simulator.cost.pricing import Bound, KernelCost, launch_gap_us, price_kernel
from simulator.hardware import HardwareProfile
from simulator.plans.kernel import Kernel, Plan

EPS = 1e-9  # µs


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


@dataclass
class _Run:
    """Mutable simulation state of one kernel (local to one `schedule` call)."""

    kernel: Kernel
    cost: KernelCost
    pred: int | None
    deps: tuple[int, ...]
    phases: list[list[float]] = field(default_factory=list)  # [remaining solo µs, demand B/µs]
    ready: float | None = None
    start: float | None = None
    end: float | None = None
    prefetch: list[float] | None = None  # [remaining µs, demand B/µs] while loading early
    prefetch_target: float = 0.0
    prefetch_start: float | None = None
    prefetch_end: float | None = None
    inputs: tuple[int, ...] = ()  # deps + same-stream predecessor: what it waits for
    can_prefetch: int = 0  # bytes it may load early (0: never prefetches)


def schedule(plan: Plan, hw: HardwareProfile) -> Timeline:
    """Place every kernel of `plan` on its stream; see the module docstring for the rules."""
    runs = _runs(plan, hw)
    _simulate(runs, hw)
    spans = tuple(_span(r, runs) for r in runs)
    label = f"{plan.variant} {plan.layer} TP{plan.tp} M={plan.shape.tokens}"
    return Timeline(label, hw.name, spans, floor_us(plan, hw))


def floor_us(plan: Plan, hw: HardwareProfile) -> float:
    """Speed-of-light floor of the plan (module docstring): bytes at peak BW plus unhidden alphas."""
    per_us = hw.hbm_bandwidth * 1e-6  # B/µs
    best = sum(_floor_bytes(k) for k in plan) / per_us
    for stream in plan.streams:
        mine = [k for k in plan if k.stream == stream]
        alpha = sum(min_alpha_us(k.collective.op, k.collective.ranks, hw) for k in mine if k.collective)
        own = sum(_floor_bytes(k) - _prefetch_target(k) for k in mine)
        best = max(best, alpha + own / per_us)
    return best


def _floor_bytes(kernel: Kernel) -> int:
    """Bytes no schedule avoids: weights, and all traffic of attention (KV cache, recurrent state)."""
    return kernel.hbm_bytes if kernel.kind == "attention" else kernel.weight_bytes


def _prefetch_target(kernel: Kernel) -> int:
    return min(kernel.prefetch_bytes, kernel.weight_bytes)


def _runs(plan: Plan, hw: HardwareProfile) -> list[_Run]:
    index: dict[str, int] = {}
    last: dict[str, int] = {}
    runs: list[_Run] = []
    for i, k in enumerate(plan):
        unknown = [d for d in k.deps if d not in index]
        if k.key in index or unknown:
            raise ValueError(f"kernel {k.key!r}: duplicate key or deps on unknown/later kernels {unknown}")
        pred, deps = last.get(k.stream), tuple(index[d] for d in k.deps)
        runs.append(_Run(k, price_kernel(k, hw), pred, deps, inputs=deps + ((pred,) if pred is not None else ()),
                         can_prefetch=_prefetch_target(k) if pred is not None else 0))
        index[k.key] = last[k.stream] = i
    return runs


def _simulate(runs: list[_Run], hw: HardwareProfile) -> None:
    """Event-driven fluid simulation: advance to the next phase end, start or prefetch start."""
    capacity = max(hw.hbm_efficiency, hw.moe_hbm_efficiency) * hw.hbm_bandwidth * 1e-6  # B/µs
    now = 0.0
    for _ in range(20 * len(runs) + 20):  # each kernel causes a handful of events
        _settle(runs, now, hw)
        if all(r.end is not None for r in runs):
            return
        jobs = [r.phases[0] for r in runs if r.phases] + [r.prefetch for r in runs if r.prefetch]
        demand = sum(j[1] for j in jobs)
        scale = min(1.0, capacity / demand) if demand > 0 else 1.0
        dt = min([j[0] / (scale if j[1] > 0 else 1.0) for j in jobs] + _waits(runs, now, hw), default=-1.0)
        if dt < 0:
            break
        for j in jobs:
            j[0] -= dt * (scale if j[1] > 0 else 1.0)
        now += dt
    raise RuntimeError("timeline did not converge: a dependency cycle or a zero-progress state")


def _settle(runs: list[_Run], now: float, hw: HardwareProfile) -> None:
    """Apply everything that happens at `now`: phases end, kernels and prefetches start."""
    changed = True
    while changed:
        changed = False
        # only unfinished kernels whose same-stream predecessor has started can change state now
        live = [r for r in runs if r.end is None and (r.pred is None or runs[r.pred].start is not None)]
        for r in live:
            changed |= _finish_phases(r, now) | _stop_prefetch(r, runs, now) | _start(r, runs, now, hw)


def _finish_phases(r: _Run, now: float) -> bool:
    if r.start is None or r.end is not None:
        return False
    while r.phases and r.phases[0][0] <= EPS:
        r.phases.pop(0)
    if not r.phases:
        r.end = now
    return not r.phases


def _stop_prefetch(r: _Run, runs: list[_Run], now: float) -> bool:
    """Prefetch ends when its bytes are in or its predecessor (the wait it hides behind) ends."""
    if r.prefetch is None:
        return False
    if r.prefetch[0] > EPS and runs[r.pred].end is None:
        return False
    r.prefetch_target -= max(0.0, r.prefetch[0]) * r.prefetch[1]  # bytes not loaded
    r.prefetch, r.prefetch_end = None, now
    return True


def _start(r: _Run, runs: list[_Run], now: float, hw: HardwareProfile) -> bool:
    if r.start is not None:
        return False
    if r.ready is None and None not in _input_ends(r, runs):
        r.ready = _ready_time(r, runs, hw)
    if r.ready is not None and r.ready <= now + EPS:  # any prefetch stopped when the predecessor ended
        r.start, r.phases = r.ready, _phases(r)
        return True
    t_pf = _prefetch_time(r, runs, hw)
    if t_pf is None or t_pf > now + EPS:
        return False
    rate = r.cost.stream_bandwidth * 1e-6  # B/µs
    r.prefetch_target = float(r.can_prefetch)
    r.prefetch, r.prefetch_start = [r.prefetch_target / rate, rate], now
    return True


def _input_ends(r: _Run, runs: list[_Run]) -> list[float | None]:
    """End times of the kernels `r` waits for (None while one still runs)."""
    return [runs[i].end for i in r.inputs]


def _ready_time(r: _Run, runs: list[_Run], hw: HardwareProfile) -> float:
    """start = max(end_pred + gap(pdl), end_dep + gap): a cross-stream event wait gets no PDL."""
    pred_end = runs[r.pred].end if r.pred is not None else 0.0
    after_pred = pred_end + launch_gap_us(r.kernel.pdl, hw)
    return max([after_pred] + [runs[d].end + hw.launch_gap_us for d in r.deps])


def _prefetch_time(r: _Run, runs: list[_Run], hw: HardwareProfile) -> float | None:
    """When early loading may begin: the predecessor runs, cross-stream deps are done; None if never."""
    if r.prefetch_start is not None or r.can_prefetch <= 0:
        return None
    pred = runs[r.pred]
    if pred.start is None or pred.end is not None or any(runs[d].end is None for d in r.deps):
        return None
    return max([pred.start + hw.launch_gap_pdl_us] + [runs[d].end + hw.launch_gap_us for d in r.deps])


def _waits(runs: list[_Run], now: float, hw: HardwareProfile) -> list[float]:
    """Time until each pending kernel start or prefetch start that lies in the future."""
    pending = [r for r in runs if r.start is None and (r.pred is None or runs[r.pred].start is not None)]
    times = [r.ready for r in pending if r.ready is not None]
    times += [t for r in pending if (t := _prefetch_time(r, runs, hw)) is not None]
    return [t - now for t in times if t > now + EPS]


def _phases(r: _Run) -> list[list[float]]:
    """fixed -> work (bytes left after prefetch, or math) -> comm, each [solo µs, demand B/µs]."""
    c = r.cost
    left = max(0.0, c.bytes - r.prefetch_target)
    work = max(left / c.stream_bandwidth * 1e6, c.math_us)
    phases = [[c.fixed_us, 0.0], [work, left / work if work > 0 else 0.0], [c.comm_us, 0.0]]
    return [p for p in phases if p[0] > EPS]


def _span(r: _Run, runs: list[_Run]) -> Span:
    k = r.kernel
    assert r.start is not None and r.end is not None
    inputs_end = max([0.0] + [end for end in _input_ends(r, runs) if end is not None])
    return Span(k.key, k.name, k.stream, k.kind, r.start, r.end, r.start - inputs_end,
                r.prefetch_start, r.prefetch_end, r.prefetch_target if r.prefetch_start is not None else 0.0,
                r.cost)
