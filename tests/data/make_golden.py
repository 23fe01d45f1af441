"""Write tests/data/golden.npz: an independent oracle for the math the reference and the plans share.

Run once (`python tests/data/make_golden.py`); tests/test_golden.py checks simulator/ops against the file.
Self-contained on purpose: NumPy only, nothing from `simulator`, every formula written again from the
equations in the project's model reference (Kimi K3 / DeepSeek-V3 model code), token by token and head
by head in float64, in the plainest loops:

    router   DeepSeek-V3 noaux_tc grouped top-k: s = sigmoid(logits); b = s + bias; a group scores the
             sum of its two best b; keep the topk_group best groups; top-k of b among them; weights are
             the *unbiased* s of the chosen, renormalised, x routed_scaling_factor
    situ     SiTU-GLU: [b1 tanh(g / b1) sigmoid(g)] * [b2 tanh(u / b2)], b1 = 4, b2 = 25; SiLU-GLU g sigmoid(g) u
    rope     half layout (GPT-NeoX / DeepSeek `rotate_half`): f_i = theta^(-2i/R), angle = pos f_i,
             out = [x1 cos - x2 sin, x2 cos + x1 sin]
    mla      attention in the textbook (non-absorbed) form: per head k = W_UK^T c_kv (+ the shared k_pe),
             v = W_UV^T c_kv, causal softmax((q_nope . k_nope + q_pe . k_pe) scale) over cache slots
             s <= length + t; the simulator computes the absorbed form
    kda      Kimi Delta Attention, one token at a time: causal depthwise conv over [hist, x] + SiLU; per
             head q, k L2-normalised (eps on the sum of squares), q * H^-1/2; g = lb sigmoid(exp(A_log) (z +
             dt_bias)); S <- diag(exp g) S; S <- S + beta k (v - S^T k)^T; o = S^T q; out = o / rms(o) w
             sigmoid(gate)

The inputs are chosen to make the tempting mistakes visible: router groups whose best single score and
best pair disagree, SiTU inputs far outside both betas, RoPE positions where sin is far from 0.
"""

from pathlib import Path

import numpy as np

OUT = Path(__file__).with_name("golden.npz")


def sig(x):
    return 1.0 / (1.0 + np.exp(-x))


# ----------------------------------------------------------------------------- router
def grouped_topk(logits, bias, n_group, topk_group, top_k, scale):
    idx_all, w_all = [], []
    for row, score_logits in enumerate(logits):
        s = [sig(v) for v in score_logits]
        b = [s[e] + bias[e] for e in range(len(s))]
        per = len(s) // n_group
        group_score = []
        for g in range(n_group):
            best = sorted(b[g * per:(g + 1) * per], reverse=True)
            group_score.append(best[0] + best[1])
        groups = sorted(range(n_group), key=lambda g: -group_score[g])[:topk_group]
        eligible = [e for e in range(len(s)) if e // per in groups]
        chosen = sorted(eligible, key=lambda e: -b[e])[:top_k]
        total = sum(s[e] for e in chosen)
        idx_all.append(chosen)
        w_all.append([s[e] / total * scale for e in chosen])
    return np.array(idx_all), np.array(w_all)


def router_case(rng):
    E, G, topk_group, k, M = 16, 4, 2, 4, 3
    logits = rng.standard_normal((M, E)) * 2.0
    bias = rng.standard_normal(E) * 0.1
    # Group 0 of token 0 holds the single best score but a weak second; group 3 two good ones: scoring
    # groups by their best expert alone (top-1) keeps the wrong groups.
    logits[0, 0:4] = [6.0, -6.0, -6.0, -6.0]
    logits[0, 12:16] = [2.5, 2.4, -6.0, -6.0]
    logits[0, 4:8] = [2.0, 1.9, -6.0, -6.0]
    logits[0, 8:12] = [-6.0, -6.0, -6.0, -6.0]
    idx, w = grouped_topk(logits, bias, G, topk_group, k, 2.5)
    top1_idx = grouped_topk_top1(logits, bias, G, topk_group, k)
    assert set(idx[0]) != set(top1_idx[0]), "the case must tell top-2 group scoring from top-1"
    return {"router.logits": logits, "router.bias": bias, "router.n_group": G, "router.topk_group": topk_group,
            "router.top_k": k, "router.scale": 2.5, "router.idx": idx, "router.weight": w}


def grouped_topk_top1(logits, bias, n_group, topk_group, top_k):
    """The mistake the case is built to expose: a group scored by its best expert only."""
    idx = []
    for row in logits:
        s = sig(row)
        b = s + bias
        per = len(s) // n_group
        groups = sorted(range(n_group), key=lambda g: -max(b[g * per:(g + 1) * per]))[:topk_group]
        eligible = [e for e in range(len(s)) if e // per in groups]
        idx.append(sorted(eligible, key=lambda e: -b[e])[:top_k])
    return np.array(idx)


# ----------------------------------------------------------------------------- SiTU-GLU
def situ_case(rng):
    g = rng.standard_normal((4, 8)) * 30.0  # far outside b1 = 4 and around b2 = 25
    u = rng.standard_normal((4, 8)) * 30.0
    b1, b2 = 4.0, 25.0
    situ = np.empty_like(g)
    silu = np.empty_like(g)
    for i in range(g.shape[0]):
        for j in range(g.shape[1]):
            situ[i, j] = (b1 * np.tanh(g[i, j] / b1) * sig(g[i, j])) * (b2 * np.tanh(u[i, j] / b2))
            silu[i, j] = g[i, j] * sig(g[i, j]) * u[i, j]
    return {"glu.g": g, "glu.u": u, "glu.b1": b1, "glu.b2": b2, "glu.situ": situ, "glu.silu": silu}


# ----------------------------------------------------------------------------- RoPE
def rope_case(rng):
    B, T, R, theta = 2, 3, 8, 10000.0
    x = rng.standard_normal((B, T, R))
    pos = np.array([[5, 6, 7], [100, 101, 102]])
    out = np.empty_like(x)
    for b in range(B):
        for t in range(T):
            for i in range(R // 2):
                angle = pos[b, t] * theta ** (-2.0 * i / R)
                x1, x2 = x[b, t, i], x[b, t, i + R // 2]
                out[b, t, i] = x1 * np.cos(angle) - x2 * np.sin(angle)
                out[b, t, i + R // 2] = x2 * np.cos(angle) + x1 * np.sin(angle)
    return {"rope.x": x, "rope.pos": pos, "rope.theta": theta, "rope.out": out}


# ----------------------------------------------------------------------------- MLA
def mla_case(rng):
    B, T, N, Dn, R, Dv, L, S = 2, 2, 2, 4, 2, 4, 6, 7
    lengths = np.array([3, 5])  # cached tokens before the step; this step's T tokens follow them
    q_nope, q_pe = rng.standard_normal((B, T, N, Dn)), rng.standard_normal((B, T, N, R))
    cache = rng.standard_normal((B, S, L + R))  # [c_kv | k_pe] per slot
    w_uk = rng.standard_normal((N, Dn, L)) / np.sqrt(L)  # k_nope[n] = w_uk[n] @ c_kv
    w_uv = rng.standard_normal((N, L, Dv)) / np.sqrt(L)  # v[n] = c_kv @ w_uv[n]
    scale = (Dn + R) ** -0.5
    o = np.zeros((B, T, N, Dv))
    for b in range(B):
        for t in range(T):
            visible = lengths[b] + t + 1
            for n in range(N):
                scores = []
                for s in range(visible):
                    c_kv, k_pe = cache[b, s, :L], cache[b, s, L:]
                    k_nope = w_uk[n] @ c_kv
                    scores.append((q_nope[b, t, n] @ k_nope + q_pe[b, t, n] @ k_pe) * scale)
                p = np.exp(np.array(scores) - max(scores))
                p /= p.sum()
                o[b, t, n] = sum(p[s] * (cache[b, s, :L] @ w_uv[n]) for s in range(visible))
    return {"mla.q_nope": q_nope, "mla.q_pe": q_pe, "mla.cache": cache, "mla.lengths": lengths,
            "mla.w_uk": w_uk, "mla.w_uv": w_uv, "mla.scale": scale, "mla.o": o}


# ----------------------------------------------------------------------------- KDA
def kda_case(rng):
    B, T, N, H, W, lb, eps = 1, 2, 2, 4, 4, -5.0, 1e-5
    C = 3 * N * H
    x = rng.standard_normal((B, T, C))  # pre-conv [q | k | v], each head-major
    conv_w = rng.standard_normal((C, W)) / np.sqrt(W)
    hist = rng.standard_normal((B, C, W - 1))  # oldest first
    z = rng.standard_normal((B, T, N * H))
    dt_bias = 0.1 * rng.standard_normal(N * H)
    a_log = np.log(rng.uniform(1, 16, N))
    beta_logits = rng.standard_normal((B, T, N))
    gate = rng.standard_normal((B, T, N * H))
    o_norm = 1 + 0.1 * rng.standard_normal(H)
    state = rng.standard_normal((B, N, H, H)) / np.sqrt(H)  # S[i = key][j = value]
    S, window = state.copy(), hist.copy()
    out = np.zeros((B, T, N * H))
    for b in range(B):
        for t in range(T):
            y = np.empty(C)
            for c in range(C):
                taps = list(window[b, c]) + [x[b, t, c]]
                y[c] = sum(conv_w[c, w] * taps[w] for w in range(W))
                y[c] = y[c] * sig(y[c])
                window[b, c] = taps[1:]
            for n in range(N):
                q, k, v = (y[part * N * H + n * H: part * N * H + (n + 1) * H] for part in range(3))
                q = q / np.sqrt(np.sum(q * q) + 1e-6) * H ** -0.5
                k = k / np.sqrt(np.sum(k * k) + 1e-6)
                zh = z[b, t, n * H:(n + 1) * H] + dt_bias[n * H:(n + 1) * H]
                alpha = np.exp(lb * sig(np.exp(a_log[n]) * zh))
                beta = sig(beta_logits[b, t, n])
                for i in range(H):
                    S[b, n, i] *= alpha[i]
                u = np.array([sum(S[b, n, i, j] * k[i] for i in range(H)) for j in range(H)])
                for i in range(H):
                    for j in range(H):
                        S[b, n, i, j] += beta * k[i] * (v[j] - u[j])
                o = np.array([sum(S[b, n, i, j] * q[i] for i in range(H)) for j in range(H)])
                normed = o / np.sqrt(np.mean(o * o) + eps) * o_norm
                out[b, t, n * H:(n + 1) * H] = normed * sig(gate[b, t, n * H:(n + 1) * H])
    return {"kda.x": x, "kda.conv_w": conv_w, "kda.hist": hist, "kda.z": z, "kda.dt_bias": dt_bias,
            "kda.a_log": a_log, "kda.beta_logits": beta_logits, "kda.gate": gate, "kda.o_norm": o_norm,
            "kda.state": state, "kda.lower_bound": lb, "kda.eps": eps,
            "kda.out": out, "kda.new_state": S, "kda.new_hist": window}


def golden_arrays() -> dict:
    rng = np.random.default_rng(20261201)
    golden = {}
    for case in (router_case, situ_case, rope_case, mla_case, kda_case):
        golden.update(case(rng))
    return golden


def main() -> None:
    golden = golden_arrays()
    np.savez_compressed(OUT, **golden)
    print(f"wrote {OUT} ({OUT.stat().st_size} B, {len(golden)} arrays)")


if __name__ == "__main__":
    main()
