"""Kimi Delta Attention (KDA) decode on one tensor-parallel rank: short conv, gated delta rule, gated norm.

KDA is a linear-attention layer whose per-head memory is a fixed-size matrix S [H, H] (key x value),
so a decode step reads and writes the state instead of a growing KV cache. Per token and head:

    y      = SiLU(causal depthwise conv_W([hist, x]))        -> q, k, v (3 x [N, H])
    q, k   = q / sqrt(|q|^2 + 1e-6) * H^-1/2,  k / sqrt(|k|^2 + 1e-6)
    g      = lb * sigmoid(exp(A_log[n]) * (z + dt_bias)),    alpha = exp(g) in (e^lb, 1]
    S     <- diag(alpha) S                                   (decay each key row i)
    S     <- S + beta * k (v - S^T k)^T                      (delta rule: move S^T k towards v)
    o      = S^T q                                           (reads the *updated* S)
    out    = RMSNorm_head(o) * o_norm_w * sigmoid(gate)

Dimension legend: B sequences, T tokens per sequence (1, or 1 + draft tokens being verified),
N heads on this rank (N/P of the model; 12 for K3 at TP8), H head dim (d_k = d_v = 128),
C = 3*N*H conv channels ([q | k | v], each head-major), W conv width (4 for K3).
State indices: S[i][j], i = key, j = value.

What differs from the textbook (Gated DeltaNet / FLA `fused_recurrent_kda`):
- the decay is per key channel (a diagonal alpha, not a scalar per head), and the bound lb = -5
  *multiplies* the sigmoid rather than clamping g; alpha = 1 exactly is legal;
- the L2-norm eps is added to the sum of squares, not to the norm;
- q, k and v each get their own short causal conv with SiLU; the history holds W-1 *pre-conv* inputs;
- the output is per-head RMSNorm first, then the sigmoid gate (MLA gates without a norm);
- T > 1 (verifying draft tokens) runs the tokens in order in one call; vLLM's fused decode kernel
  takes T = 1 only and 12/24/48/96 local heads, which this simulator does not enforce.

Three forms with one signature: `kda_decode_reference` (plain per-token loops), `kda_decode_fused`
(the GPU kernel's one program per (sequence, head), all run at once) and `kda_chain` (the four-kernel
fallback); the fast backend runs a compiled `kda_decode_fused` in its place (simulator/fast/kda.py).
All are pure and compute in the inputs' dtype; pass all inputs in one dtype (float64 or float32).
Sources: docs/sources.md §K1c and §K4 (R-ARCH §4, V-KDA, COL).
"""

from __future__ import annotations

import numpy as np

from simulator.dtypes import Array
from simulator.ops.pointwise import sigmoid, sigmoid_exp
from simulator.ops.replaceable import replaceable

L2_EPS = 1e-6  # added to the sum of squares in the q/k L2 norm (first-party KDA)


def _l2_normalise(x: Array) -> Array:
    """x / sqrt(sum(x^2) + 1e-6) over the last axis."""
    return x / np.sqrt((x * x).sum(axis=-1, keepdims=True) + L2_EPS)


# ============================================================================ reference: per-token loops
def kda_decode_reference(
    x: Array, conv_w: Array, hist: Array, z: Array, dt_bias: Array, a_log: Array,
    beta_logits: Array, gate: Array, o_norm_w: Array, state: Array, *, lower_bound: float, eps: float,
) -> tuple[Array, Array, Array]:
    """One KDA decode step written token by token and head by head, the textbook way.

    x [B, T, C], conv_w [C, W], hist [B, C, W-1], z [B, T, N*H], dt_bias [N*H], a_log [N],
    beta_logits [B, T, N], gate [B, T, N*H], o_norm_w [H], state [B, N, H, H].
    Returns (out [B, T, N*H], new_state [B, N, H, H], new_hist [B, C, W-1]).
    """
    dtype = np.result_type(x, conv_w, hist, z, dt_bias, a_log, beta_logits, gate, o_norm_w, state)
    B, T, _ = x.shape
    N, H = state.shape[1], state.shape[3]
    out = np.empty((B, T, N * H), dtype)  # [B, T, N*H]
    new_state, new_hist = state.astype(dtype), hist.astype(dtype)  # copies, updated in place below
    for b in range(B):
        for t in range(T):
            window = np.concatenate([new_hist[b], x[b, t, :, None]], axis=1)  # [C, W]
            new_hist[b] = window[:, 1:]  # [C, W-1]
            qkv = (window * conv_w).sum(axis=1).reshape(3, N, H)  # [3, N, H]
            q, k, v = qkv * sigmoid(qkv)  # 3 x [N, H]
            zh = (z[b, t] + dt_bias).reshape(N, H)  # [N, H]
            alpha = np.exp(float(lower_bound) * sigmoid(np.exp(a_log)[:, None] * zh))  # [N, H]
            for n in range(N):
                heads = slice(n * H, (n + 1) * H)
                o = _delta_rule_reference(new_state[b, n], q[n], k[n], v[n], alpha[n], beta_logits[b, t, n])
                out[b, t, heads] = _gated_norm_reference(o, gate[b, t, heads], o_norm_w, eps)  # [H]
    return out, new_state, new_hist


def _delta_rule_reference(S: Array, q: Array, k: Array, v: Array, alpha: Array, beta_logit: Array) -> Array:
    """One head, one token: updates S [H, H] in place and returns o = S^T q [H]."""
    q = q / np.sqrt(q @ q + L2_EPS) * q.shape[0] ** -0.5  # [H]
    k = k / np.sqrt(k @ k + L2_EPS)  # [H]
    S *= alpha[:, None]  # S <- diag(alpha) S
    S += sigmoid(beta_logit) * np.outer(k, v - S.T @ k)  # [H, H]
    return S.T @ q  # [H]


def _gated_norm_reference(o: Array, gate: Array, o_norm_w: Array, eps: float) -> Array:
    """One head: o / rms(o) * w * sigmoid(gate), all [H]."""
    return o / np.sqrt(np.mean(o * o) + float(eps)) * o_norm_w * sigmoid(gate)


# ============================================================================ fused: one program per (b, n)
@replaceable
def kda_decode_fused(
    x: Array, conv_w: Array, hist: Array, z: Array, dt_bias: Array, a_log: Array,
    beta_logits: Array, gate: Array, o_norm_w: Array, state: Array, *, lower_bound: float, eps: float,
) -> tuple[Array, Array, Array]:
    """The whole step as one kernel: conv+SiLU, L2 norm, gate, beta, delta rule, RMSNorm, output gate.

    Each (sequence, head) program keeps its q, k, v, g, o in registers and its [H, H] state tile on-chip
    across the T tokens, and sums over a head's H channels in index order (a program's loop); here every
    program runs at once, vectorised over (b, n). Traffic removed vs `kda_chain`, per token per rank in bf16
    (write + read of each intermediate): y 3NH*2*2, g NH*2*2, beta N*2*2, o NH*2*2 = 20NH + 4N bytes;
    K3 at TP8 (N=12, H=128): 30,768 B. The fp32 state moves 2*N*H*H*4 = 1.5 MiB per sequence either
    way, so the bytes saved are ~2%: the win is launches (vLLM's fallback chain is 3+ kernels; at
    batch 1 FlashInfer's fused decode takes 4.08 us vs 10.08 us for Triton, vllm#55364).
    """
    dtype = np.result_type(x, conv_w, hist, z, dt_bias, a_log, beta_logits, gate, o_norm_w, state)
    x, conv_w, hist, z, dt_bias, a_log, beta_logits, gate, o_norm_w, state = (
        np.asarray(a, dtype) for a in (x, conv_w, hist, z, dt_bias, a_log, beta_logits, gate, o_norm_w, state))
    B, T, _ = x.shape
    N, H, W = state.shape[1], state.shape[3], conv_w.shape[1]
    one, l2_eps = dtype.type(1), dtype.type(L2_EPS)
    S, hist = state.copy(), hist.copy()  # updated in place below
    out = np.empty((B, T, N * H), dtype)  # [B, T, N*H]
    for t in range(T):
        y = conv_w[:, W - 1] * x[:, t]  # [B, C]: the current token's tap, then the history's in order
        for w in range(W - 1):
            y += conv_w[:, w] * hist[:, :, w]
        hist = np.concatenate([hist[:, :, 1:], x[:, t, :, None]], axis=2)  # [B, C, W-1]
        q, k, v = (y * sigmoid_exp(y)).reshape(B, 3, N, H).transpose(1, 0, 2, 3)  # 3 x [B, N, H]
        q = q * (one / np.sqrt(dtype.type(H)) / np.sqrt(_sum_sq(q) + l2_eps))[..., None]
        k = k * (one / np.sqrt(_sum_sq(k) + l2_eps))[..., None]
        zh = (z[:, t] + dt_bias).reshape(B, N, H)
        alpha = np.exp(dtype.type(lower_bound) * sigmoid_exp(np.exp(a_log)[:, None] * zh))  # [B, N, H]
        u, o = np.zeros((B, N, H), dtype), np.zeros((B, N, H), dtype)  # S^T k, then S^T q
        for i in range(H):  # key row i: decay it, add its share of u
            S[:, :, i] *= alpha[:, :, i, None]
            u += S[:, :, i] * k[:, :, i, None]
        delta = sigmoid_exp(beta_logits[:, t])[..., None] * (v - u)  # [B, N, H] = beta (v - S^T k)
        for i in range(H):  # the rank-1 update of row i, then its share of o
            S[:, :, i] += k[:, :, i, None] * delta
            o += S[:, :, i] * q[:, :, i, None]
        inv_rms = one / np.sqrt(_sum_sq(o) / dtype.type(H) + dtype.type(eps))  # [B, N]
        out[:, t] = (o * inv_rms[..., None] * o_norm_w * sigmoid_exp(gate[:, t].reshape(B, N, H))).reshape(B, -1)
    return out, S, hist


def _sum_sq(a: Array) -> Array:
    """sum of a^2 over the last axis, in index order (a program's loop, not NumPy's pairwise sum)."""
    total = np.zeros(a.shape[:-1], a.dtype)
    for i in range(a.shape[-1]):
        total += a[..., i] * a[..., i]
    return total


# ============================================================================ chain: the fallback kernels
def kda_conv_update(x: Array, conv_w: Array, hist: Array) -> tuple[Array, Array]:
    """Causal depthwise conv + SiLU: y[t, c] = SiLU(sum_w conv_w[c, w] * [hist, x][c, t + w]).

    x [B, T, C] pre-conv inputs, conv_w [C, W] (last tap multiplies the current token), hist [B, C, W-1]
    oldest first. Returns y [B, T, C] and the new history [B, C, W-1] (the last W-1 pre-conv inputs).
    """
    W = conv_w.shape[1]
    buf = np.concatenate([hist, x.transpose(0, 2, 1)], axis=2)  # [B, C, W-1+T]
    windows = np.lib.stride_tricks.sliding_window_view(buf, W, axis=2)  # [B, C, T, W]
    y = np.einsum("bctw,cw->btc", windows, conv_w)  # [B, T, C]
    return y * sigmoid(y), buf[:, :, buf.shape[2] - (W - 1) :].copy()  # [B, T, C], [B, C, W-1]


def kda_gate(z: Array, dt_bias: Array, a_log: Array, lower_bound: float) -> Array:
    """Log-decay g = lb * sigmoid(exp(A_log[n]) * (z + dt_bias)); z [B, T, N*H] -> g [B, T, N, H]."""
    B, T, _ = z.shape
    N = a_log.shape[0]
    zh = (z + dt_bias).reshape(B, T, N, -1)  # [B, T, N, H]
    return float(lower_bound) * sigmoid(np.exp(a_log)[:, None] * zh)


def kda_recurrent(
    q: Array, k: Array, v: Array, g: Array, beta: Array, state: Array, checkpoints: bool = False
) -> tuple[Array, ...]:
    """Gated delta rule over T tokens in order; q, k, v, g [B, T, N, H], beta [B, T, N], state [B, N, H, H].

    Returns o [B, T, N, H] and the new state; with `checkpoints`, also the state after each of the first
    T - 1 tokens, [B, T-1, N, H, H]: what vLLM's verify kernel stores so that rejected draft tokens can be
    rolled back to the last accepted one. q, k are L2-normalised here (as vLLM's kernel does).
    """
    q = _l2_normalise(q) * q.shape[-1] ** -0.5  # [B, T, N, H]
    k = _l2_normalise(k)  # [B, T, N, H]
    S = state.astype(np.result_type(q, k, v, g, beta, state))  # a promoted copy, [B, N, H, H]
    o = np.empty(np.broadcast_shapes(q.shape, v.shape), S.dtype)  # [B, T, N, H]
    T = q.shape[1]
    saved = np.empty((S.shape[0], max(T - 1, 0)) + S.shape[1:], S.dtype) if checkpoints else None
    for t in range(T):
        S = np.exp(g[:, t])[..., None] * S  # decay key rows i
        u = np.einsum("bnij,bni->bnj", S, k[:, t])  # [B, N, H] = S^T k
        S = S + beta[:, t, :, None, None] * k[:, t, :, :, None] * (v[:, t] - u)[:, :, None, :]
        o[:, t] = np.einsum("bnij,bni->bnj", S, q[:, t])  # [B, N, H] = S^T q
        if saved is not None and t < T - 1:
            saved[:, t] = S
    return (o, S, saved) if checkpoints else (o, S)


def kda_gated_norm(o: Array, gate: Array, o_norm_w: Array, eps: float) -> Array:
    """Per-head RMSNorm(o) * o_norm_w * sigmoid(gate); o [B, T, N, H], gate [B, T, N*H] -> [B, T, N*H]."""
    B, T, N, H = o.shape
    normed = o / np.sqrt((o * o).mean(axis=-1, keepdims=True) + float(eps)) * o_norm_w  # [B, T, N, H]
    return (normed * sigmoid(gate.reshape(B, T, N, H))).reshape(B, T, N * H)


def kda_chain(
    x: Array, conv_w: Array, hist: Array, z: Array, dt_bias: Array, a_log: Array,
    beta_logits: Array, gate: Array, o_norm_w: Array, state: Array, *, lower_bound: float, eps: float,
) -> tuple[Array, Array, Array]:
    """The multi-kernel fallback: conv -> gate -> recurrence -> gated norm; same contract as the reference."""
    B, T, _ = x.shape
    N, H = state.shape[1], state.shape[3]
    y, new_hist = kda_conv_update(x, conv_w, hist)  # [B, T, 3*N*H], [B, C, W-1]
    q, k, v = y.reshape(B, T, 3, N, H).transpose(2, 0, 1, 3, 4)  # 3 x [B, T, N, H]
    g = kda_gate(z, dt_bias, a_log, lower_bound)  # [B, T, N, H]
    o, new_state = kda_recurrent(q, k, v, g, sigmoid(beta_logits), state)  # [B, T, N, H], [B, N, H, H]
    return kda_gated_norm(o, gate, o_norm_w, eps), new_state, new_hist


# ============================================================================ kernels of the plans
# The plans hold activations as [M, n] rows (M = B T); these entry points take exactly a kernel's
# declared tensors, reshape to [B, T, ...] and call the forms above.

def kda_conv_step(x: Array, hist: Array, conv_w: Array, *, batch: int) -> tuple[Array, Array]:
    """Conv kernel: x [M, 3C], hist [B, 3C, W-1], conv_w [3C, W] -> y [M, 3C], hist."""
    y, hist = kda_conv_update(x.reshape(batch, -1, x.shape[-1]), conv_w, hist)  # [B, T, 3C]
    return y.reshape(x.shape), hist


def kda_recurrent_step(qkv: Array, z: Array, beta_logits: Array, state: Array, dt_bias: Array, a_log: Array,
                       *, batch: int, lower_bound: float, checkpoints: bool = False) -> tuple[Array, ...]:
    """Gate + beta + delta rule: qkv [M, 3C] (after the conv), z [M, C], beta_logits [M, N],
    state [B, N, H, H] -> o [M, C], state (and, with `checkpoints`, the state after each of the first
    T - 1 tokens, [B, T-1, N, H, H], what a verify stores for rollback)."""
    B, (N, H) = batch, state.shape[1:3]
    q, k, v = (part.reshape(B, -1, N, H) for part in np.split(qkv, 3, axis=-1))  # 3 x [B, T, N, H]
    g = kda_gate(z.reshape(B, -1, N * H), dt_bias, a_log, lower_bound)  # [B, T, N, H]
    out = kda_recurrent(q, k, v, g, sigmoid(beta_logits.reshape(B, -1, N)), state, checkpoints=checkpoints)
    return (out[0].reshape(qkv.shape[0], N * H),) + tuple(out[1:])


def kda_gated_norm_step(o: Array, gate: Array, o_norm_w: Array, *, heads: int, eps: float) -> Array:
    """Per-head RMSNorm + output gate: o, gate [M, C] -> [M, C]."""
    M = o.shape[0]
    return kda_gated_norm(o.reshape(1, M, heads, -1), gate.reshape(1, M, -1), o_norm_w, eps).reshape(M, -1)


def kda_decode_step(qkv: Array, z: Array, beta_logits: Array, gate: Array, state: Array, hist: Array,
                    conv_w: Array, dt_bias: Array, a_log: Array, o_norm_w: Array,
                    *, batch: int, lower_bound: float, eps: float) -> tuple[Array, Array, Array]:
    """The fused kernel on a kernel's tensors: qkv [M, 3C] (pre-conv), z, gate [M, C], beta_logits [M, N]
    -> out [M, C], state, hist."""
    bt = lambda a: a.reshape(batch, -1, a.shape[-1])  # noqa: E731   [M, n] -> [B, T, n]
    out, state, hist = kda_decode_fused(bt(qkv), conv_w, hist, bt(z), dt_bias, a_log, bt(beta_logits), bt(gate),
                                        o_norm_w, state, lower_bound=lower_bound, eps=eps)
    return out.reshape(qkv.shape[0], -1), state, hist


def delta_rule_flops(M: int, N: int, H: int) -> int:
    """Per token and head, over the [H, H] state: decay each key row (1 multiply per element),
    u = S^T k (2), the rank-1 update S += k (beta (v - u))^T (multiply + add: 2), o = S^T q (2): 7 H^2;
    the L2 norms, gate and beta are O(H)."""
    return 7 * M * N * H * H


def gated_norm_flops(M: int, C: int) -> int:
    """Per channel: square and accumulate (2), scale by 1/rms and by w (2), sigmoid gate (counted 1) and
    its multiply (1)."""
    return 6 * M * C


def conv_flops(M: int, C: int, W: int) -> int:
    """Depthwise conv: one multiply-add per tap per channel per token (the SiLU is O(M C))."""
    return 2 * M * C * W

