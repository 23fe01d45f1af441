"""Linear layers as the decode GEMMs compute them: BF16 x BF16 with FP32 accumulation, and MXFP4 weights.

    y = x @ W                          x [M, K] activations, W [K, N] weights (y = x W, rows are tokens)

BF16 GEMM: inputs are BF16 values, products and sums are FP32 (tensor-core accumulate), the output is
rounded to BF16 when written. The executor holds BF16 values in float32 arrays, so `x @ w` in float32
*is* that computation; the rounding of the output happens where the kernel writes it.

The ops multiply with `x @ w`, so the same code runs on a float array and on the packed weights the fast
backend hands them instead (simulator/fast/packed.py: MXFP4 codes and bf16 bits read where they are held).
The MXFP4 product's two forms (dequantize then GEMM; the kernel's block-scaled accumulation) are the format's,
in dtypes.py.

Dimension legend: M tokens, K input width, N output width.
"""

from __future__ import annotations

import numpy as np

from simulator.dtypes import Array


def gemm_flops(m: int, k: int, n: int) -> int:
    """[m, k] @ [k, n]: one multiply and one add per (row, column, reduction) triple."""
    return 2 * m * k * n


def linear_reference(x: Array, w: Array) -> Array:
    """float64 GEMM, cast back to x's dtype.   [M, K] @ [K, N] -> [M, N]"""
    return (x.astype(np.float64) @ w.astype(np.float64)).astype(x.dtype)


def linear(x: Array, w: Array, *bias: Array) -> Array:
    """The GEMM in x's dtype (float32: BF16 inputs with FP32 accumulation), + a bias row [N] where the layer
    has one (gpt-oss's router and o_proj).   [M, K] @ [K, N] -> [M, N]"""
    y = x @ (w if w.dtype == x.dtype else w.astype(x.dtype))
    return y + bias[0].astype(x.dtype) if bias else y


# ===================================================================== packed projections (plan kernels)
def linear_split(x: Array, w: Array, *, widths: tuple[int, ...]) -> tuple[Array, ...]:
    """One GEMM over a packed weight [K, sum widths], its output split into the packed parts.
    [M, K] @ [K, N1 + N2 + ...] -> ([M, N1], [M, N2], ...): one launch and one read of x instead of one each."""
    y = linear(x, w)  # [M, sum widths]
    return tuple(np.split(y, np.cumsum(widths)[:-1], axis=-1))

