"""Ceilings and dense GEMMs: torch.matmul (cuBLAS), a device copy, a Triton pure read.

    gemm      y[M, N] = x[M, K] @ W[K, N], bf16 in, bf16 out (fp32 out for the router and LM head, as the
              plans declare); weights rotated over >= 4 x L2 so each launch streams them cold.
    copy      dst = src over 4 GiB (bytes counted read + write = 8 GiB).
    read      a Triton kernel that reads n bytes and writes one float per CTA (8 CTAs per SM max).
    large     8192^3 bf16 GEMM: the compute roof.
"""

from __future__ import annotations

from typing import Any

from harness import count_launches, slots_for, time_graph


def measure(p: Any, torch: Any) -> dict:
    if p.variant == "copy":
        return _copy(p, torch)
    if p.variant == "read":
        return _read(p, torch)
    return _gemm(p, torch)


def _gemm(p: Any, torch: Any) -> dict:
    calls = gemm_calls(p, torch)
    res = time_graph(torch, calls, reps=8 if p.variant == "large_gemm" else 32)
    res["launches"] = count_launches(torch, calls[0])
    return res


def gemm_calls(p: Any, torch: Any) -> list:
    """One zero-argument launch per rotation slot (weights cold in each): what `measure` times."""
    dev = torch.device("cuda")
    wbytes = p.K * p.N * 2
    slots = 1 if p.variant == "large_gemm" else slots_for(wbytes)
    x = torch.randn(p.M, p.K, device=dev, dtype=torch.bfloat16)
    if p.impl in ("torch_addmm", "torch_linear"):  # nn.Linear's [N, K] weight: y = x W^T (+ b, bias epilogue)
        ws = [torch.randn(p.N, p.K, device=dev, dtype=torch.bfloat16) * p.K ** -0.5 for _ in range(slots)]
        ys = [torch.empty(p.M, p.N, device=dev, dtype=torch.bfloat16) for _ in range(min(slots, 4))]
        if p.impl == "torch_linear":
            return [lambda w=w, y=ys[i % len(ys)]: torch.mm(x, w.t(), out=y) for i, w in enumerate(ws)]
        bias = torch.randn(p.N, device=dev, dtype=torch.bfloat16) / 8
        return [lambda w=w, y=ys[i % len(ys)]: torch.addmm(bias, x, w.t(), out=y) for i, w in enumerate(ws)]
    ws = [torch.randn(p.K, p.N, device=dev, dtype=torch.bfloat16) * p.K ** -0.5 for _ in range(slots)]
    out_dtype = torch.float32 if p.variant == "out_fp32" else torch.bfloat16
    ys = [torch.empty(p.M, p.N, device=dev, dtype=torch.bfloat16) for _ in range(min(slots, 4))]

    fp32_out = out_dtype == torch.float32 and _has_out_dtype(torch)  # router / LM head: fp32 logits

    def call(i: int):
        w, y = ws[i], ys[i % len(ys)]
        if fp32_out:
            return lambda: torch.mm(x, w, out_dtype=torch.float32)
        return lambda: torch.matmul(x, w, out=y)

    return [call(i) for i in range(slots)]


def _has_out_dtype(torch: Any) -> bool:
    """torch.mm(..., out_dtype=float32) exists in recent PyTorch (bf16 x bf16 -> fp32 in one cuBLAS call)."""
    try:
        a = torch.zeros(1, 1, device="cuda", dtype=torch.bfloat16)
        torch.mm(a, a, out_dtype=torch.float32)
        return True
    except (TypeError, RuntimeError):
        return False


def _copy(p: Any, torch: Any) -> dict:
    n = p.n_bytes // 2
    src = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    res = time_graph(torch, [lambda: dst.copy_(src)], reps=4, replays=10)
    res["launches"] = count_launches(torch, lambda: dst.copy_(src))
    return res


def _read_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def read_sum(x_ptr, out_ptr, n, BLOCK: tl.constexpr, ITERS: tl.constexpr):
        pid = tl.program_id(0)
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        base = pid * BLOCK * ITERS
        for it in range(ITERS):
            offs = base + it * BLOCK + tl.arange(0, BLOCK)
            acc += tl.load(x_ptr + offs, mask=offs < n, other=0.0).to(tl.float32)
        tl.store(out_ptr + pid, tl.sum(acc, axis=0))

    return read_sum


def _read(p: Any, torch: Any) -> dict:
    kernel = _read_kernel()
    n = p.n_bytes // 4
    block, sms = 1024, torch.cuda.get_device_properties(0).multi_processor_count
    iters = max(1, -(-n // (block * 8 * sms)))  # at most 8 CTAs per SM, each a contiguous stretch
    grid = (-(-n // (block * iters)),)
    slots = slots_for(p.n_bytes)
    xs = [torch.randn(n, device="cuda", dtype=torch.float32) for _ in range(slots if p.n_bytes < (1 << 30) else 1)]
    out = torch.empty(grid[0], device="cuda", dtype=torch.float32)
    calls = [(lambda x=x: kernel[grid](x, out, n, BLOCK=block, ITERS=iters)) for x in xs]
    res = time_graph(torch, calls, reps=32 if p.n_bytes < (1 << 30) else 4, replays=20 if p.n_bytes < (1 << 30) else 10)
    res["launches"] = 1
    return res
