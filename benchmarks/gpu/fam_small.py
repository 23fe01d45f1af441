"""The plans' small kernels (family "small"): one Triton launch each, Kimi K3 TP8 shapes, M in {1, 8, 64, 256}.

    attn_res_pre   prefix += delta; AttnRes mix over n_src sources (blocks..., prefix): per source
                   score = <v / rms(v), norm_w * proj_w>, online softmax over sources, h = sum p_s v_s;
                   x = RMSNorm(h) * input_norm; writes prefix and x.      grid (M,), one CTA per token
    attn_res_post  the same kernel: prefix += attention output, mix over n_src sources, post-attention norm
                   (simulator/plans/common.attn_res_post_effect: the post kernel also adds into the prefix)
    shared_act     SiTU-and-mul [M, 2F] -> [M, F] (b1 = 4, b2 = 25)       grid (M, F / 1024)
    topk           fp32 logits [M, E] -> sigmoid, + bias (selection only), top-16 by repeated argmax (lower
                   index wins ties, as router.route_fused), weights renormalised from the unbiased scores
                   x routed_scaling_factor; ids int32, weights fp32      grid (M,)
    finalize       [M, k, L] bf16 slot outputs x fp32 weights [M, k] -> [M, L] bf16   grid (M, L / 1024)
    latent_norm    RMSNorm of the latent slice [:, :L] of the reduced [M, L + D] buffer, read in place
                   (row stride L + D, as the plan says)                  grid (M,)
    tail_concat    [M, L] and [M, D] -> [M, L + D]                         grid (M, (L + D) / 1024)
    tail_add       [M, D] + [M, D] -> [M, D]                               grid (M, D / 1024)
    empty_kernel   launch_floor: a 1-CTA kernel that writes one value, back to back in one graph.

All math in fp32 registers, bf16 in / out except where noted. Inputs rotate over harness.slots_for(bytes
read) buffers, up to 4096 and >= 4 x L2 at every size, so every input is read cold from HBM, as the cost
model assumes (in a decode step the producer kernel may just have written them into L2: the cold figure is
the upper one). The small weight vectors are shared.
Numerics: `check(device)` against simulator/ops (norm.attn_res_mix / rms_norm, experts.glu /
expert_finalize, router.route_fused).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fam_moe import import_triton
from harness import count_launches, slots_for, time_graph

DEVICE = "cuda"  # tests set "cpu" to run the same code under TRITON_INTERPRET=1
BLOCK = 1024

triton = tl = None  # imported on first use (see _define_kernels)


def _cfg():
    from simulator.config import load_model
    return load_model("kimi-k3")


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _define_kernels() -> None:
    """Import Triton and define the kernels as module globals on first use (jit functions resolve each
    other and `tl` through the module's globals), so TRITON_INTERPRET set before that applies."""
    global triton, tl, _tanh, attn_res_kernel, situ_mul_kernel, topk_kernel, finalize_kernel, rms_norm_kernel
    global concat_kernel, add_kernel, empty_kernel
    if triton is not None:
        return
    triton, tl = import_triton()

    @triton.jit
    def _tanh(x):
        return 1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0)  # exact limits +-1 for large |x| (exp -> inf / 0)

    @triton.jit
    def attn_res_kernel(delta_ptr, blocks_ptr, prefix_ptr, prefix_out_ptr, x_ptr, norm_w_ptr, proj_w_ptr,
                        in_w_ptr, D, stride_bs, eps, NB: tl.constexpr, BLOCK_D: tl.constexpr):
        """prefix' = prefix + delta; online softmax over (blocks..., prefix') of <v/rms(v), norm_w*proj_w>;
        x = RMSNorm(sum p_s v_s) * in_w. One CTA per token; each source is read once."""
        t = tl.program_id(0).to(tl.int64)
        offs = tl.arange(0, BLOCK_D)
        ok = offs < D
        row = t * D + offs
        query = tl.load(norm_w_ptr + offs, mask=ok, other=0.0).to(tl.float32) * \
            tl.load(proj_w_ptr + offs, mask=ok, other=0.0).to(tl.float32)
        prefix = tl.load(prefix_ptr + row, mask=ok, other=0.0).to(tl.float32) + \
            tl.load(delta_ptr + row, mask=ok, other=0.0).to(tl.float32)
        tl.store(prefix_out_ptr + row, prefix.to(prefix_out_ptr.dtype.element_ty), mask=ok)
        m_run = -float("inf")
        l_run = 0.0
        h = tl.zeros([BLOCK_D], dtype=tl.float32)
        for s in tl.static_range(NB + 1):
            if s < NB:
                v = tl.load(blocks_ptr + s * stride_bs + row, mask=ok, other=0.0).to(tl.float32)
            else:
                v = prefix
            rms = tl.sqrt(tl.sum(v * v, axis=0) / D + eps)
            score = tl.sum(v * query, axis=0) / rms
            m_new = tl.maximum(m_run, score)
            alpha = tl.exp(m_run - m_new)
            p = tl.exp(score - m_new)
            h = h * alpha + p * v
            l_run = l_run * alpha + p
            m_run = m_new
        h = h / l_run
        inv = 1.0 / tl.sqrt(tl.sum(h * h, axis=0) / D + eps)
        w = tl.load(in_w_ptr + offs, mask=ok, other=0.0).to(tl.float32)
        tl.store(x_ptr + row, (h * inv * w).to(x_ptr.dtype.element_ty), mask=ok)

    @triton.jit
    def situ_mul_kernel(x_ptr, out_ptr, F, b1, b2, BLOCK: tl.constexpr):
        t = tl.program_id(0).to(tl.int64)
        offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        ok = offs < F
        g = tl.load(x_ptr + t * 2 * F + offs, mask=ok, other=0.0).to(tl.float32)
        u = tl.load(x_ptr + t * 2 * F + F + offs, mask=ok, other=0.0).to(tl.float32)
        sig = 1.0 / (1.0 + tl.exp(-g))
        y = (b1 * _tanh(g / b1) * sig) * (b2 * _tanh(u / b2))
        tl.store(out_ptr + t * F + offs, y.to(out_ptr.dtype.element_ty), mask=ok)

    @triton.jit
    def topk_kernel(logits_ptr, bias_ptr, ids_ptr, w_ptr, E, scaling, K: tl.constexpr, BLOCK_E: tl.constexpr):
        t = tl.program_id(0).to(tl.int64)
        offs = tl.arange(0, BLOCK_E)
        ok = offs < E
        logit = tl.load(logits_ptr + t * E + offs, mask=ok, other=0.0)
        score = 1.0 / (1.0 + tl.exp(-logit))
        biased = tl.where(ok, score + tl.load(bias_ptr + offs, mask=ok, other=0.0), -float("inf"))
        kk = tl.arange(0, K)
        ids = tl.zeros([K], dtype=tl.int32)
        ws = tl.zeros([K], dtype=tl.float32)
        for j in tl.static_range(K):
            best = tl.max(biased, axis=0)
            idx = tl.min(tl.where(biased == best, offs, BLOCK_E), axis=0)  # lowest index among ties
            chosen = offs == idx
            ids = tl.where(kk == j, idx, ids)
            ws = tl.where(kk == j, tl.sum(tl.where(chosen, score, 0.0), axis=0), ws)
            biased = tl.where(chosen, -float("inf"), biased)
        ws = ws / (tl.sum(ws, axis=0) + 1e-20) * scaling
        tl.store(ids_ptr + t * K + kk, ids)
        tl.store(w_ptr + t * K + kk, ws)

    @triton.jit
    def finalize_kernel(y_ptr, w_ptr, out_ptr, L, K: tl.constexpr, BLOCK: tl.constexpr):
        t = tl.program_id(0).to(tl.int64)
        offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        ok = offs < L
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for j in tl.static_range(K):
            wj = tl.load(w_ptr + t * K + j)
            acc += wj * tl.load(y_ptr + (t * K + j) * L + offs, mask=ok, other=0.0).to(tl.float32)
        tl.store(out_ptr + t * L + offs, acc.to(out_ptr.dtype.element_ty), mask=ok)

    @triton.jit
    def rms_norm_kernel(x_ptr, w_ptr, out_ptr, N, stride_x, eps, BLOCK_N: tl.constexpr):
        t = tl.program_id(0).to(tl.int64)
        offs = tl.arange(0, BLOCK_N)
        ok = offs < N
        x = tl.load(x_ptr + t * stride_x + offs, mask=ok, other=0.0).to(tl.float32)
        inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / N + eps)
        w = tl.load(w_ptr + offs, mask=ok, other=0.0).to(tl.float32)
        tl.store(out_ptr + t * N + offs, (x * inv * w).to(out_ptr.dtype.element_ty), mask=ok)

    @triton.jit
    def concat_kernel(a_ptr, b_ptr, out_ptr, LA, LB, BLOCK: tl.constexpr):
        t = tl.program_id(0).to(tl.int64)
        offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        in_a = offs < LA
        in_b = (offs >= LA) & (offs < LA + LB)
        va = tl.load(a_ptr + t * LA + offs, mask=in_a, other=0.0)
        vb = tl.load(b_ptr + t * LB + (offs - LA), mask=in_b, other=0.0)
        tl.store(out_ptr + t * (LA + LB) + offs, tl.where(in_a, va, vb), mask=offs < LA + LB)

    @triton.jit
    def add_kernel(a_ptr, b_ptr, out_ptr, D, BLOCK: tl.constexpr):
        t = tl.program_id(0).to(tl.int64)
        offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        ok = offs < D
        a = tl.load(a_ptr + t * D + offs, mask=ok, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + t * D + offs, mask=ok, other=0.0).to(tl.float32)
        tl.store(out_ptr + t * D + offs, (a + b).to(out_ptr.dtype.element_ty), mask=ok)

    @triton.jit
    def empty_kernel(out_ptr):
        tl.store(out_ptr, 1.0)


def _need_triton() -> None:
    _define_kernels()


# ===================================================================== launchers (one launch each)
def attn_res(delta, blocks, prefix, prefix_out, x, norm_w, proj_w, in_w, eps: float) -> None:
    """delta, prefix, prefix_out, x [M, D]; blocks [NB, M, D] (NB = n_src - 1; the prefix is the last source)."""
    _need_triton()
    m, d = x.shape
    attn_res_kernel[(m,)](delta, blocks, prefix, prefix_out, x, norm_w, proj_w, in_w, d, blocks.stride(0), eps,
                          NB=blocks.shape[0], BLOCK_D=_pow2(d), num_warps=16 if d > 4096 else 8)


def situ_mul(x, out, b1: float, b2: float) -> None:
    _need_triton()
    m, f = out.shape
    situ_mul_kernel[(m, triton.cdiv(f, BLOCK))](x, out, f, b1, b2, BLOCK=BLOCK, num_warps=4)


def topk(logits, bias, ids, weights, scaling: float) -> None:
    _need_triton()
    m, e = logits.shape
    topk_kernel[(m,)](logits, bias, ids, weights, e, scaling, K=ids.shape[1], BLOCK_E=_pow2(e), num_warps=4)


def finalize(y, w, out) -> None:
    _need_triton()
    m, k, l_ = y.shape
    finalize_kernel[(m, triton.cdiv(l_, BLOCK))](y, w, out, l_, K=k, BLOCK=BLOCK, num_warps=4)


def rms_norm(x, w, out, eps: float) -> None:
    """x may be a column slice of a wider buffer (row stride x.stride(0))."""
    _need_triton()
    m, n = out.shape
    if x.stride(1) != 1:
        raise ValueError("rms_norm needs unit column stride")
    rms_norm_kernel[(m,)](x, w, out, n, x.stride(0), eps, BLOCK_N=_pow2(n), num_warps=8)


def concat(a, b, out) -> None:
    _need_triton()
    m = a.shape[0]
    concat_kernel[(m, triton.cdiv(out.shape[1], BLOCK))](a, b, out, a.shape[1], b.shape[1], BLOCK=BLOCK, num_warps=4)


def add(a, b, out) -> None:
    _need_triton()
    m, d = a.shape
    add_kernel[(m, triton.cdiv(d, BLOCK))](a, b, out, d, BLOCK=BLOCK, num_warps=4)


def empty(out) -> None:
    _need_triton()
    empty_kernel[(1,)](out, num_warps=1)


# ===================================================================== measure
def read_bytes(p: Any) -> int:
    """Bytes one launch reads from its rotated inputs (weights vectors excluded)."""
    m, n = p.M, p.N
    return {"attn_res_pre": (p.n_src + 1) * m * n * 2, "attn_res_post": (p.n_src + 1) * m * n * 2,
            "shared_act": 2 * m * n * 2, "topk": m * n * 4, "finalize": m * p.K * n * 2 + m * p.K * 4,
            "latent_norm": m * n * 2, "tail_concat": m * n * 2, "tail_add": 2 * m * n * 2}.get(p.plan_key, 0)


def builders(p: Any, torch: Any, slots: int) -> list:
    """One zero-argument launch per rotation slot for point p (inputs on DEVICE, fixed seed)."""
    cfg, dev = _cfg(), torch.device(DEVICE)
    g = torch.Generator(device=DEVICE).manual_seed(0)
    bf = torch.bfloat16

    def rnd(*shape, dtype=bf, scale=1.0):
        return (torch.randn(*shape, device=dev, generator=g) * scale).to(dtype)

    m, n, key, eps = p.M, p.N, p.plan_key, cfg.rms_norm_eps
    if key in ("attn_res_pre", "attn_res_post"):
        if p.n_src < 1:
            raise ValueError(f"{key} needs n_src >= 1, got {p.n_src}")
        ws = [rnd(n) for _ in range(3)]
        outs = [torch.empty(m, n, device=dev, dtype=bf) for _ in range(2)]
        ins = [(rnd(m, n), rnd(p.n_src - 1, m, n), rnd(m, n)) for _ in range(slots)]
        return [(lambda i=i: attn_res(i[0], i[1], i[2], outs[0], outs[1], *ws, eps)) for i in ins]
    if key == "shared_act":
        out = torch.empty(m, n, device=dev, dtype=bf)
        ins = [rnd(m, 2 * n, scale=3.0) for _ in range(slots)]
        return [(lambda x=x: situ_mul(x, out, cfg.situ_beta, cfg.situ_linear_beta)) for x in ins]
    if key == "topk":
        if p.K != cfg.top_k or n != cfg.num_experts or cfg.n_group != 1:
            raise ValueError(f"topk kernel is plain top-k over E={cfg.num_experts}, k={cfg.top_k} (n_group 1)")
        bias = rnd(n, dtype=torch.float32, scale=0.01)
        ids = torch.empty(m, p.K, device=dev, dtype=torch.int32)
        w = torch.empty(m, p.K, device=dev, dtype=torch.float32)
        ins = [rnd(m, n, dtype=torch.float32) for _ in range(slots)]
        return [(lambda x=x: topk(x, bias, ids, w, cfg.routed_scaling_factor)) for x in ins]
    if key == "finalize":
        out = torch.empty(m, n, device=dev, dtype=bf)
        ins = [(rnd(m, p.K, n), torch.rand(m, p.K, device=dev, generator=g)) for _ in range(slots)]
        return [(lambda i=i: finalize(i[0], i[1], out)) for i in ins]
    if key == "latent_norm":
        width = cfg.latent_dim + cfg.hidden_size
        if n != cfg.latent_dim:
            raise ValueError(f"latent_norm N={n} != latent_dim {cfg.latent_dim}")
        w, out = rnd(n), torch.empty(m, n, device=dev, dtype=bf)
        ins = [rnd(m, width)[:, :n] for _ in range(slots)]  # the latent slice, read in place
        return [(lambda x=x: rms_norm(x, w, out, eps)) for x in ins]
    if key == "tail_concat":
        la, lb = cfg.latent_dim, cfg.hidden_size
        if n != la + lb:
            raise ValueError(f"tail_concat N={n} != L + D = {la + lb}")
        out = torch.empty(m, n, device=dev, dtype=bf)
        ins = [(rnd(m, la), rnd(m, lb)) for _ in range(slots)]
        return [(lambda i=i: concat(i[0], i[1], out)) for i in ins]
    if key == "tail_add":
        out = torch.empty(m, n, device=dev, dtype=bf)
        ins = [(rnd(m, n), rnd(m, n)) for _ in range(slots)]
        return [(lambda i=i: add(i[0], i[1], out)) for i in ins]
    raise ValueError(f"no small kernel for plan_key {key!r}")


def small_calls(p: Any, torch: Any) -> list:
    """Every input cold: enough rotation slots for >= 4 x L2 whatever the size."""
    return builders(p, torch, slots_for(read_bytes(p), max_slots=4096))


def measure(p: Any, torch: Any) -> dict:
    if p.impl == "empty_kernel":
        out = torch.zeros(1, device="cuda", dtype=torch.float32)
        calls = [lambda: empty(out)]
        res = time_graph(torch, calls, reps=256, replays=20)
    else:
        # every input cold, as the cost model assumes and as the other families measure: enough slots for
        # >= 4 x L2 whatever the size (up to 4096 launches in one graph; the first run kept at most 64
        # slots, so kernels below 3.75 MB read L2-resident inputs and the law could not fit them)
        calls = small_calls(p, torch)
        res = time_graph(torch, calls, reps=max(32, len(calls)), replays=10 if len(calls) > 256 else 20)
    res["launches"] = count_launches(torch, calls[0])
    return res


# ===================================================================== check (interpreter or GPU)
def _np(t) -> np.ndarray:
    return t.float().cpu().numpy().astype(np.float64)


def _rel(y: np.ndarray, ref: np.ndarray) -> float:
    return float(np.max(np.abs(y - ref)) / max(np.max(np.abs(ref)), 1e-30)) if np.isfinite(y).all() else float("inf")


def check(device: str) -> list[tuple[str, bool, str]]:
    """Every small kernel against its simulator/ops reference on small shapes (bf16 tolerance 1e-2
    relative to the largest reference value; the interpreter truncates to bf16, one ulp = 7.8e-3)."""
    import torch

    from simulator.ops import experts, norm, router
    global DEVICE
    saved, DEVICE = DEVICE, device
    cfg = _cfg()
    out = []
    try:
        g = torch.Generator(device=device).manual_seed(11)

        def rnd(*shape, dtype=torch.bfloat16, scale=1.0):
            return (torch.randn(*shape, device=device, generator=g) * scale).to(dtype)

        tol = 1e-2
        # attn_res: M = 3 tokens, D = 200 (not a power of two), 4 sources (3 blocks + prefix)
        m, d, nb = 3, 200, 3
        delta, blocks, prefix = rnd(m, d), rnd(nb, m, d), rnd(m, d)
        blocks[1] *= 4  # sources of different scale: a non-trivial softmax
        nw, pw, iw = rnd(d), rnd(d), rnd(d)
        p_out, x = torch.empty(m, d, device=device, dtype=torch.bfloat16), torch.empty(m, d, device=device,
                                                                                       dtype=torch.bfloat16)
        attn_res(delta, blocks, prefix, p_out, x, nw, pw, iw, cfg.rms_norm_eps)
        pref_ref = _np(prefix) + _np(delta)
        srcs = [_np(blocks[i]) for i in range(nb)] + [pref_ref]
        h = norm.attn_res_mix_reference(srcs, _np(nw), _np(pw), cfg.rms_norm_eps)
        x_ref = norm.rms_norm_reference(h, _np(iw), cfg.rms_norm_eps)
        err = max(_rel(_np(x), x_ref), _rel(_np(p_out), pref_ref))
        out.append((f"attn_res[M={m},D={d},n_src={nb + 1}]", err < tol, f"rel err {err:.2e} (x and prefix)"))

        # shared_act: SiTU with large inputs (tanh saturation)
        m, f = 3, 300
        xin = rnd(m, 2 * f, scale=8.0)
        y = torch.empty(m, f, device=device, dtype=torch.bfloat16)
        situ_mul(xin, y, cfg.situ_beta, cfg.situ_linear_beta)
        xn = _np(xin)
        ref = experts.glu(xn[:, :f], xn[:, f:], cfg)
        err = _rel(_np(y), ref)
        out.append((f"shared_act[M={m},F={f}]", err < tol, f"rel err {err:.2e}"))

        # topk: E = 896, k = 16, with an exact tie in the biased scores
        m, e, k = 4, cfg.num_experts, cfg.top_k
        logits = rnd(m, e, dtype=torch.float32, scale=2.0)
        logits[0, 10] = logits[0, 3] = 9.0  # tie: lower index must come first
        bias = rnd(e, dtype=torch.float32, scale=0.1)
        bias[10] = bias[3] = 0.0
        ids = torch.empty(m, k, device=device, dtype=torch.int32)
        wts = torch.empty(m, k, device=device, dtype=torch.float32)
        topk(logits, bias, ids, wts, cfg.routed_scaling_factor)
        r = router.route_fused(logits.cpu().numpy(), bias.cpu().numpy(), cfg)
        same_ids = bool((ids.cpu().numpy() == r.topk_idx).all())
        err = float(np.max(np.abs(wts.cpu().numpy() - r.topk_weight)))
        out.append((f"topk[M={m},E={e},k={k}]", same_ids and err < 1e-5,
                    f"ids {'identical (ties incl.)' if same_ids else 'DIFFER'}, weight max abs err {err:.1e}"))

        # finalize
        m, k, l_ = 3, 5, 300
        ys, w = rnd(m, k, l_), torch.rand(m, k, device=device, generator=g)
        o = torch.empty(m, l_, device=device, dtype=torch.bfloat16)
        finalize(ys, w, o)
        ref = experts.expert_finalize(_np(ys), w.cpu().numpy().astype(np.float64))
        err = _rel(_np(o), ref)
        out.append((f"finalize[M={m},k={k},L={l_}]", err < tol, f"rel err {err:.2e}"))

        # latent_norm: a slice [:, :L] of an [M, L + D] buffer
        m, l_, d = 3, 160, 96
        buf, w = rnd(m, l_ + d), rnd(l_)
        o = torch.empty(m, l_, device=device, dtype=torch.bfloat16)
        rms_norm(buf[:, :l_], w, o, cfg.rms_norm_eps)
        ref = norm.rms_norm_reference(_np(buf)[:, :l_], _np(w), cfg.rms_norm_eps)
        err = _rel(_np(o), ref)
        out.append((f"latent_norm[M={m},L={l_} of {l_ + d}]", err < tol, f"rel err {err:.2e}"))

        # tail_concat and tail_add: exact
        a, b = rnd(m, l_), rnd(m, d)
        o = torch.empty(m, l_ + d, device=device, dtype=torch.bfloat16)
        concat(a, b, o)
        ok = bool(torch.equal(o, torch.cat([a, b], dim=1)))
        out.append((f"tail_concat[M={m},{l_}+{d}]", ok, "bit-exact" if ok else "differs from torch.cat"))
        a, b = rnd(m, 1500), rnd(m, 1500)
        o = torch.empty(m, 1500, device=device, dtype=torch.bfloat16)
        add(a, b, o)
        err = _rel(_np(o), _np(a) + _np(b))
        out.append((f"tail_add[M={m},D=1500]", err < tol, f"rel err {err:.2e}"))

        o = torch.zeros(1, device=device)
        empty(o)
        out.append(("empty_kernel", float(o[0]) == 1.0, "writes its one value"))
    finally:
        DEVICE = saved
    return out
