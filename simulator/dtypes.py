"""Number formats: BF16, FP8 (E4M3) and MXFP4 rounding and packing through ml_dtypes, and precision modes.

Storage formats (what a tensor is when it sits in HBM):
- bf16  : 8-bit exponent, 7-bit mantissa; every activation between kernels on the GPU path.
- fp8   : E4M3 (max 448, no inf); the latent KV cache.
- mxfp4 : OCP Microscaling FP4: E2M1 values (+-{0, .5, 1, 1.5, 2, 3, 4, 6}) with one E8M0 scale
          (a power of two) per 32 consecutive elements along the reduction dimension; two values
          per byte, low nibble = even element. 4.25 bits per weight.

Precision modes (how the simulator computes):
- fp64 : pure algebra; every buffer float64, nothing rounded. Standard, specialized and reference
         agree to ~1e-12, which proves every rewrite (fusion, TP re-association) is exact math.
- fp32 : every buffer float32.
- bf16 : GPU-faithful. Buffers a kernel writes are rounded to their storage format (bf16
         activations, fp8 KV cache, fp32 KDA state and router logits); math inside a kernel runs in
         float32, so a fused kernel skips the roundings of the intermediates it no longer writes.

Weights are always the checkpoint's formats (bf16 values, MXFP4 experts) in every mode: the model
is defined by its quantized weights; precision modes differ only in the arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import ml_dtypes
import numpy as np
import numpy.typing as npt

Array = npt.NDArray[np.floating]
PrecisionName = Literal["fp64", "fp32", "bf16"]
PRECISIONS: tuple[str, ...] = ("fp64", "fp32", "bf16")

FP8_MAX = float(ml_dtypes.finfo(ml_dtypes.float8_e4m3fn).max)  # 448
E2M1_EMAX = 2  # largest E2M1 value is 6 = 1.5 * 2**2
MX_BLOCK = 32


def round_bf16(x: Array) -> Array:
    """Round to the nearest bfloat16 (ties to even) and return in x's dtype."""
    return x.astype(ml_dtypes.bfloat16).astype(x.dtype)


def round_fp8(x: Array) -> Array:
    """Round to E4M3 with saturation at +-448 (E4M3FN has no infinity; overflow would be NaN)."""
    return np.clip(x, -FP8_MAX, FP8_MAX).astype(ml_dtypes.float8_e4m3fn).astype(x.dtype)


# ---------------------------------------------------------------------------------------
# MXFP4
# ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class MXFP4:
    """A packed MXFP4 tensor, blocks of 32 along the last axis. `shape` is the logical shape."""

    packed: npt.NDArray[np.uint8]  # [..., K/2] two E2M1 codes per byte, low nibble = even element
    scales: npt.NDArray  # [..., K/32] float8_e8m0fnu
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return self.packed.nbytes + self.scales.nbytes


def mxfp4_quantize(x: Array) -> MXFP4:
    """Quantize along the last axis: scale = 2**(floor(log2(amax)) - 2) per block, value = E2M1(x / scale).

    The OCP MX rule puts a block's largest magnitude in [4, 8) before rounding, so values above 6
    saturate to 6 (at most 25% relative error on the block max, the format's known cost).
    """
    *lead, k = x.shape
    if k % MX_BLOCK:
        raise ValueError(f"MXFP4 needs the last axis to be a multiple of {MX_BLOCK}, got {k}")
    blocks = x.astype(np.float32).reshape(*lead, k // MX_BLOCK, MX_BLOCK)  # [..., K/32, 32]
    amax = np.max(np.abs(blocks), axis=-1, keepdims=True)  # [..., K/32, 1]
    exp = np.floor(np.log2(np.where(amax > 0, amax, 1.0))) - E2M1_EMAX
    scale = np.exp2(np.clip(exp, -127, 127)).astype(np.float32)  # E8M0 range
    codes = (blocks / scale).astype(ml_dtypes.float4_e2m1fn).view(np.uint8) & 0xF  # [..., K/32, 32]
    codes = codes.reshape(*lead, k // 2, 2)
    packed = (codes[..., 0] | (codes[..., 1] << 4)).astype(np.uint8)  # [..., K/2]
    scales = scale[..., 0].astype(ml_dtypes.float8_e8m0fnu)  # [..., K/32]
    return MXFP4(packed=packed, scales=scales, shape=tuple(x.shape))


def mxfp4_dequantize(q: MXFP4, dtype: type = np.float32) -> Array:
    """Unpack nibbles, decode E2M1 through ml_dtypes, multiply by each block's power-of-two scale."""
    *lead, k = q.shape
    lo = q.packed & 0xF
    hi = q.packed >> 4
    codes = np.stack([lo, hi], axis=-1).reshape(*lead, k)  # [..., K]
    values = codes.astype(np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float32)
    scale = q.scales.astype(np.float32)  # [..., K/32]
    out = values.reshape(*lead, k // MX_BLOCK, MX_BLOCK) * scale[..., None]
    return out.reshape(*lead, k).astype(dtype)


def round_mxfp4(x: Array) -> Array:
    """Quantize-dequantize: the values an MXFP4 checkpoint can hold, in x's dtype."""
    return mxfp4_dequantize(mxfp4_quantize(x), x.dtype)


# A product x @ W with MXFP4 weights (routed experts, W4A16), two ways: dequantize W, then one GEMM (reference);
# or, as the kernel does, per 32-wide K block b multiply the raw E2M1 values and scale the block's partial sum
# once, y = sum_b s_b,n (x[:, b] @ codes[b, n]) (fused: 4.25 bits read per weight, no dequantized W). Every scale
# is a power of two, so both give the same FP32 result up to summation order. The ops multiply with `x @ w`
# (ops/linear.py); these two define what the fast backend's packed product computes (simulator/fast/packed.py).
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


# ---------------------------------------------------------------------------------------
# precision modes
# ---------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Precision:
    """How the executor computes and what it rounds at kernel boundaries."""

    name: str

    def __post_init__(self) -> None:
        if self.name not in PRECISIONS:
            from simulator.errors import UserError
            raise UserError(f"precision '{self.name}' is not one of {', '.join(PRECISIONS)}.")

    @property
    def dtype(self) -> type:
        """Container dtype of every buffer and of in-kernel math."""
        return np.float64 if self.name == "fp64" else np.float32

    def store(self, x: Array, storage: str) -> Array:
        """What a kernel's output becomes once written to HBM in `storage` format."""
        if storage == "int32":
            return np.asarray(x, dtype=np.int64)
        x = np.asarray(x, dtype=self.dtype)
        if self.name != "bf16" or storage in ("fp32", "fp64"):
            return x
        if storage == "bf16":
            return round_bf16(x)
        if storage == "fp8":
            return round_fp8(x)
        raise ValueError(f"unknown storage format {storage!r}")
