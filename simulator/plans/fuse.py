"""One launch doing the work of several plan kernels, built from the kernels it merges.

vLLM 0.33.0 merges work the plans otherwise spell out kernel by kernel (docs/vllm-k3-source.md): the
specialized KDA kernel projects f_b itself, the persistent experts kernel runs FC1 and FC2, the MoE tail
finalises, all-reduces, normalises and up-projects in one launch. `fuse` takes the unfused kernels, in
order and bound to their ops, and returns one `Kernel` whose op (`Chain`) runs their ops in that order:
on one rank, or over all ranks when a part is a collective (the per-rank parts then run rank by rank).
What a part writes and a later part reads stays inside the launch (no HBM round trip, no storage
rounding) unless `keep` names it; the launch reads what no earlier part wrote, declares every part's
weights in order, and sums the parts' FLOPs and in-kernel exchanges (one Collective, one α: the phases
are pipelined inside the launch, as the source's Lamport mailboxes are).

Dimension legend: P TP degree.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from simulator.plans.kernel import Collective, Kernel, Tensor, take_window


@dataclass(frozen=True)
class Part:
    """What the chained op needs of one merged kernel: its op, where its arguments come from, its outputs."""

    op: Any
    reads: tuple[tuple[str, tuple[int, int, int] | None], ...]
    weights: int  # how many of the chain's weights, in order, are this part's
    writes: tuple[str, ...]
    consts: tuple[str, ...]
    ranks: bool  # a collective: called once with lists over ranks
    diagnostics: int
    routed: bool  # a routed-expert op: continues its output over the executor's expert chunks


class Chain:
    """The op of a fused kernel: the merged kernels' ops in order (module docstring)."""

    def __init__(self, parts: tuple[Part, ...], outer: tuple[tuple[str, Any], ...], keep: tuple[str, ...], ranks: bool):
        self.parts, self.outer, self.keep, self.ranks = parts, outer, keep, ranks
        self.__name__ = "+".join(getattr(p.op, "__name__", "op") for p in parts)

    def __eq__(self, other: object) -> bool:  # kernels built apart compare equal (memo.context_free)
        return isinstance(other, Chain) and (self.parts, self.outer, self.keep, self.ranks) == (
            other.parts, other.outer, other.keep, other.ranks)

    def __hash__(self) -> int:
        return hash((self.outer, self.keep, self.ranks))

    def __call__(self, *args: Any, only: Any = None, out: Any = None, **consts: Any) -> tuple[Any, ...]:
        outer = dict(zip(self.outer, args))
        weights = args[len(self.outer):]
        inner: dict[str, Any] = {}
        diagnostics: list[Any] = []
        for i, part in enumerate(self.parts):
            a = [self._arg(inner, outer, name, window) for name, window in part.reads]
            a += list(weights[:part.weights])
            weights = weights[part.weights:]
            kw = {k: consts[f"{i}.{k}"] for k in part.consts}
            if part.routed and only is not None:  # a streaming backend runs the experts a chunk at a time
                kw["only"] = only
            if part.routed and out is not None and part.writes[0] in self.keep:
                kw["out"] = out[self.keep.index(part.writes[0])]
            res = self._call(part, a, kw)
            for name, value in zip(part.writes, res):
                inner[name] = value
            diagnostics += list(res[len(part.writes):])
        return tuple(inner[name] for name in self.keep) + tuple(diagnostics)

    def _arg(self, inner: dict, outer: dict, name: str, window: Any) -> Any:
        if name not in inner:
            return outer[(name, window)]
        if self.ranks:
            return [take_window(v, window) for v in inner[name]]
        return take_window(inner[name], window)

    def _call(self, part: Part, a: list[Any], kw: dict[str, Any]) -> tuple[Any, ...]:
        def tup(r: Any) -> tuple[Any, ...]:
            return r if isinstance(r, tuple) else (r,)
        if part.ranks or not self.ranks:
            return tup(part.op(*a, **kw))
        per_rank = [tup(part.op(*[x[r] for x in a], **kw)) for r in range(len(a[0]))]
        return tuple(list(col) for col in zip(*per_rank))


def fuse(parts: list[Kernel], key: str, name: str, kind: str, family: str, keep: tuple[str, ...],
         source: str, **fields: Any) -> Kernel:
    """One kernel doing `parts` in order; `keep` names the outputs other kernels read (module docstring).
    `fields` set the rest (stream, deps, pdl, prefetch_bytes, note, fusions, a latency floor...)."""
    written: set[str] = set()
    outer: list[tuple[str, Any]] = []
    reads: list[Tensor] = []
    for k in parts:
        for t in k.reads:
            if t.name not in written and (t.name, t.window) not in outer:
                outer.append((t.name, t.window))
                reads.append(t)
        written |= {t.name for t in k.writes}
    last = {t.name: t for k in parts for t in k.writes}
    exchanges = [k.collective for k in parts if k.collective is not None]
    collective = (Collective(exchanges[0].op, sum(c.nbytes for c in exchanges), exchanges[0].ranks, in_kernel=True)
                  if exchanges else None)
    chain = Chain(tuple(Part(k.op, tuple((t.name, t.window) for t in k.reads), len(k.weights),
                             tuple(t.name for t in k.writes), tuple(c for c, _ in k.consts), k.scope == "ranks",
                             len(k.diagnostics), any(w.name.startswith("expert.") for w in k.weights)) for k in parts),
                  tuple(outer), keep, any(k.scope == "ranks" for k in parts))
    base = dict(reads=tuple(reads), weights=tuple(w for k in parts for w in k.weights),
                writes=tuple(last[n] for n in keep), flops=sum(k.flops for k in parts), collective=collective,
                scope="ranks" if chain.ranks else "rank", diagnostics=tuple(d for k in parts for d in k.diagnostics),
                replaces=tuple(dict.fromkeys(r for k in parts for r in (k.key,) + k.replaces)),
                fusions=tuple(dict.fromkeys(f for k in parts for f in k.fusions)),
                consts=tuple((f"{i}.{c}", v) for i, k in enumerate(parts) for c, v in k.consts))
    return Kernel(key=key, name=name, kind=kind, family=family, op=chain, source=source, **(base | fields))


def cite(kernel: Kernel, source: str, **fields: Any) -> Kernel:
    """`kernel` as the source launches it: its launching function, and any field the source sets otherwise
    (a name, a stream, PDL)."""
    return replace(kernel, source=source, **fields)
