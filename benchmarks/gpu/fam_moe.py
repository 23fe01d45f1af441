"""Routed-expert grouped GEMMs (family "moe"): one launch = one FC1 or FC2 over the U experts a step touches.

    fc1   y[r, :] = x[token(r)] @ W1[e(r)]^T      K = L (expert input), N = 2F (gate | up concatenated)
    fc2   y[r, :] = h[r] @ W2[e(r)]^T              K = F,               N = L
    r = token * top_k + slot runs over the M * top_k routed rows; e(r) takes exactly U distinct values.

Implementations (Point.impl):
- triton_w4a16          our Triton MXFP4 W4A16 grouped GEMM (what a Hopper deployment of Kimi K3 runs: vLLM
                        fused_moe / Marlin style). Weights [E, N, K/2] uint8, two E2M1 codes per byte, low nibble
                        = even k (the checkpoint layout, = simulator.dtypes.MXFP4 of W^T), scales [E, N, K/32]
                        uint8 E8M0. Dequantized in registers (E2M1 bits -> fp32 x 2^(s-127) -> bf16), bf16 tl.dot,
                        fp32 accumulate, bf16 out. The packed bytes are used as-is: the even-k codes (low nibbles)
                        multiply the even columns of A and the odd-k codes the odd columns, two dots of BLOCK_K/2
                        per K step, so no nibble interleave is needed in registers.
                        Rows are sorted by expert into BLOCK_M-padded blocks (vLLM moe_align_block_size: sorted
                        row ids, one expert id per block; pad rows = M*top_k are masked). Grid = (blocks x
                        N tiles,). BLOCK_M 16 (64 when the average expert gets > 16 rows), BLOCK_N 32 / 64
                        (TILE_CONFIG), BLOCK_K 128. fc1 gathers its A rows from x[M, K] (row // top_k) as
                        fused_moe does; fc2 reads h[M*top_k, F]. The GEMM only: no SiTU in the fc1 epilogue,
                        no routing weight. The sort/align is its own small kernel in engines and is done here
                        outside the timed region: only the GEMM launch is timed.
- grouped_mm_bf16       torch._grouped_mm(x_sorted [R, K], W[win].transpose(-2, -1), offs) with W [E, N, K] bf16:
                        rows already grouped by expert (the gather/permute is outside the timed region).
- scaled_grouped_mm_fp8 torch._scaled_grouped_mm, FP8 e4m3 A and W [E, N, K], rowwise fp32 scales (A per row,
                        W per (expert, n)), bf16 out. DeepSeek-V3's checkpoint is 128x128 block-scaled; torch has
                        no grouped block-scaled FP8 GEMM on sm90, so this is the rowwise-scaled bound.
                        "unsupported: ..." is raised when torch lacks it or it refuses the shapes.

Cold weights: E experts live in memory (896 K3 / 256 DSV3). Launch i uses the contiguous expert window
[i*U, (i+1)*U) (slot i of `slots` windows), slots = min(harness.slots_for(U x bytes per expert), E // U),
so the U experts a launch reads were last read >= 4 x L2 earlier; when U > E/2 there is one window and
U x bytes per expert is already >= 3.6 x L2 (smallest case: TP16 fc2 at U = 449). Routing (which rows
go to which of the U experts) is the same in every window. Weights are generated once per
(impl, model, tp, plan_key) and kept until the (impl, model, tp) changes.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from harness import count_launches, slots_for, time_graph

BLOCK_K = 128
# Tile config by row block (tune_w4a16.py on 3 shapes, then both configs over all 58 points): with 16-row
# blocks (<= 16 rows per expert) BLOCK_N 32 and 3 stages is up to 28 % faster than BLOCK_N 64; with 64-row
# blocks BLOCK_N 32 is up to 5x slower (calibration/h200/superseded/), so those keep BLOCK_N 64, default stages.
TILE_CONFIG = {16: (32, 3), 64: (64, None)}  # BLOCK_M -> (BLOCK_N, num_stages)
CHECK_EXPERTS = 32  # max_err is measured on the rows of the first this-many experts of window 0

DEVICE = "cuda"  # measure() runs here; tests set "cpu" to dry-run the host side under TRITON_INTERPRET=1
_CACHE: dict = {}


def _sync(torch: Any) -> None:
    if DEVICE != "cpu":
        torch.cuda.synchronize()


# ===================================================================== host side (numpy; no torch needed)
def model_dims(model: str) -> tuple[int, int]:
    """(E routed experts, top_k) of a model."""
    from simulator.config import load_model
    cfg = load_model(model)
    return cfg.num_experts, cfg.top_k


def routing(m: int, top_k: int, u: int, seed: int = 0) -> np.ndarray:
    """[M, top_k] local expert ids in [0, U): distinct within a token, every one of the U experts used at
    least once, the remaining slots uniform at random (fixed seed)."""
    if u < top_k or m * top_k < u:
        raise ValueError(f"cannot route M={m} tokens x top_k={top_k} over exactly U={u} experts")
    rng = np.random.default_rng(seed)
    perm = rng.permutation(u)  # the first U flat slots cover every expert once
    out = np.empty((m, top_k), dtype=np.int64)
    for t in range(m):
        row = list(perm[t * top_k:(t + 1) * top_k])
        rest = np.setdiff1d(np.arange(u), row)
        row += list(rng.choice(rest, size=top_k - len(row), replace=False))
        out[t] = rng.permutation(row)
    return out


def align_blocks(expert_of_row: np.ndarray, u: int, block_m: int) -> tuple[np.ndarray, np.ndarray]:
    """vLLM moe_align_block_size: row ids sorted by expert, each expert's run padded to a multiple of
    block_m with the pad id R (= number of rows); one local expert id per block."""
    r = len(expert_of_row)
    ids, experts = [], []
    for e in range(u):
        rows = np.flatnonzero(expert_of_row == e)
        if len(rows) == 0:
            continue
        nb = -(-len(rows) // block_m)
        ids.append(np.concatenate([rows, np.full(nb * block_m - len(rows), r)]))
        experts += [e] * nb
    return np.concatenate(ids).astype(np.int32), np.asarray(experts, dtype=np.int32)


def group_rows(expert_of_row: np.ndarray, u: int) -> tuple[np.ndarray, np.ndarray]:
    """(row ids grouped by expert, offs = cumulative row count per expert, int32) for torch grouped GEMMs."""
    order = np.argsort(expert_of_row, kind="stable")
    counts = np.bincount(expert_of_row, minlength=u)
    return order, np.cumsum(counts).astype(np.int32)


def block_m_for(rows: int, u: int) -> int:
    return 64 if rows / u > 16 else 16


def bytes_per_expert(impl: str, k: int, n: int) -> int:
    if impl == "triton_w4a16":
        return n * k // 2 + n * k // 32
    if impl == "grouped_mm_bf16":
        return n * k * 2
    if impl == "scaled_grouped_mm_fp8":
        return n * k + n * 4
    raise ValueError(f"unknown moe impl {impl!r}")


def windows(impl: str, e: int, u: int, k: int, n: int) -> int:
    """Rotation slots: disjoint windows of U experts, enough for >= 4 x L2 between reuses where E allows."""
    return max(1, min(slots_for(u * bytes_per_expert(impl, k, n)), e // u))


def plan(p: Any) -> dict:
    """Everything measure() decides on the host for a point: routing, rotation, block layout."""
    e, top_k = model_dims(p.model)
    if p.U > e:
        raise ValueError(f"U={p.U} > E={e}")
    idx = routing(p.M, top_k, p.U)
    flat = idx.reshape(-1)
    slots = windows(p.impl, e, p.U, p.K, p.N)
    out = {"E": e, "top_k": top_k, "idx": idx, "slots": slots, "rows": len(flat)}
    if p.impl == "triton_w4a16":
        bm = block_m_for(len(flat), p.U)
        sorted_ids, block_experts = align_blocks(flat, p.U, bm)
        out.update(block_m=bm, sorted_ids=sorted_ids, block_experts=block_experts)
    else:
        order, offs = group_rows(flat, p.U)
        out.update(order=order, offs=offs)
    return out


# ===================================================================== the Triton kernel
def interpreting() -> bool:
    """TRITON_INTERPRET=1: Triton 3.9's CPU interpreter computes bf16 x bf16 tl.dot wrongly (it multiplies
    the raw bf16 bit patterns), so under the interpreter the kernels upcast both operands to fp32 first —
    exact, since they hold bf16 values. On a GPU the bf16 MMA runs."""
    import os
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


triton = tl = None  # imported on first use: importing this module (host side) never imports Triton


def import_triton():
    """(triton, triton.language), or RuntimeError("unsupported: ...") where Triton is missing."""
    try:
        import triton as _triton
        import triton.language as _tl
    except ImportError as exc:
        raise RuntimeError("unsupported: Triton is not installed") from exc
    return _triton, _tl


def _define_kernels() -> None:
    """Import Triton and define the kernels as module globals (jit functions resolve each other and `tl`
    through the module's globals), on first use, so TRITON_INTERPRET set before that first use applies."""
    global triton, tl, _e2m1_times_scale, moe_w4a16_mxfp4
    if triton is not None:
        return
    triton, tl = import_triton()

    @triton.jit
    def _e2m1_times_scale(code, scale_f):
        """E2M1 code (int32, 0..15: sign, 2-bit exponent, 1-bit mantissa) -> bf16 value x scale: the fp32
        bit pattern is built directly (e > 0: 2^(e-1) (1 + m/2); e = 0: m / 2), then one exact multiply
        by the power-of-two E8M0 scale."""
        e2 = (code >> 1) & 3
        m1 = code & 1
        bits = tl.where(e2 == 0, m1 * (126 << 23), ((e2 + 126) << 23) | (m1 << 22)) | ((code >> 3) << 31)
        return (bits.to(tl.float32, bitcast=True) * scale_f).to(tl.bfloat16)

    @triton.jit
    def moe_w4a16_mxfp4(a_ptr, w_ptr, s_ptr, c_ptr, sorted_ids_ptr, block_expert_ptr,
                        N, K, R, stride_am, stride_we, stride_wn, stride_se, stride_sn, stride_cm,
                        A_DIV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        DOT_F32: tl.constexpr):
        pid = tl.program_id(0)
        n_tiles = tl.cdiv(N, BLOCK_N)
        pid_m = pid // n_tiles
        pid_n = pid % n_tiles
        expert = tl.load(block_expert_ptr + pid_m).to(tl.int64)
        row = tl.load(sorted_ids_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))  # [BM] routed row ids
        row_ok = row < R
        a_row = (row // A_DIV).to(tl.int64)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = offs_n < N
        HALF: tl.constexpr = BLOCK_K // 2
        offs_kp = tl.arange(0, HALF)  # packed byte index within the K step: elements 2j (low), 2j+1 (high)
        a_base = a_ptr + a_row[:, None] * stride_am + 2 * offs_kp[None, :]
        w_base = w_ptr + expert * stride_we + offs_n[None, :].to(tl.int64) * stride_wn + offs_kp[:, None]
        s_base = s_ptr + expert * stride_se + offs_n[None, :].to(tl.int64) * stride_sn + offs_kp[:, None] // 16
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            a_even = tl.load(a_base + k0, mask=row_ok[:, None], other=0.0)
            a_odd = tl.load(a_base + k0 + 1, mask=row_ok[:, None], other=0.0)
            packed = tl.load(w_base + k0 // 2, mask=n_ok[None, :], other=0).to(tl.int32)  # [HALF, BN]
            scale = tl.load(s_base + k0 // 32, mask=n_ok[None, :], other=0).to(tl.int32)
            scale_f = (scale << 23).to(tl.float32, bitcast=True)  # E8M0: 2^(s - 127)
            w_even = _e2m1_times_scale(packed & 0xF, scale_f)  # low nibbles: k = k0 + 2j
            w_odd = _e2m1_times_scale(packed >> 4, scale_f)  # high nibbles: k = k0 + 2j + 1
            if DOT_F32:  # the CPU interpreter's bf16 tl.dot is wrong; the same values in fp32 are exact
                acc = tl.dot(a_even.to(tl.float32), w_even.to(tl.float32), acc)
                acc = tl.dot(a_odd.to(tl.float32), w_odd.to(tl.float32), acc)
            else:
                acc = tl.dot(a_even, w_even, acc)
                acc = tl.dot(a_odd, w_odd, acc)
        c = c_ptr + row[:, None].to(tl.int64) * stride_cm + offs_n[None, :]
        tl.store(c, acc.to(tl.bfloat16), mask=row_ok[:, None] & n_ok[None, :])



def w4a16_kernel():
    _define_kernels()
    return moe_w4a16_mxfp4


def w4a16_launch(a, w, s, c, sorted_ids, block_experts, n_blocks: int, a_div: int, block_m: int, num_warps: int = 4,
                 num_stages: int | None = None, block_n: int | None = None):
    """One launch of the grouped GEMM. a [rows_a, K] bf16, w [E, N, K/2] u8, s [E, N, K/32] u8, c [R, N] bf16."""
    kernel = w4a16_kernel()
    n, k2 = w.shape[1], w.shape[2]
    k = 2 * k2
    if k % BLOCK_K:
        raise ValueError(f"K={k} must be a multiple of BLOCK_K={BLOCK_K}")
    if a.stride(1) != 1 or w.stride(2) != 1 or s.stride(2) != 1 or c.stride(1) != 1:
        raise ValueError("inner dimensions must be contiguous")
    tuned_n, tuned_stages = TILE_CONFIG.get(block_m, (64, None))
    block_n, num_stages = block_n or tuned_n, num_stages or tuned_stages
    grid = (n_blocks * math.ceil(n / block_n),)
    extra = {} if num_stages is None else {"num_stages": num_stages}
    kernel[grid](a, w, s, c, sorted_ids, block_experts, n, k, c.shape[0], a.stride(0), w.stride(0), w.stride(1),
                 s.stride(0), s.stride(1), c.stride(0), A_DIV=a_div, BLOCK_M=block_m, BLOCK_N=block_n,
                 BLOCK_K=BLOCK_K, DOT_F32=interpreting(), num_warps=num_warps, **extra)


def dequant_torch(torch: Any, w, s):
    """[G, N, K/2] u8 + [G, N, K/32] u8 -> [G, N, K] fp32, the same decode as simulator.dtypes.mxfp4_dequantize."""
    table = torch.tensor([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], dtype=torch.float32,
                         device=w.device)
    lo, hi = table[(w & 0xF).long()], table[(w >> 4).long()]
    vals = torch.stack([lo, hi], dim=-1).reshape(*w.shape[:-1], 2 * w.shape[-1])
    scale = torch.exp2(s.float() - 127.0)
    return (vals.reshape(*s.shape, 32) * scale[..., None]).reshape(vals.shape)


# ===================================================================== measure
def _weights(torch: Any, p: Any, e: int) -> dict:
    key = (p.impl, p.model, p.tp, p.plan_key)
    if key not in _CACHE:
        for old in [k for k in _CACHE if k[:3] != key[:3]]:
            del _CACHE[old]
        if DEVICE != "cpu":
            torch.cuda.empty_cache()
        dev, g = torch.device(DEVICE), torch.Generator(device=DEVICE).manual_seed(1)
        n, k = p.N, p.K
        if p.impl == "triton_w4a16":
            w = torch.randint(0, 256, (e, n, k // 2), device=dev, dtype=torch.uint8, generator=g)
            s = torch.randint(120, 124, (e, n, k // 32), device=dev, dtype=torch.uint8, generator=g)  # 2^-7..2^-4
            _CACHE[key] = {"w": w, "s": s}
        elif p.impl == "grouped_mm_bf16":
            w = torch.randn(e, n, k, device=dev, dtype=torch.bfloat16, generator=g) * k ** -0.5
            _CACHE[key] = {"w": w}
        else:
            w = torch.empty(e, n, k, device=dev, dtype=torch.float8_e4m3fn)
            for i in range(0, e, 32):  # in chunks: no E x N x K bf16 temporary
                w[i:i + 32] = torch.randn(min(32, e - i), n, k, device=dev, generator=g).to(torch.float8_e4m3fn)
            ws = torch.rand(e, n, device=dev, dtype=torch.float32, generator=g) * 0.01 + 0.01
            _CACHE[key] = {"w": w, "ws": ws}
    return _CACHE[key]


def moe_calls(p: Any, torch: Any) -> tuple[list, float]:
    """(one launch per rotation window, max relative error of the first call against a torch reference)."""
    hp = plan(p)
    if p.impl == "triton_w4a16":
        return _triton_calls(p, torch, hp)
    if p.impl == "grouped_mm_bf16":
        return _grouped_calls(p, torch, hp)
    if p.impl == "scaled_grouped_mm_fp8":
        return _scaled_calls(p, torch, hp)
    raise ValueError(f"unknown moe impl {p.impl!r}")


def measure(p: Any, torch: Any) -> dict:
    calls, ref_err = moe_calls(p, torch)
    big = p.U * bytes_per_expert(p.impl, p.K, p.N) > (512 << 20)
    res = time_graph(torch, calls, reps=max(16 if big else 32, len(calls)), replays=10 if big else 20)
    res["launches"] = count_launches(torch, calls[0])
    res["max_err"] = ref_err
    return res


def _a_rows(torch: Any, p: Any, hp: dict):
    """fc1: x [M, K] (rows gathered by token = row // top_k); fc2: h [M*top_k, K]."""
    g = torch.Generator(device=DEVICE).manual_seed(2)
    rows = p.M if p.plan_key == "fc1" else hp["rows"]
    a = torch.randn(rows, p.K, device=DEVICE, dtype=torch.bfloat16, generator=g)
    return a, (hp["top_k"] if p.plan_key == "fc1" else 1)


def _max_rel_err(torch: Any, pairs) -> float:
    """max |y - ref| / max |ref| over (y, ref) pairs: the GPU result against an fp32 torch reference on
    the rows of the first CHECK_EXPERTS experts of the first call."""
    err = max(float((y.float() - r).abs().max()) for y, r in pairs)
    return err / max(float(r.abs().max()) for _, r in pairs)


def _triton_calls(p: Any, torch: Any, hp: dict):
    wd = _weights(torch, p, hp["E"])
    a, a_div = _a_rows(torch, p, hp)
    sorted_ids = torch.tensor(hp["sorted_ids"], device=DEVICE)
    n_blocks = len(hp["block_experts"])
    c = torch.empty(hp["rows"], p.N, device=DEVICE, dtype=torch.bfloat16)
    block_experts = [torch.tensor(hp["block_experts"] + i * p.U, device=DEVICE) for i in range(hp["slots"])]
    calls = [(lambda be=be: w4a16_launch(a, wd["w"], wd["s"], c, sorted_ids, be, n_blocks, a_div, hp["block_m"]))
             for be in block_experts]
    calls[0]()
    _sync(torch)
    uc = min(p.U, CHECK_EXPERTS)
    flat = torch.tensor(hp["idx"].reshape(-1), device=DEVICE)
    rows = torch.arange(hp["rows"], device=DEVICE)

    def ref(e: int):  # window 0 = experts [0, U): local id = global id
        r = rows[flat == e]
        return c[r], a[r // a_div].float() @ dequant_torch(torch, wd["w"][e:e + 1], wd["s"][e:e + 1])[0].T

    return calls, _max_rel_err(torch, [ref(e) for e in range(uc)])


def _grouped_inputs(torch: Any, p: Any, hp: dict):
    a, a_div = _a_rows(torch, p, hp)
    order = torch.tensor(hp["order"], device=DEVICE)
    a_sorted = a[order // a_div].contiguous()  # the permute is outside the timed region
    offs = torch.tensor(hp["offs"], device=DEVICE, dtype=torch.int32)
    return a_sorted, offs


def _grouped_calls(p: Any, torch: Any, hp: dict):
    if not hasattr(torch, "_grouped_mm"):
        raise RuntimeError(f"unsupported: torch {torch.__version__} has no torch._grouped_mm")
    wd = _weights(torch, p, hp["E"])
    a_sorted, offs = _grouped_inputs(torch, p, hp)
    u = p.U
    wins = [wd["w"][i * u:(i + 1) * u].transpose(-2, -1) for i in range(hp["slots"])]  # [U, K, N] views
    calls = [(lambda w=w: torch._grouped_mm(a_sorted, w, offs=offs)) for w in wins]
    try:
        y = calls[0]()
        _sync(torch)
    except (RuntimeError, NotImplementedError, TypeError) as exc:
        raise RuntimeError(f"unsupported: torch._grouped_mm refused M={p.M} U={u} K={p.K} N={p.N}: {exc}") from exc
    bounds = np.concatenate([[0], hp["offs"]])
    pairs = [(y[lo:hi], a_sorted[lo:hi].float() @ wd["w"][e].float().T)
             for e, (lo, hi) in enumerate(zip(bounds[:CHECK_EXPERTS], bounds[1:CHECK_EXPERTS + 1]))]
    return calls, _max_rel_err(torch, pairs)


def _scaled_calls(p: Any, torch: Any, hp: dict):
    if not hasattr(torch, "_scaled_grouped_mm"):
        raise RuntimeError(f"unsupported: torch {torch.__version__} has no torch._scaled_grouped_mm")
    wd = _weights(torch, p, hp["E"])
    a_bf16, offs = _grouped_inputs(torch, p, hp)
    amax = a_bf16.float().abs().amax(dim=1).clamp_min(1e-12)
    a_scale = (amax / 448.0).float().contiguous()  # rowwise: one fp32 scale per routed row
    a_fp8 = (a_bf16.float() / a_scale[:, None]).to(torch.float8_e4m3fn)
    u = p.U
    wins = [(wd["w"][i * u:(i + 1) * u].transpose(-2, -1), wd["ws"][i * u:(i + 1) * u]) for i in range(hp["slots"])]

    def call(w, ws):
        return lambda: torch._scaled_grouped_mm(a_fp8, w, a_scale, ws, offs=offs, out_dtype=torch.bfloat16)

    calls = [call(w, ws) for w, ws in wins]
    try:
        y = calls[0]()
        _sync(torch)
    except (RuntimeError, NotImplementedError, TypeError) as exc:
        raise RuntimeError(f"unsupported: torch._scaled_grouped_mm refused M={p.M} U={u} K={p.K} N={p.N} "
                           f"(rowwise FP8, sm90): {exc}") from exc
    bounds = np.concatenate([[0], hp["offs"]])
    pairs = [(y[lo:hi], (a_fp8[lo:hi].float() * a_scale[lo:hi, None]) @ (wd["w"][e].float() * wd["ws"][e][:, None]).T)
             for e, (lo, hi) in enumerate(zip(bounds[:CHECK_EXPERTS], bounds[1:CHECK_EXPERTS + 1]))]
    return calls, _max_rel_err(torch, pairs)


# ===================================================================== check (interpreter or GPU)
def check(device: str) -> list[tuple[str, bool, str]]:
    """The Triton W4A16 grouped GEMM against simulator.dtypes.mxfp4_dequantize + a float64 numpy GEMM."""
    import torch

    from simulator.dtypes import mxfp4_quantize
    out = []
    for plan_key, m, top_k, u, e, k, n, bm in (("fc1", 3, 4, 6, 9, 256, 80, 16), ("fc2", 5, 2, 4, 6, 128, 64, 16),
                                               ("fc1", 20, 4, 5, 7, 128, 64, 64)):
        rng = np.random.default_rng(7)
        w_f = rng.standard_normal((e, n, k)).astype(np.float32) * 0.05
        w_f[0, :, :32] *= 1e-3  # a block with a very different scale
        q = mxfp4_quantize(w_f)
        from simulator.dtypes import mxfp4_dequantize
        w_ref = mxfp4_dequantize(q).astype(np.float64)  # [E, N, K]
        idx = routing(m, top_k, u, seed=3)
        offset = e - u  # window not at 0: the expert ids must be honoured
        flat = idx.reshape(-1)
        rows_a = m if plan_key == "fc1" else m * top_k
        a = torch.randn(rows_a, k, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
        a_div = top_k if plan_key == "fc1" else 1
        sorted_ids, block_experts = align_blocks(flat, u, bm)
        dev = torch.device(device)
        c = torch.full((m * top_k, n), float("nan"), dtype=torch.bfloat16, device=dev)
        w4a16_launch(a.to(dev), torch.from_numpy(q.packed).to(dev),
                     torch.from_numpy(q.scales.view(np.uint8).copy()).to(dev), c,
                     torch.from_numpy(sorted_ids).to(dev), torch.from_numpy(block_experts + offset).to(dev),
                     len(block_experts), a_div, bm)
        a64 = a.float().numpy().astype(np.float64)
        ref = np.stack([a64[r // a_div] @ w_ref[flat[r] + offset].T for r in range(m * top_k)])
        y = c.float().cpu().numpy()
        err = float(np.nanmax(np.abs(y - ref)) / np.abs(ref).max()) if np.isfinite(y).all() else float("inf")
        out.append((f"w4a16_{plan_key}[M={m},k={top_k},U={u},K={k},N={n},BM={bm}]", err < 1e-2,
                    f"max |err| / max |ref| = {err:.2e} (tol 1e-2: bf16 out, interpreter truncates: 1 ulp)"))
    return out
