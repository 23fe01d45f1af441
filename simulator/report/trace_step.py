"""How much of a whole decode step a trace's kernels match: every layer's plan (each layer its own: a model's
sliding-window and full-attention layers launch different kernels) and the model head, aligned with the trace.

compare-trace compares one layer in detail (the repeated layer its plan matches best). This adds the step's
coverage: the step plan is the head's embedding launches, the plan of each of the model's layers in order, and
the rest of the head; the trace's busiest process, its kernels in start order, is aligned with that plan (one
copy per step the trace holds) by the same longest common subsequence in plan order as a layer is. Each
measured kernel is matched or not; the unmatched ones are listed by name with their counts, and so are the
plan kernels no measured kernel stood for. The alignment is a table of trace x plan cells (~0.25 s and 8 B a
million): past MAX_STEP_CELLS it is not made, and the coverage says so.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from simulator.config import ModelConfig
from simulator.plans.kernel import DecodeShape, Plan
from simulator.report.trace_layers import _lcs
from simulator.report.trace_patterns import Classifier, Engine
from simulator.report.trace_reader import KernelTrace, short

MAX_STEP_CELLS = 6_000_000  # a Kimi K3 step (2,208 launches) against its plan: 4.9 M cells, ~1.2 s, ~40 MB
HEAD_FIRST = ("embed", "embed_all_reduce")  # the head's launches before the first layer


def step_plan(cfg: ModelConfig, variant: str, tp: int, shape: DecodeShape, arch: str) -> Plan:
    """The head's embedding, every layer's plan in order, the rest of the head: one step's launches."""
    from simulator.cost.step import build_plan, head_shape
    from simulator.cost.head import head_plan
    head = head_plan(cfg, tp, head_shape(shape), variant)
    layers = [k for i in range(cfg.num_layers)
              for k in build_plan(cfg, variant, tp, shape, cfg.layer_type(i), layer=i, arch=arch)]
    kernels = ([k for k in head if k.key in HEAD_FIRST] + layers + [k for k in head if k.key not in HEAD_FIRST])
    return Plan(variant, "step", tp, shape, tuple(kernels))


def step_coverage(trace: KernelTrace, plan: Plan, engine: Engine) -> dict[str, Any]:
    """Matched and unmatched kernels of the trace's busiest process against `plan` (module docstring)."""
    pids: dict[Any, list] = {}
    for k in trace.kernels:
        pids.setdefault(k.stream[0], []).append(k)
    measured = sorted(max(pids.values(), key=len), key=lambda k: k.ts) if pids else []
    steps = max(1, round(len(measured) / len(plan)))
    if not measured or len(measured) * len(plan) * steps > MAX_STEP_CELLS:
        return {"kernels": len(measured), "matched": None,
                "why": f"not aligned: {len(measured):,} kernels against {steps} x {len(plan):,} plan kernels is more "
                       f"than {MAX_STEP_CELLS:,} cells"}
    classify = Classifier(engine, Plan(plan.variant, "step", plan.tp, plan.shape, plan.kernels * steps))
    labels = [classify.label(k) for k in measured]
    pairs = dict(_lcs([classify(label) for label in labels], list(range(len(plan) * steps))))
    missed = Counter(short(k.name) for i, k in enumerate(measured) if i not in pairs)
    used = Counter(j % len(plan) for j in pairs.values())
    unused = Counter(plan.kernels[j].key for j in range(len(plan)) for _ in range(steps - used.get(j, 0)))
    return {"kernels": len(measured), "matched": len(pairs),
            "matched_pct": round(100.0 * len(pairs) / len(measured), 1),
            "steps": steps, "plan_kernels": len(plan) * steps,
            "unmatched_measured": [{"name": n, "count": c} for n, c in missed.most_common()],
            "unmatched_plan": [{"key": n, "count": c} for n, c in unused.most_common()],
            "by": "every layer's plan and the head, aligned with the busiest process's kernels in start order"}
