"""The production kernels vLLM 0.33.0 launches on Hopper, called as vLLM calls them, at the plans' shapes.

impl                  kernel (from vllm_wheel.Wheel), and the arguments as vLLM passes them
vllm_marlin_moe       _moe_C.moe_wna16_marlin_gemm (experts/marlin_moe.py): fc1 [M, L] -> [M k, 2F] with top_k k;
                      fc2 [M k, F] -> [M k, L] with top_k 1 and the router weights applied; block_m as vLLM picks it
                      from M k / E; fp32 reduce, no atomics
vllm_triton_moe_bf16  the Triton fused_moe_kernel cut out of fused_moe.py (fused_experts_impl's two launches): bf16
                      weights, vLLM's tuned H200 tile config or its default rules, one-token blocks when M k 4 <= E
vllm_triton_moe_fp8   the same kernel with FP8 weights in 128 x 128 blocks; activations already quantised per
                      (row, 128) group, as vLLM's separate quantisation launch leaves them
flashmla_fp8          _flashmla_extension_C.fwd_kvcache_mla_fp8 (v1/attention/backends/mla/flashmla.py): FP8 query
                      and cache [blocks, 64, 1, 576], causal, descales; the scheduler metadata is made once per step,
                      outside the timed launches
flashmla_bf16         _flashmla_C.dense_decode_fwd: the same with a bf16 query and cache
vllm_fused_recurrent  K3 Triton fused_recurrent_kda, gate fused (kda.py's verify: T tokens per sequence, one state
                      slot per token, the per-token stores)
vllm_packed_decode    K3 Triton fused_recurrent_kda_packed_decode (kda.py's one-token decode, triton backend)
vllm_topk_sigmoid     _moe_C.topk_sigmoid: fp32 router logits, bias, renormalise
vllm_grouped_topk     _moe_C.grouped_topk: one group (K3's configuration), sigmoid scoring
vllm_moe_sum          _moe_C.moe_sum: [M, k, L] -> [M, L]
torch_rms_norm        torch.nn.functional.rms_norm: stand-in, vLLM's is in _C (not carried)
torch_matmul          cuBLAS (fam_dense), as the suite measures dense GEMMs

Timing: harness.time_graph (CUDA graph of back-to-back launches, inputs rotating over >= 4 x L2 where a
call reads less); the KDA state over up to KDA_SLOTS slots, and the small kernels, whose inputs at batch 1
would need thousands of slots, through harness.time_cold (an L2 flush before each launch where 256 slots
fall short). Marlin's weights are random bits in Marlin's tiled layout (the repacking kernel is in
_C): every nibble is a valid E2M1 value, so the time is a real weight stream; `check_marlin` proves the call
is wired right with weights whose every element is 1.0 (a layout-free answer). The Triton MoE, MLA, KDA and
small kernels are checked against float32 references on small shapes (`checks`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from harness import kernel_names, slots_for, time_cold, time_graph

TOP_K, EXPERTS = 16, 896  # Kimi K3
MARLIN_BLOCKS_PER_SM = 4  # marlin_utils.MARLIN_MAX_BLOCKS_PER_SM: the workspace's locks
MLA_PAGE, MLA_DIM, MLA_DV = 64, 576, 512  # FlashMLA's page (block) size, latent + rope width, value width
KDA_D, KDA_LOWER_BOUND = 128, -5.0
KDA_SLOTS = 1024  # state slots: >= 4 x L2 of state at every point (batch 1 at TP16 needs 321)


# ===================================================================== routed experts: Marlin
def marlin_block_m(m: int, experts: int = EXPERTS, top_k: int = TOP_K) -> int:
    """The row block fused_marlin_moe picks: the first of 8..64 with M k / E / block < 0.9."""
    for block in (8, 16, 32, 48, 64):
        if m * top_k / experts / block < 0.9:
            return block
    return 64


def _marlin_weights(torch, e: int, k: int, n: int, fill: int | None = None):
    """[E, K/16, 2N] int32 (Marlin's 4-bit tiles: 16 x 64 nibbles per row of int32s) and [E, K/32, N] E8M0
    scales. Random bits (fill None) or one repeated byte (fill: 0x22 = two E2M1 1.0s, scale 2^0)."""
    if fill is None:
        w = torch.randint(-2 ** 31, 2 ** 31 - 1, (e, k // 16, 2 * n), dtype=torch.int32, device="cuda")
        s = torch.randint(124, 130, (e, k // 32, n), dtype=torch.uint8, device="cuda")
    else:
        w = torch.full((e, k // 16, 2 * n), fill, dtype=torch.int32, device="cuda")
        s = torch.full((e, k // 32, n), 127, dtype=torch.uint8, device="cuda")
    return w, s.view(torch.float8_e8m0fnu)


def _align(wheel, torch, ids, block: int, experts: int = EXPERTS):
    """moe_align_block_size as vLLM sizes its outputs (fused_moe/moe_align_block_size.py)."""
    padded = ids.numel() + experts * (block - 1)
    padded = min(ids.numel() * block, padded)
    sorted_ids = torch.empty(padded, dtype=torch.int32, device="cuda")
    expert_ids = torch.empty(-(-padded // block), dtype=torch.int32, device="cuda")
    n_post = torch.empty(1, dtype=torch.int32, device="cuda")
    wheel.moe.moe_align_block_size(ids, experts, block, sorted_ids, expert_ids, n_post, None, None)
    return sorted_ids, expert_ids, n_post


def _marlin_call(wheel, torch, key: str, a, out, w, s, routed, m: int, k: int, n: int, workspace):
    """One moe_wna16_marlin_gemm launch as _fused_marlin_moe makes it (fc1 or fc2)."""
    sorted_ids, expert_ids, n_post, weights, block = routed
    fc1 = key == "fc1"
    return lambda: wheel.moe.moe_wna16_marlin_gemm(
        a, out, w, None, s, None, None, None, workspace, sorted_ids, expert_ids, n_post, weights, block,
        TOP_K if fc1 else 1, not fc1, wheel.float4_e2m1f, m if fc1 else m * TOP_K, n, k, False, True, False,
        -1, -1, -1)


def _routing(torch, m: int, u: int, window: np.ndarray, seed: int, top_k: int = TOP_K):
    from fam_moe import routing
    local = routing(m, top_k, u, seed)
    return torch.tensor(window[local], dtype=torch.int32, device="cuda")


def marlin(p: Any, torch: Any, wheel) -> dict:
    """fc1 or fc2 at M tokens over exactly U experts; slots use disjoint expert windows while E allows."""
    m, k, n, u = p.M, p.K, p.N, p.U
    w, s = _marlin_weights(torch, EXPERTS, k, n)
    per_expert = k * n // 2 + k * n // 32
    slots = max(1, min(slots_for(u * per_expert), EXPERTS // u))
    perm = np.random.default_rng(1).permutation(EXPERTS)
    block = marlin_block_m(m)
    workspace = torch.zeros(torch.cuda.get_device_properties(0).multi_processor_count * MARLIN_BLOCKS_PER_SM,
                            dtype=torch.int32, device="cuda")
    rows = m if p.plan_key == "fc1" else m * TOP_K
    calls = []
    for i in range(slots):
        ids = _routing(torch, m, u, perm[i * u:(i + 1) * u], seed=i)
        weights = torch.rand(m, TOP_K, device="cuda", dtype=torch.float32)
        routed = (*_align(wheel, torch, ids, block), weights, block)
        a = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
        out = torch.empty(m * TOP_K, n, device="cuda", dtype=torch.bfloat16)
        calls.append(_marlin_call(wheel, torch, p.plan_key, a, out, w, s, routed, m, k, n, workspace))
    res = time_graph(torch, calls, reps=max(32, len(calls)), replays=20)
    res["kernel_names"] = kernel_names(torch, calls[0])
    res["block_m"] = block
    return res


def check_marlin(torch, wheel, key: str = "fc1", m: int = 8, u: int = 32, k: int = 3584, n: int = 768) -> float:
    """Relative error of one Marlin call against the exact answer for all-ones weights: fc1 gives every
    output column of row (t, j) the sum of token t's activations; fc2 the router weight times the row sum."""
    w, s = _marlin_weights(torch, EXPERTS, k, n, fill=0x22222222)
    ids = _routing(torch, m, u, np.arange(EXPERTS), seed=0)
    weights = torch.rand(m, TOP_K, device="cuda", dtype=torch.float32)
    block = marlin_block_m(m)
    routed = (*_align(wheel, torch, ids, block), weights, block)
    rows = m if key == "fc1" else m * TOP_K
    a = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
    out = torch.full((m * TOP_K, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    workspace = torch.zeros(torch.cuda.get_device_properties(0).multi_processor_count * MARLIN_BLOCKS_PER_SM,
                            dtype=torch.int32, device="cuda")
    _marlin_call(wheel, torch, key, a, out, w, s, routed, m, k, n, workspace)()
    torch.cuda.synchronize()
    row_sum = a.float().sum(-1)
    want = (row_sum.repeat_interleave(TOP_K) if key == "fc1" else row_sum * weights.flatten())[:, None].expand(-1, n)
    print(f"check marlin {key}: output / exact answer, median {float((out.float() / want).median()):.4f}", flush=True)
    return float((out.float() - want).norm() / want.norm())


# ===================================================================== routed experts: vLLM's Triton fused_moe
TRITON_MOE_BLOCK = {"vllm_triton_moe_bf16": None, "vllm_triton_moe_fp8": (128, 128)}  # impl -> weight scale block


def triton_moe_config(wheel, m: int, e: int, inter: int, hidden: int, top_k: int, block) -> tuple[dict, str]:
    """(tile config, its source) as try_get_optimal_moe_config picks it: vLLM's tuned H200 file for (E, N =
    per-rank intermediate size, dtype, block) at the nearest M, else vLLM's default rules (get_default_config)."""
    dtype = "fp8_w8a8" if block else None
    name = (f"E={e},N={inter},device_name=NVIDIA_H200" + (f",dtype={dtype}" if dtype else "")
            + (f",block_shape=[{block[0]},{block[1]}]" if block else "") + ".json")
    path = wheel.moe_configs / name
    if path.is_file():
        import json
        tuned = {int(k): v for k, v in json.loads(path.read_text()).items() if k != "triton_version"}
        return dict(tuned[min(tuned, key=lambda x: abs(x - m))]), name
    block = list(block) if block else None
    return wheel.fused_moe.get_default_config(m, e, inter, hidden, top_k, dtype, block), "default"


def _triton_moe_call(torch, wheel, p: Any, w, w_scale, ids, weights, cfg: dict, e: int, top_k: int):
    """One fused_moe_kernel launch as invoke_fused_moe_triton_kernel makes it: (call, a, a_scale, c)."""
    import triton
    import triton.language as tl
    block = TRITON_MOE_BLOCK[p.impl]
    fc1 = p.plan_key == "fc1"
    m, k, n = p.M, p.K, p.N
    rows, launch_k = (m, top_k) if fc1 else (m * top_k, 1)
    a = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
    a_scale = None
    if block:
        a_scale = torch.rand(rows, -(-k // block[1]), device="cuda", dtype=torch.float32) / 64 + 1 / 256
        a = a.to(torch.float8_e4m3fn)
    c = torch.empty(m, top_k, n, device="cuda", dtype=torch.bfloat16)
    tokens = rows * launch_k
    naive = m * top_k * 4 <= e  # _prepare_expert_assignment: one token per block, no alignment pass
    if naive:
        sorted_ids, expert_ids = None, ids.view(-1)
        n_post = torch.full((1,), ids.numel() * cfg["BLOCK_SIZE_M"], dtype=torch.int32, device="cuda")
        em = tokens * cfg["BLOCK_SIZE_M"]
    else:
        sorted_ids, expert_ids, n_post = _align(wheel, torch, ids, cfg["BLOCK_SIZE_M"], experts=e)
        em = sorted_ids.size(0) if rows >= cfg["BLOCK_SIZE_M"] else min(sorted_ids.size(0),
                                                                          rows * launch_k * cfg["BLOCK_SIZE_M"])
    meta = {key: v for key, v in cfg.items() if key != "BLOCK_SIZE_K"}
    meta["SPLIT_K"] = 1
    block_k = min(cfg["BLOCK_SIZE_K"], min(block)) if block else cfg["BLOCK_SIZE_K"]
    swap = bool(block) and cfg["BLOCK_SIZE_M"] < 64 and cfg["BLOCK_SIZE_N"] >= 64  # enable_swap_ab on SM90
    grid = (triton.cdiv(em, cfg["BLOCK_SIZE_M"]) * triton.cdiv(w.size(1), cfg["BLOCK_SIZE_N"]),)
    scale_strides = (a_scale.stride(0), a_scale.stride(1), w_scale.stride(0), w_scale.stride(2),
                     w_scale.stride(1) if w_scale.size(1) > 1 else 0) if block else (0, 0, 0, 0, 0)
    kernel = wheel.fused_moe.fused_moe_kernel[grid]
    return (lambda: kernel(
        a, w, c, None, a_scale, w_scale, weights, sorted_ids, expert_ids, n_post, w.size(1), w.size(2), em, tokens,
        a.stride(0), a.stride(1), w.stride(0), w.stride(2), w.stride(1), c.stride(1), c.stride(2), *scale_strides,
        0, 0, block[0] if block else 0, block[1] if block else 0, MUL_ROUTED_WEIGHT=not fc1, top_k=launch_k,
        compute_type=tl.bfloat16, use_fp8_w8a8=bool(block), use_int8_w8a8=False, use_int8_w8a16=False,
        per_channel_quant=False, naive_block_assignment=naive, HAS_BIAS=False, BLOCK_SIZE_K=block_k, SWAP_AB=swap,
        USE_TD=False, **meta)), a, a_scale, c


def _triton_moe_weights(torch, p: Any, e: int):
    block = TRITON_MOE_BLOCK[p.impl]
    w = torch.randn(e, p.N, p.K, device="cuda", dtype=torch.bfloat16) * p.K ** -0.5
    if not block:
        return w, None
    scale = torch.rand(e, -(-p.N // block[0]), -(-p.K // block[1]), device="cuda", dtype=torch.float32) + 0.5
    return (w * 16).to(torch.float8_e4m3fn), scale / 16


def _triton_moe_setup(torch, wheel, p: Any):
    """(E, top-k, tile config, its source); a point whose variant is "stages=S" (points.tile_probe_points) runs
    vLLM's pick with num_stages forced to S."""
    from fam_moe import model_dims
    e, top_k = model_dims(p.model)
    inter, hidden = (p.N // 2, p.K) if p.plan_key == "fc1" else (p.K, p.N)
    cfg, source = triton_moe_config(wheel, p.M, e, inter, hidden, top_k, TRITON_MOE_BLOCK[p.impl])
    if p.variant.startswith("stages="):
        cfg, source = {**cfg, "num_stages": int(p.variant.split("=")[1])}, f"{source} with {p.variant}"
    return e, top_k, cfg, source


def occupancy(torch, compiled) -> dict:
    """What the compiled Triton program holds and how many the driver lets one SM run at once
    (cuOccupancyMaxActiveBlocksPerMultiprocessor at its shared memory): the facts behind the rounds of the
    Triton MoE law (simulator/cost/engine_tiles.py)."""
    import ctypes
    shared = int(compiled.metadata.shared)
    threads = 32 * int(compiled.metadata.num_warps)
    blocks = ctypes.c_int(0)
    cuda = ctypes.CDLL("libcuda.so.1")
    rc = cuda.cuOccupancyMaxActiveBlocksPerMultiprocessor(ctypes.byref(blocks), ctypes.c_void_p(compiled.function),
                                                          ctypes.c_int(threads), ctypes.c_size_t(shared))
    return {"shared_bytes": shared, "regs": int(compiled.n_regs), "spills": int(compiled.n_spills),
            "resident": blocks.value if rc == 0 else ""}


def triton_moe_tile(p: Any, torch: Any, wheel) -> dict:
    """One launch of the point's kernel, untimed: its tile config and occupancy (production.py --tiles-only)."""
    e, top_k, cfg, source = _triton_moe_setup(torch, wheel, p)
    w, w_scale = _triton_moe_weights(torch, p, e)
    ids = _routing(torch, p.M, p.U, np.arange(e), seed=0, top_k=top_k)
    weights = torch.rand(p.M, top_k, device="cuda", dtype=torch.float32)
    compiled = _triton_moe_call(torch, wheel, p, w, w_scale, ids, weights, cfg, e, top_k)[0]()
    torch.cuda.synchronize()
    return {"median_us": "", "tile_config": f"{source}: " + ",".join(f"{k}={v}" for k, v in cfg.items()),
            "block_m": cfg["BLOCK_SIZE_M"], **occupancy(torch, compiled)}


def triton_moe(p: Any, torch: Any, wheel) -> dict:
    e, top_k, cfg, source = _triton_moe_setup(torch, wheel, p)
    w, w_scale = _triton_moe_weights(torch, p, e)
    per_expert = p.K * p.N * (1 if w_scale is not None else 2)
    slots = max(1, min(slots_for(p.U * per_expert), e // p.U))
    perm = np.random.default_rng(1).permutation(e)
    calls = []
    for i in range(slots):
        ids = _routing(torch, p.M, p.U, perm[i * p.U:(i + 1) * p.U], seed=i, top_k=top_k)
        weights = torch.rand(p.M, top_k, device="cuda", dtype=torch.float32)
        calls.append(_triton_moe_call(torch, wheel, p, w, w_scale, ids, weights, cfg, e, top_k)[0])
    res = time_graph(torch, calls, reps=max(32, len(calls)), replays=20)
    res["kernel_names"] = kernel_names(torch, calls[0])
    res["tile_config"] = f"{source}: " + ",".join(f"{k}={v}" for k, v in cfg.items())
    res["block_m"] = cfg["BLOCK_SIZE_M"]
    return {**res, **occupancy(torch, calls[0]())}


def check_triton_moe(torch, wheel, impl: str, key: str, m: int) -> float:
    """Relative error of one launch against float32 expert GEMMs over the same (dequantised) operands."""
    from points import Point
    model, (k, n) = ("kimi-k3", (3584, 768)) if impl.endswith("bf16") else ("deepseek-v3", (7168, 512))
    if key == "fc2":
        k, n = n // 2, k
    p = Point("moe", impl, key, model, "", 8, M=m, K=k, N=n, fmt="bf16")
    e, top_k, cfg, _ = _triton_moe_setup(torch, wheel, p)
    w, w_scale = _triton_moe_weights(torch, p, e)
    ids = _routing(torch, m, min(64, m * top_k), np.arange(e), seed=3, top_k=top_k)
    weights = torch.rand(m, top_k, device="cuda", dtype=torch.float32)
    call, a, a_scale, c = _triton_moe_call(torch, wheel, p, w, w_scale, ids, weights, cfg, e, top_k)
    call()
    torch.cuda.synchronize()
    block = TRITON_MOE_BLOCK[impl]
    wf, af = w.float(), a.float()
    if block:  # undo the block scales: weights per (128 x 128) tile, activations per (row, 128) group
        wf = wf * w_scale.repeat_interleave(block[0], 1).repeat_interleave(block[1], 2)[:, :n, :k]
        af = af * a_scale.repeat_interleave(block[1], 1)[:, :k]
    flat = ids.view(-1).long()
    rows = af[torch.arange(m * top_k, device="cuda") // top_k] if key == "fc1" else af
    want = torch.einsum("rk,rnk->rn", rows, wf[flat])
    if key == "fc2":
        want = want * weights.view(-1, 1)
    got = c.view(m * top_k, n).float()
    return float((got - want).norm() / want.norm())


# ===================================================================== MLA decode: FlashMLA
def _mla_inputs(torch, p: Any, slots: int, fp8: bool):
    b, s, t, h = p.B, p.S, p.T, p.heads
    pages = -(-s // MLA_PAGE)
    cache = torch.randn(slots * b * pages, MLA_PAGE, 1, MLA_DIM, device="cuda", dtype=torch.bfloat16) / 4
    if fp8:
        cache = cache.to(torch.float8_e4m3fn)
    tables = [torch.arange(i * b * pages, (i + 1) * b * pages, device="cuda", dtype=torch.int32).view(b, pages)
              for i in range(slots)]
    q = torch.randn(b, t, h, MLA_DIM, device="cuda", dtype=torch.bfloat16) / 4
    seqlens = torch.full((b,), s, device="cuda", dtype=torch.int32)
    return (q.to(torch.float8_e4m3fn) if fp8 else q), cache, tables, seqlens


def mla_scale(model: str) -> float:
    """Softmax scale vLLM passes: (nope + rope head dim)^-0.5 = 192^-0.5 for both models."""
    return 192 ** -0.5


FP8_QUERY = [True]  # fwd_kvcache_mla_fp8 takes an FP8 query with descales; False once it has refused one


def mla_calls(torch, wheel, p: Any, slots: int):
    fp8 = p.impl == "flashmla_fp8"
    if fp8 and FP8_QUERY[0]:
        try:
            calls, inputs = _mla_calls(torch, wheel, p, 1, True)
            calls[0]()
            torch.cuda.synchronize()
        except RuntimeError as exc:
            print(f"fwd_kvcache_mla_fp8 with an FP8 query: {exc}"[:300] + "; using a bf16 query", flush=True)
            FP8_QUERY[0] = False
    return _mla_calls(torch, wheel, p, slots, fp8 and FP8_QUERY[0])


def _mla_calls(torch, wheel, p: Any, slots: int, fp8_query: bool):
    fp8 = p.impl == "flashmla_fp8"
    q, cache, tables, seqlens = _mla_inputs(torch, p, slots, fp8)
    if fp8 and not fp8_query:
        q = q.to(torch.bfloat16)
    scale = mla_scale(p.model)
    if fp8:
        md, splits = wheel.flashmla_ext.get_mla_decoding_metadata_dense_fp8(seqlens, p.T * p.heads, 1)
        one = torch.ones(1, device="cuda", dtype=torch.float32)
        calls = [lambda tb=tb: wheel.flashmla_ext.fwd_kvcache_mla_fp8(q, cache, MLA_DV, seqlens, tb, scale, True, md,
                                                                       splits, one, one) for tb in tables]
    else:
        _, _, md, splits = wheel.flashmla.dense_decode_fwd(q, cache, MLA_DV, seqlens, tables[0], scale, True, None,
                                                          None, None)
        calls = [lambda tb=tb: wheel.flashmla.dense_decode_fwd(q, cache, MLA_DV, seqlens, tb, scale, True, md, splits,
                                                               None) for tb in tables]  # vLLM passes no out
    return calls, (q, cache, tables, seqlens, scale)


def mla(p: Any, torch: Any, wheel) -> dict:
    per_call = p.B * p.S * MLA_DIM * (1 if p.impl == "flashmla_fp8" else 2)
    calls, _ = mla_calls(torch, wheel, p, slots_for(per_call))
    res = time_graph(torch, calls, reps=max(32, len(calls)), replays=20)
    res["kernel_names"] = kernel_names(torch, calls[0])
    return res


def check_mla(torch, wheel, impl: str, b: int = 2, s: int = 300, t: int = 4, h: int = 12) -> float:
    """Relative error of FlashMLA against float32 causal attention over the same (dequantised) cache."""
    from points import Point
    p = Point("mla", impl, "mla_decode", "kimi-k3", "mla", 8, M=b * t, B=b, heads=h, T=t, S=s,
              fmt="fp8" if impl == "flashmla_fp8" else "bf16")
    calls, (q, cache, tables, seqlens, scale) = mla_calls(torch, wheel, p, 1)
    got = calls[0]()[0].float()
    kv = cache.float()[tables[0].long()].reshape(b, -1, MLA_DIM)[:, :s]  # [B, S, 576]
    logits = torch.einsum("bthd,bsd->bths", q.float(), kv) * scale
    visible = torch.arange(s, device="cuda")[None, :] <= (s - t + torch.arange(t, device="cuda"))[:, None]
    logits = logits.masked_fill(~visible[None, :, None, :], float("-inf"))
    want = torch.einsum("bths,bsd->bthd", logits.softmax(-1), kv[..., :MLA_DV])
    return float((got - want).norm() / want.norm())


# ===================================================================== KDA: vLLM's Triton recurrent kernels
def _kda_inputs(torch, b: int, t: int, h: int, slots: int, per_token: bool):
    """Packed q|k|v rows, raw gate / beta, A_log, dt_bias and a state cache whose slot 0 is vLLM's null slot."""
    n = b * t
    qkv = torch.randn(n, 3 * h * KDA_D, device="cuda", dtype=torch.bfloat16)
    g = torch.randn(1, n, h, KDA_D, device="cuda", dtype=torch.bfloat16)
    beta = torch.randn(1, n, h, device="cuda", dtype=torch.bfloat16)
    a_log = torch.rand(h, device="cuda", dtype=torch.float32)
    dt_bias = torch.randn(h * KDA_D, device="cuda", dtype=torch.float32) / 4
    per_call = b * (t if per_token else 1)
    state = torch.randn(1 + slots * per_call, h, KDA_D, KDA_D, device="cuda", dtype=torch.float32) / 16
    return qkv, g, beta, a_log, dt_bias, state, per_call


def kda_calls(torch, wheel, p: Any, slots: int):
    b, t, h = p.B, p.T, p.heads
    spec = p.variant == "per_token"
    qkv, g, beta, a_log, dt_bias, state, per_call = _kda_inputs(torch, b, t, h, slots, spec)
    out = torch.empty(1, b * t, h, KDA_D, device="cuda", dtype=torch.bfloat16)
    calls = []
    for i in range(slots):
        first = 1 + i * per_call
        if p.impl == "vllm_packed_decode":
            idx = torch.arange(first, first + b, device="cuda", dtype=torch.int32)
            calls.append(lambda idx=idx: wheel.kda.fused_recurrent_kda_packed_decode(
                qkv, g, beta, a_log, dt_bias, KDA_LOWER_BOUND, state, idx, out=out))
            continue
        q, k, v = (x.view(1, b * t, h, KDA_D) for x in qkv.split(h * KDA_D, dim=-1))
        cu = torch.arange(0, b * t + 1, t, device="cuda", dtype=torch.int32)
        if spec:  # kda.py's verify: a state slot per token, the accepted-token count picks the one read
            idx = torch.arange(first, first + b * t, device="cuda", dtype=torch.int32).view(b, t)
            accepted = torch.ones(b, device="cuda", dtype=torch.int32)
        else:
            idx, accepted = torch.arange(first, first + b, device="cuda", dtype=torch.int32), None
        calls.append(lambda q=q, k=k, v=v, cu=cu, idx=idx, accepted=accepted: wheel.kda.fused_recurrent_kda(
            q, k, v, g, beta, a_log, dt_bias, KDA_LOWER_BOUND, state, cu, idx, num_accepted_tokens=accepted, out=out))
    return calls, (qkv, g, beta, a_log, dt_bias, state, out)


def kda(p: Any, torch: Any, wheel) -> dict:
    state = p.heads * KDA_D * KDA_D * 4
    per_call = p.B * state * (1 + (p.T if p.variant == "per_token" else 1))
    res, calls = time_cold(torch, lambda slots: kda_calls(torch, wheel, p, slots)[0], per_call, max_slots=KDA_SLOTS,
                           reps=32)
    res["kernel_names"] = kernel_names(torch, calls[0])
    return res


def kda_reference(torch, qkv, g, beta, a_log, dt_bias, s0, b: int, t: int, h: int):
    """Float32 KDA over T tokens from states s0 [B, H, V, K]: (outputs [B T, H, V], the T states per sequence)."""
    q, k, v = (x.float().view(b, t, h, KDA_D) for x in qkv.split(h * KDA_D, dim=-1))
    q = q / (q.pow(2).sum(-1, keepdim=True) + 1e-6).sqrt() * KDA_D ** -0.5
    k = k / (k.pow(2).sum(-1, keepdim=True) + 1e-6).sqrt()
    gate = KDA_LOWER_BOUND * torch.sigmoid(a_log.exp()[:, None] * (g.float().view(b, t, h, KDA_D)
                                                                    + dt_bias.view(h, KDA_D)))
    bet = torch.sigmoid(beta.float().view(b, t, h))
    s, outs, states = s0.clone(), [], []
    for i in range(t):
        s = s * gate[:, i].exp()[:, :, None, :]
        u = v[:, i] - torch.einsum("bhvk,bhk->bhv", s, k[:, i])
        s = s + (bet[:, i, :, None] * u)[..., None] * k[:, i][:, :, None, :]
        outs.append(torch.einsum("bhvk,bhk->bhv", s, q[:, i]))
        states.append(s)
    return torch.stack(outs, 1).reshape(b * t, h, KDA_D), torch.stack(states, 1)


def check_kda(torch, wheel, impl: str, b: int = 3, t: int = 4, h: int = 12) -> float:
    """Worst relative error of outputs and stored states against kda_reference."""
    from points import Point
    t = 1 if impl == "vllm_packed_decode" else t
    p = Point("kda", impl, "kda_decode", "kimi-k3", "kda", 8, M=b * t, B=b, heads=h, T=t, fmt="fp32",
              variant="per_token" if t > 1 else "final")
    calls, (qkv, g, beta, a_log, dt_bias, state, out) = kda_calls(torch, wheel, p, 1)
    s0 = state[1:1 + b].clone() if t == 1 else state[1 + torch.arange(b, device="cuda") * t].clone()
    calls[0]()
    torch.cuda.synchronize()
    want, states = kda_reference(torch, qkv, g, beta, a_log, dt_bias, s0, b, t, h)
    got_states = state[1:1 + b * t].view(b, t, h, KDA_D, KDA_D)
    err_out = (out[0].float() - want).norm() / want.norm()
    err_state = (got_states - states).norm() / states.norm()
    return float(max(err_out, err_state))


# ===================================================================== small kernels
def small(p: Any, torch: Any, wheel) -> dict:
    m, width = p.M, p.N
    if p.impl in ("vllm_topk_sigmoid", "vllm_grouped_topk"):
        per_call = m * width * 4
    elif p.impl == "vllm_moe_sum":
        per_call = m * TOP_K * width * 2
    else:
        per_call = m * width * 2
    res, calls = time_cold(torch, lambda slots: [small_call(torch, wheel, p, seed=i)[0] for i in range(slots)],
                           per_call, max_slots=256)
    res["kernel_names"] = kernel_names(torch, calls[0])
    return res


def small_call(torch, wheel, p: Any, seed: int = 0):
    """(call, its inputs and outputs) of one small kernel at the point's shape."""
    m, width = p.M, p.N
    gen = torch.Generator(device="cuda").manual_seed(seed)
    if p.impl in ("vllm_topk_sigmoid", "vllm_grouped_topk"):
        logits = torch.randn(m, width, device="cuda", dtype=torch.float32, generator=gen)
        bias = torch.randn(width, device="cuda", dtype=torch.float32, generator=gen) / 8
        if p.impl == "vllm_grouped_topk":
            return (lambda: wheel.moe.grouped_topk(logits, 1, 1, TOP_K, True, 1.0, bias, 1)), (logits, bias)
        weights = torch.empty(m, TOP_K, device="cuda", dtype=torch.float32)
        ids = torch.empty(m, TOP_K, device="cuda", dtype=torch.int32)
        token_ids = torch.empty(m, TOP_K, device="cuda", dtype=torch.int32)
        def call():
            wheel.moe.topk_sigmoid(weights, ids, token_ids, logits, True, bias, 1.0, None)
            return weights, ids
        return call, (logits, bias)
    if p.impl == "vllm_moe_sum":
        y = torch.randn(m, TOP_K, width, device="cuda", dtype=torch.bfloat16, generator=gen)
        out = torch.empty(m, width, device="cuda", dtype=torch.bfloat16)
        return (lambda: (wheel.moe.moe_sum(y, out, None, None), out)[1]), (y,)
    x = torch.randn(m, width, device="cuda", dtype=torch.bfloat16, generator=gen)
    w = torch.randn(width, device="cuda", dtype=torch.bfloat16, generator=gen)
    return (lambda: torch.nn.functional.rms_norm(x, (width,), w, 1e-5)), (x, w)


def check_small(torch, wheel, impl: str, m: int = 8) -> float:
    """Top-k: fraction of tokens whose chosen set or renormalised weights differ from the reference (0 = all
    agree); moe_sum / rms_norm: relative error against float32."""
    from points import Point
    width = {"vllm_moe_sum": 3584, "torch_rms_norm": 3584}.get(impl, EXPERTS)
    call, inputs = small_call(torch, wheel, Point("small", impl, M=m, N=width), seed=7)
    got = call()
    torch.cuda.synchronize()
    if impl in ("vllm_topk_sigmoid", "vllm_grouped_topk"):
        logits, bias = inputs
        score = torch.sigmoid(logits)
        ids = (score + bias).topk(TOP_K, dim=-1).indices
        w = score.gather(1, ids)
        w = w / w.sum(-1, keepdim=True)
        got_w, got_ids = got[0].float(), got[1].long()
        order_got, order_want = got_ids.sort(-1), ids.sort(-1)
        same_ids = (order_got.values == order_want.values).all(-1)
        same_w = (got_w.gather(1, order_got.indices) - w.gather(1, order_want.indices)).abs().max(-1).values < 1e-4
        return float(1.0 - (same_ids & same_w).float().mean())
    if impl == "vllm_moe_sum":
        want = inputs[0].float().sum(1)
    else:
        x, w = (t.float() for t in inputs)
        want = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w
    return float((got.float() - want).norm() / want.norm())


# ===================================================================== dispatch
def _gemm(p: Any, torch: Any, wheel) -> dict:
    import fam_dense
    res = fam_dense.measure(p, torch)
    res["kernel_names"] = kernel_names(torch, fam_dense.gemm_calls(p, torch)[0])
    return res


MEASURE = {"moe": lambda p, torch, wheel: (triton_moe if p.impl in TRITON_MOE_BLOCK else marlin)(p, torch, wheel),
           "mla": mla, "kda": kda, "small": small, "gemm": _gemm}


def measure(p: Any, torch: Any, wheel) -> dict:
    if p.family not in MEASURE:
        raise ValueError(f"no production measurement for family {p.family!r}")
    return MEASURE[p.family](p, torch, wheel)


def checks(torch, wheel, family: str) -> list[tuple[str, float, float]]:
    """(label, error, bound) of the family's correctness checks (module docstring)."""
    if family == "moe":
        return [(f"marlin {key}", check_marlin(torch, wheel, key), 2e-2) for key in ("fc1", "fc2")] + [
            (f"{impl} {key} M={m}", check_triton_moe(torch, wheel, impl, key, m), 2e-2)
            for impl in TRITON_MOE_BLOCK for key in ("fc1", "fc2") for m in (2, 24)]  # one-token blocks, aligned
    if family == "mla":
        return [(impl, check_mla(torch, wheel, impl), 3e-2 if impl == "flashmla_fp8" else 1e-2)
                for impl in ("flashmla_bf16", "flashmla_fp8")]
    if family == "kda":
        return [(impl, check_kda(torch, wheel, impl), 1e-2) for impl in ("vllm_packed_decode", "vllm_fused_recurrent")]
    if family == "small":
        return [(impl, check_small(torch, wheel, impl), 0.0 if "topk" in impl else 1e-2)
                for impl in ("vllm_topk_sigmoid", "vllm_grouped_topk", "vllm_moe_sum", "torch_rms_norm")]
    return []


def within(err: float, bound: float) -> bool:
    return math.isfinite(err) and err <= bound
