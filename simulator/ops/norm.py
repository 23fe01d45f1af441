"""RMSNorm and Block Attention Residuals (AttnRes): the residual stream of a Kimi K3 layer.

    RMSNorm(x) = x / sqrt(mean(x^2) + eps) * w                      x [M, D], w [D]

Block AttnRes replaces the plain residual add. The stream is a running `prefix` (sum of the
outputs since the last block boundary) plus up to 8 block snapshots. Before attention and before
the MLP the layer input is a softmax mix over the sources (snapshots..., prefix):

    score_s = < v_s / rms(v_s), norm_w * proj_w >       one scalar per source and token
    h       = sum_s softmax_s(score) * v_s               over the RAW (unnormalised) sources

Dimension legend: M tokens, D hidden, S sources (<= 9 for Kimi K3).

What differs from a plain pre-norm residual: the mix reads S sources instead of one; at a block
boundary the prefix is pushed as a snapshot and reset to zero. With `attn_res_block == 0` (DeepSeek)
there are no snapshots and the mix over the single source is the identity, i.e. a plain residual.
"""

from __future__ import annotations

import numpy as np

from simulator.dtypes import Array


def rms_norm_reference(x: Array, w: Array, eps: float) -> Array:
    """RMSNorm in float64, cast back to x's dtype.   x [..., D] -> [..., D]"""
    x64 = x.astype(np.float64)
    y = x64 / np.sqrt(np.mean(x64 * x64, axis=-1, keepdims=True) + eps) * w
    return y.astype(x.dtype)


def rms_norm(x: Array, w: Array, eps: float) -> Array:
    """RMSNorm in x's dtype (the way a GPU kernel computes it in FP32 registers)."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w.astype(x.dtype)


def attn_res_mix_reference(sources: list[Array], norm_w: Array, proj_w: Array, eps: float) -> Array:
    """Softmax mix over sources, plain loops over sources, float64.   S x [M, D] -> [M, D]"""
    query = (norm_w * proj_w).astype(np.float64)  # [D]
    scores = []
    for v in sources:
        v64 = v.astype(np.float64)
        rms = np.sqrt(np.mean(v64 * v64, axis=-1) + eps)  # [M]
        scores.append((v64 @ query) / rms)  # [M]
    s = np.stack(scores)  # [S, M]
    p = np.exp(s - s.max(axis=0))
    p /= p.sum(axis=0)  # [S, M]
    out = sum(p[i][:, None] * sources[i].astype(np.float64) for i in range(len(sources)))
    return np.asarray(out, dtype=sources[0].dtype)  # [M, D]


def attn_res_mix(sources: list[Array], norm_w: Array, proj_w: Array, eps: float) -> Array:
    """The same mix vectorised in the sources' dtype: one read of each source, as the kernel does."""
    v = np.stack(sources)  # [S, M, D]
    query = (norm_w * proj_w).astype(v.dtype)  # [D]
    rms = np.sqrt(np.mean(v * v, axis=-1) + eps)  # [S, M]
    s = (v @ query) / rms  # [S, M]
    p = np.exp(s - s.max(axis=0))
    p /= p.sum(axis=0)
    return np.einsum("sm,smd->md", p, v)  # [M, D]
