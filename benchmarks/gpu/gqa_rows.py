"""GQA decode attention on one H200 as vLLM 0.33.0 launches it for gpt-oss on Hopper: kernel rows for the gqa law.

    python benchmarks/gpu/gqa_rows.py --unpack-fa3 vllm-0.33.0-...whl --fa3 .devcarry/fa3      # here, once
    python benchmarks/gpu/predict.py --set production --add-new --out calibration/h200/production/predictions.csv
    python benchmarks/gpu/gqa_rows.py --fa3 .devcarry/fa3 --replay-carry .devcarry/replay --out DIR  # GPU

impl                 kernel, called as vLLM calls it
vllm_fa3             FlashAttention 3's `fwd` (vllm/vllm_flash_attn/_vllm_fa3_C, the FLASH_ATTN backend on Hopper):
                     one query token per sequence, the paged bf16 cache [blocks, 16, Nkv, 64] through the block
                     table, causal, the layer's window (W - 1, 0) or none, the sinks as s_aux, num_splits = 32 (the
                     backend's flash_attn_max_num_splits_for_cuda_graph under full CUDA graphs; gpt-oss's two
                     window sizes turn its ahead-of-time scheduler off, so no scheduler metadata)
vllm_triton_unified  vLLM's Triton unified attention (v1/attention/ops/triton_unified_attention.py), the stand-in
                     the gpt-oss layer replays ran (gptoss_replay.py): split-KV (3D) + reduce_segments below 16
                     sequences, one program per sequence and key/value head (2D) above

The FA3 library (172 MB) travels xz-compressed (12 MB) and is unpacked on the GPU machine; it uses torch's
stable C ABI (aoti_torch_* shims), so it loads on torch 2.11 although vLLM 0.33.0 pins 2.14. Points:
points.gqa_points (gpt-oss-20b's decode at TP1 and one TP2 rank, sliding and full layers, batch 1-64, context
512-32,768). Every input is cold: the caches rotate over >= 4 x L2 or an L2 flush precedes each launch
(harness.time_cold). `checks` first: each implementation against a float32 reference over the gathered cache
(sinks in the softmax's denominator, the window applied) on small shapes. Rows are appended to DIR/gqa.csv
as they finish; DIR/runs.json records the checks, wall time and GPU.
"""

from __future__ import annotations

import argparse
import json
import lzma
import sys
import time
import traceback
import zipfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent.parent)]

import points as pts  # noqa: E402
from fa3 import FA3_XZ, fa3_call, load_fa3, unpack_fa3  # noqa: E402

BLOCK = 16  # positions per cache block (vLLM's default for FLASH_ATTN and the Triton backend)
TRITON_SEGMENTS, TRITON_SEQ_3D = 16, 16  # the Triton backend's softmax segments and its 3D-below threshold
MAX_SLOTS = 64
EXTRA = ("package", "kernel", "stands_in_for", "kernel_names", "point_s", "cold", "flush_us")


def geometry(p: Any) -> dict:
    """The plan kernel's shapes for a point: heads, key/value heads, head dim, window, softmax scale."""
    from simulator.cost.measured import point_kernel
    from simulator.cost.validate import normalise
    kernel = point_kernel(normalise(p.row()))
    q, pool = kernel.reads[0], kernel.reads[1]
    consts = dict(kernel.consts)
    return {"nq": q.shape[1], "nkv": pool.shape[2], "h": q.shape[2], "window": consts.get("window") or 0,
            "scale": consts["scale"], "b": p.B, "ctx": p.S, "sinks": bool(kernel.weights)}  # sinks: gpt-oss's


def inputs(torch, g: dict, slots: int, seed: int = 0) -> dict:
    """Caches for `slots` rotations of B sequences of ctx + 1 positions, their tables, and the step's query,
    output, sinks; slot i's tables address slot i's blocks only. On a sliding layer only the blocks the window
    reaches are the sequence's own; the ones before it all name block 0 (vLLM frees them; no launch reads them)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    b, n = g["b"], g["ctx"] + 1
    per_seq = -(-n // BLOCK)
    live = min(per_seq, -(-g["window"] // BLOCK) + 1) if g["window"] else per_seq
    blocks = 1 + slots * b * live
    kc = (torch.randn(blocks, BLOCK, g["nkv"], g["h"], device="cuda", generator=gen) / 4).to(torch.bfloat16)
    vc = (torch.randn(blocks, BLOCK, g["nkv"], g["h"], device="cuda", generator=gen) / 4).to(torch.bfloat16)
    own = [1 + torch.arange(i * b * live, (i + 1) * b * live, device="cuda", dtype=torch.int32).view(b, live)
           for i in range(slots)]
    dead = torch.zeros(b, per_seq - live, device="cuda", dtype=torch.int32)
    tables = [torch.cat([dead, t], dim=1).contiguous() for t in own]
    return {"kc": kc, "vc": vc, "tables": tables, "lens": torch.full((b,), n, device="cuda", dtype=torch.int32),
            "q": (torch.randn(b, g["nq"], g["h"], device="cuda", generator=gen) / 4).to(torch.bfloat16),
            "out": torch.empty(b, g["nq"], g["h"], device="cuda", dtype=torch.bfloat16),
            "sinks": (torch.randn(g["nq"], device="cuda", generator=gen).to(torch.bfloat16)  # the model's sinks
                      if g.get("sinks", True) else None),
            "cu": torch.arange(b + 1, device="cuda", dtype=torch.int32), "n": n}


def triton_call(attention, torch, x: dict, g: dict, table):
    rows = TRITON_SEQ_3D
    segm = [torch.empty(rows, g["nq"], TRITON_SEGMENTS, g["h"], device="cuda", dtype=torch.float32),
            torch.empty(rows, g["nq"], TRITON_SEGMENTS, device="cuda", dtype=torch.float32),
            torch.empty(rows, g["nq"], TRITON_SEGMENTS, device="cuda", dtype=torch.float32)]
    one = torch.ones(1, device="cuda", dtype=torch.float32)
    window = (g["window"] - 1, 0) if g["window"] else (-1, -1)
    return lambda: attention(x["q"], x["kc"], x["vc"], x["out"], x["cu"], 1, x["lens"], x["n"], g["scale"], True,
                             window, table, 0, None, one, one, seq_threshold_3D=rows,
                             num_par_softmax_segments=TRITON_SEGMENTS, softmax_segm_output=segm[0],
                             softmax_segm_max=segm[1], softmax_segm_expsum=segm[2], sinks=x["sinks"])


def make_calls(kernels: dict, torch, p: Any, g: dict):
    def build(slots: int) -> list:
        x = inputs(torch, g, slots)
        if p.impl == "vllm_fa3":
            return [fa3_call(kernels["fa3"], x, g, t) for t in x["tables"]]
        return [triton_call(kernels["triton"], torch, x, g, t) for t in x["tables"]]
    return build


def cache_bytes(g: dict) -> int:
    """Bytes of K and V one launch reads: the window's positions on a sliding layer."""
    seen = min(g["ctx"] + 1, g["window"]) if g["window"] else g["ctx"] + 1
    return 2 * g["b"] * seen * g["nkv"] * g["h"] * 2


def measure(kernels: dict, torch, p: Any) -> dict:
    from harness import kernel_names, time_cold
    g = geometry(p)
    res, calls = time_cold(torch, make_calls(kernels, torch, p, g), cache_bytes(g), MAX_SLOTS)
    return {**res, "kernel_names": kernel_names(torch, calls[0])}


def reference(torch, x: dict, g: dict, table) -> Any:
    """float32 attention of each sequence's one query over its gathered positions, sinks in the denominator."""
    outs = []
    for i in range(g["b"]):
        pos = torch.arange(x["n"], device="cuda")
        blocks = table[i][pos // BLOCK].long()
        k = x["kc"][blocks, pos % BLOCK].float()  # [n, Nkv, H]
        v = x["vc"][blocks, pos % BLOCK].float()
        if g["window"]:
            k, v = k[-g["window"]:], v[-g["window"]:]
        rep = g["nq"] // g["nkv"]
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        s = torch.einsum("hd,nhd->hn", x["q"][i].float(), k) * g["scale"]
        if x["sinks"] is None:
            m = s.max(-1).values
            p_ = torch.exp(s - m[:, None])
            denom = p_.sum(-1)
        else:
            sinks = x["sinks"].float()
            m = torch.maximum(s.max(-1).values, sinks)
            p_ = torch.exp(s - m[:, None])
            denom = p_.sum(-1) + torch.exp(sinks - m)
        outs.append(torch.einsum("hn,nhd->hd", p_, v) / denom[:, None])
    return torch.stack(outs)


def checks(kernels: dict, torch) -> list[tuple[str, float]]:
    """(label, relative error) of each implementation on small shapes: 3 sequences, 8 query and 2 key/value
    heads of 64, 300 positions, full and with a 128-position window, with sinks; FA3 also at head dim 128
    without sinks (Qwen3-MoE's and Mixtral's decode)."""
    out = []
    for impl in (["vllm_fa3"] if "fa3" in kernels else []) + (["vllm_triton_unified"] if "triton" in kernels else []):
        for window, h, sinks in ((0, 64, True), (128, 64, True), (0, 128, False)):
            if impl != "vllm_fa3" and not sinks:
                continue
            g = {"nq": 8, "nkv": 2, "h": h, "window": window, "scale": h ** -0.5, "b": 3, "ctx": 299, "sinks": sinks}
            x = inputs(torch, g, 1, seed=5)
            call = (fa3_call(kernels["fa3"], x, g, x["tables"][0]) if impl == "vllm_fa3"
                    else triton_call(kernels["triton"], torch, x, g, x["tables"][0]))
            try:
                call()
                torch.cuda.synchronize()
            except Exception as exc:  # a call that does not run loses its implementation, not the run
                traceback.print_exc()
                out.append((f"{impl} window={window} head_dim={h}: {type(exc).__name__}: {exc}"[:300], float("inf")))
                kernels.pop("fa3" if impl == "vllm_fa3" else "triton", None)
                break
            want = reference(torch, x, g, x["tables"][0])
            err = float((x["out"].float() - want).norm() / want.norm())
            label = f"{impl} window={window}" + ("" if sinks else f" head_dim={h} no sinks")
            out.append((label, err))
            print(f"{'ok  ' if err < 2e-2 else 'FAIL'} check {label}: rel err {err:.2e}", flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--unpack-fa3", type=Path, help="here: compress the FA3 library out of this wheel into --fa3")
    ap.add_argument("--fa3", type=Path, required=True, help="folder holding " + FA3_XZ)
    ap.add_argument("--replay-carry", type=Path, help="gptoss_replay.py's carry (the Triton unified attention)")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--budget-s", type=float, default=300.0, help="stop starting new points after this long")
    ap.add_argument("--impl", action="append", help="only these implementations (repeatable)")
    ap.add_argument("--points", choices=("grid", "others"), default="grid",
                    help="grid: gpt-oss-20b's decode (points.gqa_points); others: Qwen3-MoE's and Mixtral's "
                         "(points.other_model_points: head dim 128, no sinks, no window)")
    args = ap.parse_args()
    if args.unpack_fa3:
        try:
            print(f"wrote {unpack_fa3(args.unpack_fa3, args.fa3)}")
        except (OSError, ValueError, zipfile.BadZipFile) as exc:
            print(f"--unpack-fa3 {args.unpack_fa3}: {exc}", file=sys.stderr)
            return 2
        return 0
    if args.out is None:
        print("--out is needed to measure.", file=sys.stderr)
        return 2
    from harness import environment, say_no_gpu, warm_up
    from rows import time_points
    if say_no_gpu("gqa_rows", "nothing measured (run it on a machine with an NVIDIA GPU)"):
        return 0
    import torch
    kernels, doc = {}, {"checks": [], "load": {}}
    try:
        kernels["fa3"] = load_fa3(args.fa3, torch)
        doc["load"]["vllm_fa3"] = "ok"
    except (OSError, RuntimeError, lzma.LZMAError) as exc:
        doc["load"]["vllm_fa3"] = f"{type(exc).__name__}: {exc}"[:300]
        print(f"FA3 did not load: {doc['load']['vllm_fa3']}", flush=True)
    if args.replay_carry:
        import gptoss_replay
        kernels["triton"] = gptoss_replay.Kernels(args.replay_carry, torch).attention
    args.out.mkdir(parents=True, exist_ok=True)
    env = environment(torch)
    t0 = time.time()
    doc["checks"] = [{"check": label, "rel_err": err} for label, err in checks(kernels, torch)]
    for impl, key in (("vllm_fa3", "fa3"), ("vllm_triton_unified", "triton")):  # a wrong answer is not timed
        if any(c["check"].startswith(impl) and not c["rel_err"] < 2e-2 for c in doc["checks"]):
            kernels.pop(key, None)
    warm_up(torch)
    chosen = pts.gqa_points() if args.points == "grid" else [p for p in pts.other_model_points() if p.family == "gqa"]
    todo = [p for p in chosen if ((p.impl == "vllm_fa3" and "fa3" in kernels)
            or (p.impl == "vllm_triton_unified" and "triton" in kernels)) and (not args.impl or p.impl in args.impl)]
    done, _ = time_points(todo, lambda p: measure(kernels, torch, p), torch, args.out / "gqa.csv", env, EXTRA, t0,
                          args.budget_s)
    doc.update(wall_s=round(time.time() - t0, 1), points_ok=done, points_planned=len(todo), gpu=env.get("gpu", ""))
    (args.out / "runs.json").write_text(json.dumps({"gqa": doc}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
