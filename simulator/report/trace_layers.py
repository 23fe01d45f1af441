"""Layers of a trace and their alignment with the plan (steps 3 and 4 of trace_compare.py's pipeline): one
process's kernels cut into layers at the anchor, grouped by signature, each aligned with the plan in plan
order; `best_layer` picks the layer the plan matches best."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Callable

from simulator.errors import UserError
from simulator.report.trace_patterns import Classifier
from simulator.report.trace_reader import KernelEvent, KernelTrace, by_stream, short

MAX_SIGNATURES = 20  # distinct layer shapes aligned against the plan (the most frequent ones)
MAX_LAYER_KERNELS = 5000  # a decode layer launches tens of kernels; a longer span is no layer
MAX_PROCESSES = 64  # processes (GPUs, variants) searched for the layer, the busiest first: a node has 8 GPUs

Stream = tuple[Any, Any]
Signature = tuple[tuple[Stream, tuple[str, ...]], ...]  # per stream: the labels of one layer, in order


# ============================================================================ layers


@dataclass
class LayerShape:
    """Every layer of one signature: per stream, per position, the durations and gaps over layers."""

    signature: Signature
    layers: list[list[list[KernelEvent]]]  # [layer][stream][position]

    def median(self, stream: int, pos: int, what: str) -> float | None:
        values = [_measure(layer[stream], pos, what) for layer in self.layers]
        values = [v for v in values if v is not None]
        return statistics.median(values) if values else None

    def makespan(self) -> float:
        return statistics.median(max(k.end for s in layer for k in s) - min(k.ts for s in layer for k in s)
                                 for layer in self.layers)


def _measure(kernels: list[KernelEvent], pos: int, what: str) -> float | None:
    if what == "dur":
        return kernels[pos].dur
    return kernels[pos].ts - kernels[pos - 1].end if pos > 0 else None  # the gap on the same stream


def layer_shapes(kernels: list[KernelEvent], classify: Classifier) -> list[LayerShape]:
    """One process's kernels cut into layers and grouped by signature, most frequent first.

    A layer is the time window between two cuts, every stream's kernels in it included; its streams are
    taken in the order their first kernel starts, and layers whose streams hold the same labels in that
    order are one signature whatever the stream ids: a CUDA-graph replay runs each layer's branches on
    other stream ids than the layer before. The signature names the streams of its first layer."""
    merged = sorted(kernels, key=lambda k: (k.ts, str(k.stream)))
    labels = [classify.label(k) for k in merged]
    cuts = _cuts(labels, classify)
    groups: dict[tuple[tuple[str, ...], ...], tuple[Signature, list[list[list[KernelEvent]]]]] = {}
    for lo, hi in zip(cuts, cuts[1:] + [len(merged)]):
        streams = by_stream(merged[lo:hi])
        order = sorted(streams, key=lambda s: (streams[s][0].ts, str(s)))
        sig = tuple((s, tuple(classify.label(k) for k in streams[s])) for s in order)
        groups.setdefault(tuple(labels for _, labels in sig), (sig, []))[1].append([streams[s] for s in order])
    ranked = sorted(groups.values(), key=lambda sl: -len(sl[1]))
    return [LayerShape(sig, layers) for sig, layers in ranked[:MAX_SIGNATURES]]


def _cuts(labels: list[str], classify: Classifier) -> list[int]:
    """Where layers start: each anchor, moved back over the kernels that could be plan kernels before it.

    Walking back from an anchor stops after as many such kernels as the trace shows plan kernels before
    the anchor, or at the previous anchor; kernels no pattern fits are stepped over, not counted.
    """
    cands = [classify(label) for label in labels]
    unique = {next(iter(c)) for c in set(cands) if len(c) == 1}
    if not unique:
        return [0]
    anchor = min(unique)
    before = sum(1 for j in set().union(*set(cands)) if j < anchor)
    cuts, previous = [], -1
    for i in (i for i, c in enumerate(cands) if c == frozenset({anchor})):
        cut, need = i, before
        for k in range(i - 1, previous, -1):
            if need == 0:
                break
            if any(j < anchor for j in cands[k]):
                cut, need = k, need - 1
        cuts.append(cut)
        previous = i
    return cuts


# ============================================================================ alignment


def align(shape: LayerShape, classify: Classifier) -> dict[tuple[int, int], int]:
    """(stream index, position) -> plan index: per stream, busiest first, an LCS in plan order."""
    free = list(range(len(classify.plan)))
    pairs: dict[tuple[int, int], int] = {}
    order = sorted(range(len(shape.signature)), key=lambda s: -len(shape.signature[s][1]))
    for s in order:
        labels = shape.signature[s][1]
        for pos, j in _lcs([classify(label) for label in labels], free):
            pairs[(s, pos)] = j
        free = [j for j in free if j not in pairs.values()]
    return pairs


def _lcs(cands: list[frozenset[int]], plan: list[int]) -> list[tuple[int, int]]:
    """Longest common subsequence of measured kernels and plan indices (a match: j in the candidates)."""
    n, m = len(cands), len(plan)
    table = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(n - 1, -1, -1):
        for j in range(m - 1, -1, -1):
            table[i][j] = (table[i + 1][j + 1] + 1 if plan[j] in cands[i]
                           else max(table[i + 1][j], table[i][j + 1]))
    out, i, j = [], 0, 0
    while i < n and j < m:
        if plan[j] in cands[i] and table[i][j] == table[i + 1][j + 1] + 1:
            out.append((i, plan[j]))
            i, j = i + 1, j + 1
        elif table[i + 1][j] >= table[i][j + 1]:
            i += 1
        else:
            j += 1
    return out


# ============================================================================ the best layer


class NoMatch(UserError):
    """No layer of the trace matches the engine's patterns (the caller may name a closer engine)."""


def best_layer(trace: KernelTrace, classify: Classifier, left_out: Callable[[Signature], str | None] = lambda sig: None
               ) -> tuple[LayerShape, dict[tuple[int, int], int]]:
    """Over processes and signatures: the layer the plan matches best, then the most repeated. Signatures
    `left_out` gives a reason for (a prefill or mixed layer) and spans over MAX_LAYER_KERNELS (no layer
    boundary found: the alignment is O(n x plan)) are not candidates; of a trace with more processes than
    MAX_PROCESSES (a hostile one: a node has 8 GPUs) the busiest are searched, so time stays bounded."""
    best: tuple[tuple[int, int, int], LayerShape, dict] | None = None
    pids: dict[Any, list[KernelEvent]] = {}
    for k in trace.kernels:
        pids.setdefault(k.stream[0], []).append(k)
    longest, reasons = 0, []
    for kernels in sorted(pids.values(), key=len, reverse=True)[:MAX_PROCESSES]:
        for shape in layer_shapes(kernels, classify):
            size = sum(len(labels) for _, labels in shape.signature)
            longest = max(longest, size)
            reason = left_out(shape.signature) if size <= MAX_LAYER_KERNELS else "too long"
            if reason:
                reasons.append(reason)
                continue
            pairs = align(shape, classify)
            score = (len(pairs), -(size - len(pairs)), len(shape.layers))
            if best is None or score > best[0]:
                best = (score, shape, pairs)
    if best is None and any(r != "too long" for r in reasons):
        raise UserError(f"{trace.path}: {next(r for r in reasons if r != 'too long')}, so it is not a decode step and "
                        "is not compared as one; profile decode steps only.")
    if best is None and longest > MAX_LAYER_KERNELS:
        raise UserError(f"{trace.path}: its kernels do not split into layers ({longest:,} kernels run without "
                        f"the '{classify.engine.name}' engine's layer boundary); is it a decode trace of this "
                        "model and layer type?")
    if best is None or not best[2]:
        names = sorted({k.name for k in trace.kernels})
        raise NoMatch(f"{trace.path}: none of its {len(names):,} kernel names (e.g. '{short(names[0])}') matches "
                      f"the '{classify.engine.name}' patterns of the {classify.plan.variant} plan")
    return best[1], best[2]
