"""The routed-expert replacements: the ops of ops/experts.py computed over packed experts, streamed.

Two things the NumPy forms do not do, both for memory and speed at full size (a batch-64 K3 layer touches
442 experts, 7.8 GB packed):
- stream: each op takes `only` and `out`, so that the executor can run the touched experts a chunk at a
  time (`LayerWeights.stream_experts`): a call runs the groups of the experts in `only` and continues `out`,
  what the call over the chunks before returned. The groups run in expert order either way, so the chunked
  calls compute the single call's result bit for bit (tests/test_execute_streaming.py);
- all ranks at once: `op.over_ranks` takes one list per argument, rank by rank, and puts every rank's
  groups into one compiled call (`packed.grouped_matmul`) where the experts are `PackedExperts`.
`run_streamed` is the executor's loop over the chunks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Collection, Iterable

import numpy as np
import numpy.typing as npt

from simulator.config import ModelConfig
from simulator.dtypes import Array
from simulator.fast import kernels
from simulator.fast.packed import MXFP4Weight, grouped_matmul
from simulator.ops.experts import ExpertFn, _groups, bias_rows, glu_product
from simulator.weights import Packed


@dataclass(frozen=True, eq=False)
class PackedExperts:
    """The ExpertFn of rank `rank` of `tp` over packed experts: e -> its shards (`shards`: "col", "row" or "full"
    per part) of expert e's parts `names`, `part(e, name)` the whole part (LayerWeights.expert_part). What the
    executor hands the routed-expert ops: their all-ranks forms see every rank's shard of the same parts and
    build all ranks' weight table from the whole parts (`grouped_matmul`), without P shard objects an expert."""

    part: Callable[[int, str], Packed]
    names: tuple[str, ...]
    shards: tuple[str, ...]
    rank: int = 0
    tp: int = 1

    def whole(self, e: int) -> tuple[MXFP4Weight, ...]:
        return tuple(MXFP4Weight(*self.part(e, name)) for name in self.names)

    def __call__(self, e: int) -> tuple[MXFP4Weight, ...]:
        return tuple(w.shard(how, self.rank, self.tp) for w, how in zip(self.whole(e), self.shards))


# ===================================================================== the replacements, one rank
def expert_fc1(z: Array, topk_idx: npt.NDArray[np.int64], expert: ExpertFn, *bias: Array, cfg: ModelConfig,
               only: Collection[int] | None = None, out: Array | None = None) -> Array:
    """`ops.experts.expert_fc1`, streamable.   [M, Din] -> [M, k, F/P]"""
    return expert_fc1_ranks([z], [topk_idx], [expert], *[[b] for b in bias], cfg=cfg, only=only, outs=[out])[0]


def expert_fc2(h: Array, topk_idx: npt.NDArray[np.int64], expert: ExpertFn, *bias: Array,
               only: Collection[int] | None = None, out: Array | None = None) -> Array:
    """`ops.experts.expert_fc2`, streamable.   [M, k, F/P] -> [M, k, Din]"""
    return expert_fc2_ranks([h], [topk_idx], [expert], *[[b] for b in bias], only=only, outs=[out])[0]


def expert_fc2_finalize(h: Array, topk_idx: npt.NDArray[np.int64], topk_weight: Array, expert: ExpertFn,
                        *bias: Array, only: Collection[int] | None = None, out: Array | None = None) -> Array:
    """`ops.experts.expert_fc2_finalize`, streamable: the adds into a token's row run in expert order
    (`kernels.scale_add_rows`, sequential), so chunked calls add in the single call's order.
    [M, k, F/P] -> [M, Din]"""
    return expert_fc2_finalize_ranks([h], [topk_idx], [topk_weight], [expert], *[[b] for b in bias], only=only,
                                     outs=[out])[0]


# ===================================================================== the grouped ops on all ranks at once
# The executor calls a grouped op's `over_ranks` form (when it has one) with one list per argument, rank by
# rank: every rank's groups go into one compiled call (`packed.grouped_matmul`), and each rank's output
# is what the op computes on that rank alone, bit for bit (each output element is one dot product,
# whatever was computed beside it; tests/test_execute_streaming.py). A row shard's rows are then read
# whole: rank r's slice of a down-projection row is the 96 bytes after rank r - 1's.
def expert_fc1_ranks(zs: list[Array], topk_idx: list[npt.NDArray[np.int64]], experts: list[ExpertFn],
                     *bias: list[Array], cfg: ModelConfig, only: Collection[int] | None = None,
                     outs: list[Array | None] | None = None) -> list[Array]:
    """`expert_fc1` on every rank: P x [M, Din] -> P x [M, k, F/P]; `bias`: P x [E, 2F/P] when the model has it."""
    groups = list(_groups(topk_idx[0], only))
    rows, slots = (_cat(groups, 1), _cat(groups, 2)) if groups else (None, None)
    gu = _products_over_ranks(zs, [(e, r) for e, r, _ in groups], experts) if groups else []
    if bias and groups:
        gu = gu + np.stack([bias_rows(b, groups, gu.dtype) for b in bias[0]])
    hs = glu_product(gu, cfg) if groups else []  # [P, rows of all groups, F/P]

    def write(out: Array, h: Array) -> None:
        out[rows, slots] = h
    return _continue(outs, len(zs), hs, lambda h: topk_idx[0].shape + (h.shape[1],), zs[0].dtype, write)


def expert_fc2_ranks(hs: list[Array], topk_idx: list[npt.NDArray[np.int64]], experts: list[ExpertFn],
                     *bias: list[Array], only: Collection[int] | None = None,
                     outs: list[Array | None] | None = None) -> list[Array]:
    """`expert_fc2` on every rank: P x [M, k, F/P] -> P x [M, k, Din]."""
    def write(out: Array, product: tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], Array]) -> None:
        rows, slots, y = product
        out[rows, slots] = y
    return _continue(outs, len(hs), _down_products(hs, topk_idx[0], experts, only, *bias),
                     lambda p: topk_idx[0].shape + (p[2].shape[1],), hs[0].dtype, write)


def expert_fc2_finalize_ranks(hs: list[Array], topk_idx: list[npt.NDArray[np.int64]], topk_weight: list[Array],
                              experts: list[ExpertFn], *bias: list[Array], only: Collection[int] | None = None,
                              outs: list[Array | None] | None = None) -> list[Array]:
    """`expert_fc2_finalize` on every rank: P x [M, k, F/P] -> P x [M, Din]."""
    products = [p + (w,) for p, w in zip(_down_products(hs, topk_idx[0], experts, only, *bias), topk_weight)]

    def write(out: Array, product: tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], Array, Array]) -> None:
        rows, slots, y, weight = product
        kernels.scale_add_rows(out, rows, weight[rows, slots], y)
    return _continue(outs, len(hs), products, lambda p: (topk_idx[0].shape[0], p[2].shape[1]), hs[0].dtype, write)


def _continue(outs: list[Array | None] | None, ranks: int, results: list[Any], shape: Callable[[Any], tuple[int, ...]],
              dtype: np.dtype, write: Callable[[Array, Any], None]) -> list[Array]:
    """Each rank's output continued with its result of this chunk (`write`), started as zeros of `shape` on the
    rank's first chunk; the outputs as they were when no group of the chunk was selected (`results` empty)."""
    outs = list(outs or [None] * ranks)
    for r, result in enumerate(results):
        if outs[r] is None:
            outs[r] = np.zeros(shape(result), dtype=dtype)
        write(outs[r], result)
    return outs


def _down_products(hs: list[Array], topk_idx: npt.NDArray[np.int64], experts: list[ExpertFn],
                   only: Collection[int] | None, *bias: list[Array],
                   ) -> list[tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], Array]]:
    """Per rank (token rows, slots, h[rows, slots] @ W_down of each row's expert (+ its bias row)), group after
    group; [] when no selected expert is in `only`."""
    groups = list(_groups(topk_idx, only))
    if not groups:
        return []
    rows, slots, k = _cat(groups, 1), _cat(groups, 2), topk_idx.shape[1]
    ys = _products_over_ranks([h.reshape(-1, h.shape[-1]) for h in hs], [(e, r * k + s) for e, r, s in groups], experts)
    if bias:
        ys = [y + bias_rows(b, groups, y.dtype) for y, b in zip(ys, bias[0])]
    return [(rows, slots, y) for y in ys]


expert_fc1.over_ranks = expert_fc1_ranks  # type: ignore[attr-defined]
expert_fc2.over_ranks = expert_fc2_ranks  # type: ignore[attr-defined]
expert_fc2_finalize.over_ranks = expert_fc2_finalize_ranks  # type: ignore[attr-defined]


def _products_over_ranks(xs: list[Array], groups: list[tuple[int, npt.NDArray[np.int64]]],
                         experts: list[ExpertFn]) -> Array:
    """For every rank's (x, expert): x[rows] @ [W_1 | ... | W_p] for each group (e, rows), (W_1, ..., W_p) =
    expert(e), stacked group after group: [P, rows of all groups, N]. One compiled call over all ranks where
    they are the `PackedExperts` shards of the same parts, rank by rank, and `grouped_matmul` applies; else
    one per rank where it applies; else group by group."""
    first = experts[0]
    if all(isinstance(f, PackedExperts) and (f.part, f.names, f.shards, f.rank, f.tp) ==
           (first.part, first.names, first.shards, r, len(experts)) for r, f in enumerate(experts)):
        y = grouped_matmul(xs, [(rows, first.whole(e)) for e, rows in groups], first.shards)
        if y is not None:
            return y
    return np.stack([_products(x, [(rows, expert(e)) for e, rows in groups]) for x, expert in zip(xs, experts)])


def _products(x: Array, groups: list[tuple[npt.NDArray[np.int64], tuple[Array, ...]]]) -> Array:
    """x[rows] @ [W_1 | ... | W_p] for each group (rows, (W_1, ..., W_p)), stacked group after group."""
    y = grouped_matmul([x], groups)
    if y is not None:
        return y[0]
    return np.concatenate([np.concatenate([x[rows] @ w for w in parts], axis=1) for rows, parts in groups])


def _cat(groups: list[tuple[int, npt.NDArray[np.int64], npt.NDArray[np.int64]]], i: int) -> npt.NDArray[np.int64]:
    """The token rows (i = 1) or slots (i = 2) of all groups, group after group."""
    return np.concatenate([g[i] for g in groups])


def run_streamed(op: Callable[..., Any], args: list[list[Any]], consts: dict[str, Any],
                 chunks: Iterable[list[int]]) -> list[Any]:
    """A routed-expert op (one of the above) on every rank, expert-major: for each chunk of the touched experts
    (`LayerWeights.stream_experts`, which draws the chunk's parts once, on all cores) every rank runs its groups
    of the chunk before the next chunk is drawn. Each rank continues its own output (`only` / `out`), so the
    result is one call per rank's, bit for bit, while memory holds one chunk of experts, not all.
    args: per rank, the op's positional arguments."""
    outs: list[Any] = [None] * len(args)
    over_ranks = getattr(op, "over_ranks", None)
    for chunk in chunks:
        if over_ranks is not None:
            outs = over_ranks(*[list(col) for col in zip(*args)], **consts, only=chunk, outs=outs)
        else:
            outs = [op(*a, **consts, only=chunk, out=out) for a, out in zip(args, outs)]
    return outs
