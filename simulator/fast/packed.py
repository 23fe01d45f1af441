"""Packed weights the fast backend hands the ops: `x @ W` reads the held bytes, no float copy is made.

    MXFP4Weight     a routed expert part (or its TP shard) as MXFP4 codes + E8M0 scale bits of W^T; `x @ W`
                    runs `kernels.mxfp4_matmul` (0.53 B a weight), or in float64 `mxfp4_reference_matmul`
                    for the reference (`form="reference"`); `np.asarray(W)` dequantizes
    BF16Weight      a dense weight as its bf16 bits, in column blocks; `x @ W` runs `kernels.bf16_matmul`
                    (2 B a weight read once) for the skinny decode GEMM; anything else gets the widened array
    grouped_matmul  every (expert, rank, token rows) of a streamed chunk in one compiled call
                    (`kernels.mxfp4_grouped`): what the routed-expert replacements (fast/experts.py) call

The ops in simulator/ops are written for float arrays and multiply with `x @ w`, so they run unchanged on
these. Dimension legend: M tokens, K input width, N output width, P TP ranks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import ml_dtypes
import numpy as np
import numpy.typing as npt

from simulator.dtypes import MX_BLOCK, MXFP4, Array
from simulator.fast import kernels
from simulator.weights import widen


@dataclass(frozen=True)
class MXFP4Weight:
    """Rows k0 .. k0+K-1 of a weight W [K_full, N] held as its packed transpose: E2M1 codes [N, K_full/2]
    and E8M0 scale bits [N, K_full/32], blocks along K. A TP shard is a view: a column shard keeps rows
    of the codes, a row shard moves k0 (on or off the 32-blocks). `np.asarray(W)` dequantizes."""

    codes: npt.NDArray[np.uint8]
    scale_bits: npt.NDArray[np.uint8]
    k0: int = 0
    k: int | None = None  # rows of W; None: all K_full
    form: Literal["fused", "reference"] = "fused"
    __array_ufunc__ = None  # NumPy then hands `x @ W` to __rmatmul__ instead of converting W

    @property
    def shape(self) -> tuple[int, int]:
        return (2 * self.codes.shape[1] if self.k is None else self.k, self.codes.shape[0])

    def shard(self, how: str, rank: int, tp: int) -> MXFP4Weight:
        """Rank r's column ("col": N/P outputs), row ("row": K/P inputs) or whole ("full") shard, as a view."""
        (k, n), cls = self.shape, type(self)
        if how == "col":
            rows = slice(rank * (n // tp), (rank + 1) * (n // tp))
            return cls(self.codes[rows], self.scale_bits[rows], self.k0, self.k, self.form)
        if how == "row":
            return cls(self.codes, self.scale_bits, self.k0 + rank * (k // tp), k // tp, self.form)
        return self

    def _blocks(self) -> MXFP4 | None:
        """W^T as whole 32-blocks (a view), or None when k0 or K falls inside a block."""
        k = self.shape[0]
        if self.k0 % MX_BLOCK or k % MX_BLOCK:
            return None
        b0, b1 = self.k0 // MX_BLOCK, (self.k0 + k) // MX_BLOCK
        return MXFP4(self.codes[:, b0 * MX_BLOCK // 2:b1 * MX_BLOCK // 2],
                     self.scale_bits[:, b0:b1].view(ml_dtypes.float8_e8m0fnu), (self.codes.shape[0], k))

    def __rmatmul__(self, x: Array) -> Array:
        x, blocks = np.asarray(x), self._blocks()
        if self.form == "reference":
            return mxfp4_weight_reference(x, self) if blocks is not None else x @ np.asarray(self, x.dtype)
        if blocks is not None:
            return kernels.mxfp4_matmul(x, blocks.packed, blocks.scales.view(np.uint8))
        return kernels.mxfp4_matmul_slice(x, self.codes, self.scale_bits, self.k0)

    def __array__(self, dtype: type | None = None, copy: bool | None = None) -> Array:
        full = kernels.mxfp4_dequantize_t(self.codes, self.scale_bits, dtype or np.float32)  # [K_full, N]
        return full[self.k0:self.k0 + self.shape[0]]

    def packed_rows(self) -> tuple[int, int, int, int, int] | None:
        """Where `kernels.mxfp4_grouped` finds W^T's rows: (address of the first code byte, code row stride,
        address of the first scale byte, scale row stride, code bytes per row); None when k0 or K falls
        inside a 32-block, the form is the reference, or a row is not contiguous."""
        k = self.shape[0]
        if self.k0 % MX_BLOCK or k % MX_BLOCK or self.form != "fused" or self.codes.strides[1] != 1 \
                or self.scale_bits.strides[1] != 1:
            return None
        codes, scales = self.codes.__array_interface__["data"][0], self.scale_bits.__array_interface__["data"][0]
        return (codes + self.k0 // 2, self.codes.strides[0], scales + self.k0 // MX_BLOCK, self.scale_bits.strides[0],
                k // 2)


@dataclass(frozen=True)
class BF16Weight:
    """A bf16 weight [K, N] held as the 2-byte bits of its column blocks (views of the held weights: a
    packed projection is its parts side by side, never copied together) that stands for a float array of
    `dtype`: `x @ W` reads the bits once (`kernels.bf16_matmul`, per block) for the skinny decode GEMM, where
    widening first would write and re-read 4 or 8 bytes a weight; anything else (`reshape`, ufuncs,
    `np.asarray`) gets the widened array."""

    blocks: tuple[npt.NDArray[np.uint16], ...]  # [K, N_i] each, sum N_i = N
    dtype: np.dtype
    form: Literal["fused", "reference"] = "fused"
    SKINNY = 32  # token rows up to which reading bf16 beats widening + BLAS on this CPU (compute-bound above)

    @property
    def shape(self) -> tuple[int, int]:
        return (self.blocks[0].shape[0], sum(b.shape[1] for b in self.blocks))

    @property
    def ndim(self) -> int:
        return 2

    def __array__(self, dtype: type | None = None, copy: bool | None = None) -> Array:
        return np.concatenate([widen(b.view(ml_dtypes.bfloat16), dtype or self.dtype) for b in self.blocks], axis=1)

    def astype(self, dtype: type, copy: bool = True) -> Array:
        return np.asarray(self, dtype)

    def reshape(self, *shape: int) -> Array:
        return np.asarray(self).reshape(*shape)

    def __array_ufunc__(self, ufunc: np.ufunc, method: str, *inputs: object, **kwargs: object) -> object:
        x = inputs[0]
        if ufunc is np.matmul and method == "__call__" and inputs[1] is self and not kwargs:
            x = np.asarray(x)
            if self.form == "reference" and x.ndim == 2:
                return np.concatenate([bf16_linear_chunked(x, b) for b in self.blocks], axis=1)
            if x.ndim == 2 and x.shape[0] <= self.SKINNY and x.dtype == self.dtype:
                return np.concatenate([kernels.bf16_matmul(x, b) for b in self.blocks], axis=1)
        return getattr(ufunc, method)(*(np.asarray(i) if isinstance(i, BF16Weight) else i for i in inputs), **kwargs)


GROUPED_TILE = 32  # rows of W^T (output columns) per work item of `grouped_matmul`: 57 KB of a 3584-wide part


def grouped_matmul(xs: list[Array], groups: list[tuple[npt.NDArray[np.int64], tuple[MXFP4Weight, ...]]],
                   shards: tuple[str, ...] | None = None) -> Array | None:
    """For every rank r < P = len(xs) and every group (rows, (W_1, ..., W_p)): xs[r][rows] @ [W_1^r | ... | W_p^r],
    W^r rank r's shard of W (`MXFP4Weight.shard`; `shards` names each part's, all "full" when None), stacked
    group after group: [P, sum of len(rows), sum of the shards' N]. Every group's parts have the same shapes.

    One compiled call over all of them on all cores (`kernels.mxfp4_grouped`, work items of GROUPED_TILE output
    columns, listed by `kernels.tiles`). The weight table is arithmetic on the whole `packed_rows`: Python
    works per whole weight, not per shard or tile (batch 1, TP16: 48 weights, not 768 shard objects, and
    31,744 items never sorted). Items go expert by expert, part, tile, then rank, so that the row shards' slices of the
    same rows (adjacent in memory) are read together. Only the input rows the groups use are permuted, and
    once for the ranks whose rows are rank 0's bit for bit (FC1's input, the replicated latent activation):
    at batch 64 a chunk of 21 experts reads ~30 rows, 16 x 30 x 14 KB = 6.9 MB to permute, 9 ms with the
    concatenation; one rank's with the comparisons, 0.7 ms. The permuted rows go row by row, a row's ranks side
    by side: rank-major, the 16 ranks' x of one expert sat 16 rows (6 KB) apart, a multiple of 2 KB that put
    them in a few L1 sets, and FC2 at batch 1 ran 10.5 instead of 16 GB/s.

    None where it does not apply, and the caller multiplies group by group: a host without AVX-512
    (`kernels.mxfp4_matmul` then decodes into scratch), x neither float32 nor float64, or a weight not a
    fused `MXFP4Weight` on whole 32-blocks (a shard's included)."""
    dtype = xs[0].dtype
    if not groups or dtype not in (np.float32, np.float64) or not kernels.has_avx512():
        return None
    ranks, count = len(xs), len(groups[0][1])
    shards = shards or ("full",) * count
    weights = [w for _, parts in groups for w in parts]
    if not all(isinstance(w, MXFP4Weight) for w in weights) or any(len(parts) != count for _, parts in groups):
        return None
    rows = [w.packed_rows() for w in weights]
    if None in rows or any(w.shape != weights[i % count].shape for i, w in enumerate(weights)):
        return None
    whole = np.array(rows, np.int64).reshape(len(groups), count, 5)
    table, widths = [], []
    for p, how in enumerate(shards):
        shard = _shard_rows(whole[:, p], weights[p].shape, how, ranks)
        if shard is None or shard[1][0] != xs[0].shape[1]:
            return None
        table.append(shard[0])
        widths.append(shard[1][1])
    lengths = np.array([len(r) for r, _ in groups])
    used, tokens = np.unique(np.concatenate([r for r, _ in groups]), return_inverse=True)
    blocks = xs if len(used) == len(xs[0]) else [x[used] for x in xs]  # every row (batch 1): no gathers
    bits = [b.view(f"u{b.itemsize}") for b in blocks]
    shared = np.array([r > 0 and np.array_equal(b, bits[0]) for r, b in enumerate(bits)])  # replicated
    kept = [b for b, s in zip(blocks, shared) if not s]  # [used rows, K] each
    x = kernels.permute_x(np.stack(kept, axis=1).reshape(-1, kept[0].shape[1]))  # row-major: a row's blocks together
    block = np.where(shared, 0, np.cumsum(~shared) - 1)  # each rank's block of x
    tokens = (tokens[None, :] * len(kept) + block[:, None]).ravel()  # y's rows: rank, group, row
    y = kernels.mxfp4_grouped(x, tokens, np.stack(table, axis=1).reshape(-1, 5),
                              kernels.tiles(lengths, np.array(widths), ranks, GROUPED_TILE), sum(widths))
    return y.reshape(ranks, -1, y.shape[1])


def _shard_rows(whole: npt.NDArray[np.int64], shape: tuple[int, int], how: str, tp: int,
                ) -> tuple[npt.NDArray[np.int64], tuple[int, int]] | None:
    """Every rank's `packed_rows` of its `how` shard (`MXFP4Weight.shard`) of weights [K, N] whose whole rows
    are `whole` [G, 5], and the shards' shape: [G, tp, 5]; None when a row shard falls inside a 32-block."""
    (k, n), r = shape, np.arange(tp)
    rows = np.repeat(whole[:, None], tp, axis=1)
    if how == "col":  # W^T rows N/P r ..: the codes' and the scales' addresses move r N/P row strides
        rows[..., 0] += r * (n // tp) * whole[:, None, 1]
        rows[..., 2] += r * (n // tp) * whole[:, None, 3]
        return rows, (k, n // tp)
    if how == "row":  # K rows K/P r ..: each W^T row's bytes K/P r / 2 .. and scales K/P r / 32 ..
        if (k // tp) % MX_BLOCK:
            return None
        rows[..., 0] += r * (k // tp) // 2
        rows[..., 2] += r * (k // tp) // MX_BLOCK
        rows[..., 4] = k // tp // 2
        return rows, (k // tp, n)
    return rows, (k, n)


REFERENCE_CHUNK_BYTES = 8 << 20


def bf16_linear_chunked(x: Array, bits: npt.NDArray[np.uint16]) -> Array:
    """The reference GEMM on a bf16 weight, in float64: y = sum_c x[:, c] @ float64(W[c, :]) over K-chunks
    of at most 8 MB in float64, so no full float64 copy is made (the 7168 x 33792 dense FFN weight would
    be 1.9 GB).   [M, K] -> [M, N] float64"""
    k, n = bits.shape
    rows = max(1, REFERENCE_CHUNK_BYTES // (8 * n))
    x64 = x.astype(np.float64)
    y = np.zeros((x.shape[0], n))
    for c0 in range(0, k, rows):
        y += x64[:, c0:c0 + rows] @ widen(bits[c0:c0 + rows].view(ml_dtypes.bfloat16), np.float64)
    return y


def mxfp4_weight_reference(x: Array, w: MXFP4Weight) -> Array:
    """The reference form on a packed weight, in float64 (`kernels.mxfp4_reference_matmul`): each row of W^T
    decoded on its own into exactly its float64 weights (no float copy of W in memory: a 3584 x 3072 expert
    part is 88 MB in float64), then one dot per token row; the same bits for a row alone or among others,
    whatever the thread count. No BLAS: a GEMV split over OpenBLAS threads contended with the weight store's
    and Numba's for the two cores.   [M, K] -> [M, N] float64"""
    k0, k1 = w.k0, w.k0 + w.shape[0]
    return kernels.mxfp4_reference_matmul(x, w.codes[:, k0 // 2:k1 // 2],
                                          w.scale_bits[:, k0 // MX_BLOCK:k1 // MX_BLOCK])
