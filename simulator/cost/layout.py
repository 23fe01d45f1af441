"""A plan laid out as the arrays the event loops read (`events.simulate`'s arguments; the loops themselves:
events.py, lockstep.py, streams.py, fastsim.py).

`plan_layout` is what no GPU constant changes: each kernel's same-stream predecessor, its cross-stream waits, its
bytes and the bytes it may load early; `plan_arrays` adds each kernel's priced terms (`pricing.kernel_terms`, its
launch gap and phase lengths alone) and the GPU's scalars. `timeline.schedule` and `timeline.makespan_us` run a loop
on `plan_arrays`; the uncertainty draws re-price the terms per draw on `launch_layout` and `plan_scalars`.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from simulator.cost.pricing import kernel_terms, prefetch_target
from simulator.hardware import HardwareProfile
from simulator.memo import remember
from simulator.plans.kernel import Kernel, Plan


def plan_arrays(plan: Plan, hw: HardwareProfile) -> tuple:
    """Price every kernel and lay the plan out as the arrays `events.simulate` reads."""
    pred, deps, nbytes, can_pf = launch_layout(plan, hw)
    priced = _priced(hw)
    terms = np.array([remember(priced, k, kernel_terms, k, hw, limit=KERNELS_PRICED_KEPT) for k in plan],
                     dtype=np.float64).reshape(len(plan), 5)
    gap_pred, fixed, math, comm, stream = terms.T.copy()
    return pred, deps, gap_pred, fixed, math, comm, nbytes, stream * 1e-6, can_pf, *plan_scalars(hw)


_TERMS: dict[HardwareProfile, dict[Kernel, tuple]] = {}  # per GPU profile: each kernel's `kernel_terms`
KERNELS_PRICED_KEPT = 1 << 16  # kernels remembered per profile at most (then all are priced afresh)


def _priced(hw: HardwareProfile) -> dict[Kernel, tuple]:
    """The kernel terms remembered for profile hw (a sweep's plans share most kernel objects: `memo.context_free`);
    a kernel's terms read only fields its equality compares. A profile holding drawn arrays is priced afresh."""
    try:
        return remember(_TERMS, hw, dict, limit=64)
    except TypeError:
        return {}


@lru_cache(maxsize=4096)
def plan_layout(plan: Plan) -> tuple:
    """What no GPU constant changes: (pred [n] the same-stream predecessor, deps [n, w] the cross-stream
    waits (-1 padded), nbytes [n], can_pf [n] the bytes each kernel may load early behind its predecessor).
    Remembered (arrays shared, never written): a sweep lays each plan out again for every draw and GPU."""
    index: dict[str, int] = {}
    last: dict[str, int] = {}
    n = len(plan)
    width = max([len(k.deps) for k in plan] + [1])
    pred, deps, nbytes, can_pf = [], [], [], []
    for i, k in enumerate(plan):
        unknown = [d for d in k.deps if d not in index]
        if k.key in index or unknown:
            raise ValueError(f"kernel {k.key!r}: duplicate key or deps on unknown/later kernels {unknown}")
        pred.append(last.get(k.stream, -1))
        deps.append([index[d] for d in k.deps] + [-1] * (width - len(k.deps)))
        nbytes.append(k.hbm_bytes)
        can_pf.append(prefetch_target(k) if pred[-1] >= 0 else 0.0)
        index[k.key] = last[k.stream] = i
    return (np.array(pred, dtype=np.int64), np.array(deps, dtype=np.int64).reshape(n, width),
            np.array(nbytes, dtype=np.float64), np.array(can_pf, dtype=np.float64))


def launch_layout(plan: Plan, hw: HardwareProfile) -> tuple:
    """`plan_layout` as the profile's kernels launch it: kernels of a set without PDL cannot start loading
    their weights before their predecessor ends, so nothing is prefetched."""
    pred, deps, nbytes, can_pf = plan_layout(plan)
    if hw.kernel_set is not None and not hw.kernel_set.pdl:
        can_pf = np.zeros_like(can_pf)
    return pred, deps, nbytes, can_pf


def plan_scalars(hw: HardwareProfile) -> tuple:
    """(gap after a cross-stream event, gap after a PDL launch, shared HBM capacity in B/µs): the arguments of
    `events.simulate` that belong to the GPU, not to a kernel."""
    return hw.launch_gap_us, hw.launch_gap_pdl_us, hw.hbm_efficiency * hw.hbm_bandwidth * 1e-6
