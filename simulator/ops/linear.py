"""Linear layers as the decode GEMMs compute them: BF16 x BF16 with FP32 accumulation, and MXFP4 weights.

    y = x @ W                          x [M, K] activations, W [K, N] weights (y = x W, rows are tokens)

BF16 GEMM: inputs are BF16 values, products and sums are FP32 (tensor-core accumulate), the output is
rounded to BF16 when written. The executor holds BF16 values in float32 arrays, so `x @ w` in float32
*is* that computation; the rounding of the output happens where the kernel writes it.

MXFP4 GEMM (routed experts, W4A16): W is stored as E2M1 codes with one power-of-two E8M0 scale per 32
consecutive K elements (dtypes.MXFP4, blocks along K). Two ways to compute the same product:
- reference: dequantize W to FP32 (codes x scale), then one GEMM;
- fused (what the kernel does): for each 32-wide K block b, multiply the raw E2M1 values, then scale the
  block's partial sum once:  y = sum_b s_b,n * (x[:, b] @ codes[b, n]).
  The dequantized weight matrix is never materialised: 4.25 bits per weight are read instead of 16.
Because every scale is a power of two, both give the same FP32 result up to summation order.

The ops multiply with `x @ w`, so the same code runs on a float array and on the packed weights the fast
backend hands them instead (simulator/fast/packed.py: MXFP4 codes and bf16 bits read where they are held).

Dimension legend: M tokens, K input width, N output width.
"""

from __future__ import annotations

import numpy as np

from simulator.dtypes import MX_BLOCK, MXFP4, Array, mxfp4_dequantize


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


# ===================================================================== MXFP4 weights
def mxfp4_linear_reference(x: Array, w_t: MXFP4) -> Array:
    """Dequantize, then multiply. `w_t` is W transposed ([N, K], blocks along K) as checkpoints store it."""
    return x @ mxfp4_dequantize(w_t, x.dtype).T  # [M, N]


def mxfp4_linear_fused(x: Array, w_t: MXFP4) -> Array:
    """Block-scaled accumulation: one partial GEMM per 32-wide K block on the raw E2M1 values, scaled
    once per block and output column. Reads 0.53 B per weight; never writes a dequantized W."""
    n, k = w_t.shape
    unit = MXFP4(w_t.packed, np.full_like(w_t.scales, 1.0), w_t.shape)  # codes with scale 1: E2M1 values
    codes = mxfp4_dequantize(unit, x.dtype).reshape(n, k // MX_BLOCK, MX_BLOCK)  # [N, K/32, 32]
    scales = w_t.scales.astype(np.float32).astype(x.dtype)  # [N, K/32]
    xb = x.reshape(x.shape[0], k // MX_BLOCK, MX_BLOCK)  # [M, K/32, 32]
    partial = np.einsum("mbk,nbk->mbn", xb, codes)  # [M, K/32, N] one partial sum per block
    return np.einsum("mbn,nb->mn", partial, scales)  # [M, N]


# ===================================================================== packed projections (plan kernels)
def linear_split(x: Array, w: Array, *, widths: tuple[int, ...]) -> tuple[Array, ...]:
    """One GEMM over a packed weight [K, sum widths], its output split into the packed parts.
    [M, K] @ [K, N1 + N2 + ...] -> ([M, N1], [M, N2], ...): one launch and one read of x instead of one each."""
    y = linear(x, w)  # [M, sum widths]
    return tuple(np.split(y, np.cumsum(widths)[:-1], axis=-1))


def linear_heads(x: Array, w: Array, *, heads: int) -> Array:
    """A column-sharded projection whose output is per head.   [M, K] @ [K, Nh Dh] -> [M, Nh, Dh]"""
    return linear(x, w).reshape(x.shape[0], heads, -1)
