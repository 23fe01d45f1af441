"""RMSNorm and Block Attention Residuals (AttnRes): the residual stream of a Kimi K3 layer.

    RMSNorm(x) = x / sqrt(mean(x^2) + eps) * w                      x [M, D], w [D]

Block AttnRes replaces the plain residual add. The stream is a running `prefix` (sum of the
outputs since the last block boundary) plus up to 8 block snapshots. Before attention and before
the MLP the layer input is a softmax mix over the sources (snapshots..., prefix):

    score_s = < v_s / rms(v_s), norm_w * proj_w >       one scalar per source and token
    h       = sum_s softmax_s(score) * v_s               over the RAW (unnormalised) sources

Dimension legend: M tokens, D hidden, S sources (<= 9 for Kimi K3).

What differs from a plain pre-norm residual: the mix reads S sources instead of one; at a block
boundary the prefix is pushed as a snapshot and reset to zero. A model without it (DeepSeek-V3) runs the
plain residual of ops/residual.py.
"""

from __future__ import annotations

import numpy as np

from typing import Callable

from simulator.dtypes import Array
from simulator.ops.collectives import all_reduce_one_shot
from simulator.ops.replaceable import replaceable


def rms_norm_reference(x: Array, w: Array, eps: float) -> Array:
    """RMSNorm in float64, cast back to x's dtype.   x [..., D] -> [..., D]"""
    x64 = x.astype(np.float64)
    y = x64 / np.sqrt(np.mean(x64 * x64, axis=-1, keepdims=True) + eps) * w
    return y.astype(x.dtype)


@replaceable
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


@replaceable
def attn_res_mix(sources: list[Array], norm_w: Array, proj_w: Array, eps: float) -> Array:
    """The same mix vectorised in the sources' dtype, as the kernel computes it."""
    v = np.stack(sources)  # [S, M, D]
    query = (norm_w * proj_w).astype(v.dtype)  # [D]
    rms = np.sqrt(np.mean(v * v, axis=-1) + eps)  # [S, M]
    s = (v @ query) / rms  # [S, M]
    p = np.exp(s - s.max(axis=0))
    p /= p.sum(axis=0)
    return np.einsum("sm,smd->md", p, v)  # [M, D]


def rms_norm_flops(M: int, D: int) -> int:
    """Per element: square and accumulate (2), scale by 1/rms and by w (2)."""
    return 4 * M * D


def attn_res_mix_flops(S: int, M: int, D: int) -> int:
    """Per source element: square and accumulate for its rms (2), dot with the query (2), weighted
    accumulate into the output (2); the per-source softmax is O(S M), noise."""
    return 6 * S * M * D


# ===================================================================== kernels of the plans
def attn_res_pre(prefix: Array, delta: Array, blocks: Array, norm_w: Array, proj_w: Array, input_w: Array,
                 *, eps: float, boundary: bool) -> tuple[Array, ...]:
    """prefix += delta; h = mix(blocks + [prefix]); at a block boundary snapshot the prefix and reset it;
    x = RMSNorm(h).  [M, D], [M, D], [n, M, D] -> prefix [M, D], x [M, D] (, snapshot [1, M, D])"""
    prefix = prefix + delta
    h = attn_res_mix(list(blocks) + [prefix], norm_w, proj_w, eps)  # [M, D]
    x = rms_norm(h, input_w, eps)
    if boundary:
        return np.zeros_like(prefix), x, prefix[None]
    return prefix, x


def attn_res_post(prefix: Array, attn_out: Array, blocks: Array, norm_w: Array, proj_w: Array, post_w: Array,
                  *, eps: float, store: Callable[[Array], Array]) -> tuple[Array, Array]:
    """prefix += attention output (stored in bf16, and the mix reads the stored value); h2 = mix;
    x2 = RMSNorm(h2).  -> prefix [M, D], x2 [M, D]"""
    prefix = store(prefix + attn_out)
    h = attn_res_mix(list(blocks) + [prefix], norm_w, proj_w, eps)
    return prefix, rms_norm(h, post_w, eps)


def oproj_allreduce_attn_res_post(cores: list[Array], prefixes: list[Array], blocks: list[Array],
                                  w_o: list[Array], norm_w: list[Array], proj_w: list[Array],
                                  post_w: list[Array], *, eps: float, store: Callable[[Array], Array]
                                  ) -> tuple[list[Array], list[Array]]:
    """All ranks: partial_r = core_r @ W_o shard; one-shot FP32 all-reduce; then `attn_res_post` on the
    sum. Removes the [M, D] partial write + re-read and the reduced output's write + re-read
    (4 x M x D x 2 B) and two launches; the sum is never rounded to bf16 before the residual add."""
    partials = [c @ w for c, w in zip(cores, w_o)]  # P x [M, D]
    outs = [attn_res_post(p, total, b, n, j, q, eps=eps, store=store)
            for p, total, b, n, j, q in zip(prefixes, all_reduce_one_shot(partials), blocks, norm_w, proj_w, post_w)]
    return [o[0] for o in outs], [o[1] for o in outs]
