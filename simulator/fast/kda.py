"""The fused KDA decode compiled: `ops.kda.kda_decode_fused`'s programs as Numba loops, its fast-backend replacement.

The GPU grid as loops: one program per (sequence b, head n) walks its T tokens, keeping q, k, v, g, o in
local arrays (a program's registers) and updating its [H, H] state tile in place; each sum over a head's
channels runs in index order, as the NumPy form's do, so in float64 the two agree to the bit (in float32 the
exponentials may differ by an ulp: Numba calls the C library's expf, NumPy its own SIMD exp).
`_kda_fused_kernel.py_func` is the same loops in plain Python (STYLE item 14).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np

from simulator.dtypes import Array
from simulator.jit import jitable, lazy_njit
from simulator.ops.kda import L2_EPS


class _Consts(NamedTuple):
    """Scalars in the working dtype, so numba keeps float32 math in float32 (a bare 1.0 is float64)."""

    one: np.floating
    lower_bound: np.floating
    eps: np.floating
    l2_eps: np.floating
    head_dim: np.floating


def kda_decode_fused(
    x: Array, conv_w: Array, hist: Array, z: Array, dt_bias: Array, a_log: Array,
    beta_logits: Array, gate: Array, o_norm_w: Array, state: Array, *, lower_bound: float, eps: float,
) -> tuple[Array, Array, Array]:
    """`ops.kda.kda_decode_fused` as one compiled kernel (module docstring)."""
    return _launch_fused(_kda_fused_kernel, x, conv_w, hist, z, dt_bias, a_log, beta_logits, gate,
                         o_norm_w, state, lower_bound=lower_bound, eps=eps)


def _launch_fused(
    kernel: Callable[..., None], *inputs: Array, lower_bound: float, eps: float
) -> tuple[Array, Array, Array]:
    """Casts to one contiguous dtype, allocates the outputs and runs `kernel` (jitted or its .py_func)."""
    dtype = np.result_type(*inputs)
    x, conv_w, hist, z, dt_bias, a_log, beta_logits, gate, o_norm_w, state = (
        np.ascontiguousarray(a, dtype) for a in inputs
    )
    B, T, _ = x.shape
    N, H = state.shape[1], state.shape[3]
    out = np.empty((B, T, N * H), dtype)  # [B, T, N*H]
    new_state, new_hist = state.copy(), hist.copy()  # the kernel updates these in place
    c = _Consts(*(dtype.type(s) for s in (1.0, lower_bound, eps, L2_EPS, H)))
    kernel(x, conv_w, z, dt_bias, a_log, beta_logits, gate, o_norm_w, c, new_hist, new_state, out)
    return out, new_state, new_hist


@lazy_njit(cache=True)
def _kda_fused_kernel(  # type: ignore[no-untyped-def]
    x, conv_w, z, dt_bias, a_log, beta_logits, gate, o_norm_w, c, hist, state, out
):
    """The GPU grid as loops: one program per (b, n) walks its T tokens; `hist`, `state`, `out` in place."""
    B, T, _ = x.shape
    N, H = state.shape[1], state.shape[3]
    qkv = np.empty((3, H), x.dtype)  # registers of one program
    alpha = np.empty(H, x.dtype)
    o = np.empty(H, x.dtype)
    for b in range(B):
        for n in range(N):
            for t in range(T):
                _conv_silu_head(x[b, t], conv_w, hist[b], n, N, H, c, qkv)
                _l2_normalise_head(qkv[0], c, c.one / np.sqrt(c.head_dim))
                _l2_normalise_head(qkv[1], c, c.one)
                for i in range(H):
                    zi = z[b, t, n * H + i] + dt_bias[n * H + i]
                    alpha[i] = np.exp(c.lower_bound * _sigmoid_scalar(np.exp(a_log[n]) * zi, c))
                beta = _sigmoid_scalar(beta_logits[b, t, n], c)
                _delta_rule_head(state[b, n], qkv, alpha, beta, c, o)
                _gated_norm_head(o, gate[b, t], o_norm_w, n, c, out[b, t])


@jitable
def _sigmoid_scalar(x, c):  # type: ignore[no-untyped-def]
    """pointwise.sigmoid for one scalar inside the jitted kernel, in the kernel's dtype `c.one`."""
    if x >= 0:
        return c.one / (c.one + np.exp(-x))
    e = np.exp(x)
    return e / (c.one + e)


@jitable
def _conv_silu_head(x_t, conv_w, hist_b, n, N, H, c, qkv):  # type: ignore[no-untyped-def]
    """q, k, v channels of head n: conv over [hist, x_t], SiLU into qkv [3, H]; shifts hist left by one."""
    W = conv_w.shape[1]
    for part in range(3):
        for i in range(H):
            ch = part * N * H + n * H + i
            acc = conv_w[ch, W - 1] * x_t[ch]
            for w in range(W - 1):
                acc += conv_w[ch, w] * hist_b[ch, w]
                hist_b[ch, w] = hist_b[ch, w + 1] if w < W - 2 else x_t[ch]
            qkv[part, i] = acc * _sigmoid_scalar(acc, c)


@jitable
def _l2_normalise_head(x, c, scale):  # type: ignore[no-untyped-def]
    ss = c.one - c.one
    for i in range(x.shape[0]):
        ss += x[i] * x[i]
    inv = scale / np.sqrt(ss + c.l2_eps)
    for i in range(x.shape[0]):
        x[i] *= inv


@jitable
def _delta_rule_head(S, qkv, alpha, beta, c, o):  # type: ignore[no-untyped-def]
    """Column j of S (one value channel) is independent of the others: decay, u_j, update, o_j."""
    H = S.shape[0]
    for j in range(H):
        u = c.one - c.one
        for i in range(H):
            S[i, j] *= alpha[i]
            u += S[i, j] * qkv[1, i]
        delta = beta * (qkv[2, j] - u)
        acc = c.one - c.one
        for i in range(H):
            S[i, j] += qkv[1, i] * delta
            acc += S[i, j] * qkv[0, i]
        o[j] = acc


@jitable
def _gated_norm_head(o, gate_t, o_norm_w, n, c, out_t):  # type: ignore[no-untyped-def]
    H = o.shape[0]
    ss = c.one - c.one
    for j in range(H):
        ss += o[j] * o[j]
    inv_rms = c.one / np.sqrt(ss / c.head_dim + c.eps)
    for j in range(H):
        out_t[n * H + j] = o[j] * inv_rms * o_norm_w[j] * _sigmoid_scalar(gate_t[n * H + j], c)
