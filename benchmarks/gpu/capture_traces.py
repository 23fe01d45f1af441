"""Capture torch-profiler traces of the GPU suite's mini layer, the test data of `moe-sim compare-trace`.

    python benchmarks/gpu/capture_traces.py --out tests/data/traces            # batch 8, 4 layers
    python benchmarks/gpu/capture_traces.py --out DIR --batch 32 --layers 6
    moe-sim compare-trace tests/data/traces/mini-eager-b8.json.gz --hardware h200 --tp 8 --batch 8 \
        --tokens-per-seq 1 --engine torch-mini

The mini layer is the part of a Kimi K3 TP8 KDA layer that plain torch ops can run on one GPU, in the
standard plan's launch order, BF16 (D = 7168, shared F/P = 768, E = 896, k = 16):
    o_proj      attn [B, 1536] @ w_o [1536, D]                          plan key o_proj
    RMSNorm     F.rms_norm over D                                        attn_res_post (its norm part)
    router      h [B, D] @ w_router [D, E], cast to fp32 logits          router
    shared      h @ w_gate_up [D, 2F/P]; silu(gate) * up; @ w_down [F/P, D]   shared_gate_up / shared_act / shared_down
    routing     sigmoid(logits) + bias, topk(16)                         topk
    add         o_proj output + shared output                            tail_add
It runs `--layers` layers (each its own weights, so each reads them from HBM) under torch.profiler
(CUDA activity), once eagerly and once as a CUDA-graph replay, and writes each trace trimmed to its GPU
kernel events and metadata, gzipped (a few kB). Torch launches more kernels than the plan counts
(the fp32 cast, the multiply of silu-and-mul, sigmoid, the bias add, topk's sort): compare-trace lists
them as unmatched_measured, which is the point. No GPU: one sentence, exit 0, nothing written.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import say_no_gpu  # noqa: E402

D, ATTN, SHARED, EXPERTS, TOP_K = 7168, 1536, 768, 896, 16
KEEP_TOP = ("schemaVersion", "deviceProperties", "displayTimeUnit", "traceName", "cuda_runtime_version",
            "cuda_driver_version", "distributedInfo")


def make_layers(torch: Any, n: int) -> list[dict[str, Any]]:
    """Per layer: BF16 weights scaled 1/sqrt(fan_in) so activations stay O(1); a seeded generator."""
    gen = torch.Generator(device="cuda").manual_seed(0)

    def w(rows: int, cols: int) -> Any:  # [out, in], F.linear's layout
        return (torch.randn(rows, cols, device="cuda", generator=gen) / cols ** 0.5).to(torch.bfloat16)

    return [{"w_o": w(D, ATTN), "norm": torch.ones(D, device="cuda", dtype=torch.bfloat16),
             "w_router": w(EXPERTS, D), "bias": torch.zeros(EXPERTS, device="cuda"),
             "w_gate_up": w(2 * SHARED, D), "w_down": w(D, SHARED)} for _ in range(n)]


def mini_layer(torch: Any, attn: Any, p: dict[str, Any]) -> Any:
    """One mini layer, kernels in the standard plan's order; returns the layer output [B, D]."""
    F = torch.nn.functional
    a = F.linear(attn, p["w_o"])                                     # [B, D]      o_proj
    h = F.rms_norm(a, (D,), p["norm"], 1e-6)                         # [B, D]      attn_res_post
    logits = F.linear(h, p["w_router"]).float()                      # [B, E]      router (fp32 logits)
    gu = F.linear(h, p["w_gate_up"])                                 # [B, 2F/P]   shared_gate_up
    act = F.silu(gu[:, :SHARED]) * gu[:, SHARED:]                    # [B, F/P]    shared_act
    shared = F.linear(act, p["w_down"])                              # [B, D]      shared_down
    torch.topk(torch.sigmoid(logits) + p["bias"], TOP_K, dim=-1)     # [B, k]      topk
    return a + shared                                                # [B, D]      tail_add


def run_layers(torch: Any, attn: Any, layers: list[dict[str, Any]]) -> list[Any]:
    """Every layer reads the same attention output: no glue kernels between layers, only the layer's own."""
    return [mini_layer(torch, attn, p) for p in layers]


def profile(torch: Any, fn: Any, path: Path) -> None:
    """Run fn once under torch.profiler (CUDA activity) and export the chrome trace to path."""
    from torch.profiler import ProfilerActivity
    with torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    prof.export_chrome_trace(str(path))


def trim(raw: Path, out: Path, extra: dict[str, Any] | None = None) -> list[str]:
    """Keep the GPU kernel events and the metadata events (plus `extra` top-level keys); gzip. Returns the
    kernel names in order."""
    doc = json.loads(raw.read_text())
    kernels = [e for e in doc["traceEvents"] if str(e.get("cat", "")).lower() == "kernel" and e.get("ph") == "X"]
    gpu_pids = {e.get("pid") for e in kernels}
    meta = [e for e in doc["traceEvents"] if e.get("ph") == "M" and e.get("pid") in gpu_pids]
    small = {k: doc[k] for k in KEEP_TOP if k in doc} | (extra or {}) | {"traceEvents": meta + kernels}
    out.write_bytes(gzip.compress(json.dumps(small).encode(), mtime=0))
    return [e["name"] for e in kernels]


def capture(torch: Any, batch: int, n_layers: int, out_dir: Path) -> dict[str, list[str]]:
    layers = make_layers(torch, n_layers)
    x = torch.randn(batch, ATTN, device="cuda", dtype=torch.bfloat16)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up: cuBLAS heuristics, allocator, before any capture
        for _ in range(3):
            run_layers(torch, x, layers)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run_layers(torch, x, layers)
    graph.replay()
    torch.cuda.synchronize()
    names: dict[str, list[str]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode, fn in (("eager", lambda: run_layers(torch, x, layers)), ("graph", graph.replay)):
            raw = Path(tmp) / f"{mode}.json"
            profile(torch, fn, raw)
            names[mode] = trim(raw, out_dir / f"mini-{mode}-b{batch}.json.gz")
    return names


# ----------------------------------------------------------------------------------------------------
# The suite layer: the standard Kimi K3 KDA layer at TP8 (one rank), batch 1 verifying 8 tokens, run with
# the very kernels `suite.py` measures in isolation (cuBLAS GEMMs, our Triton small kernels, W4A16 MoE and
# KDA), in plan order. Its per-kernel errors can be held against `moe-sim validate` on the same points:
# a kernel timed inside a layer and timed back to back should tell the same story. The two all-reduces
# are not run (one GPU): compare-trace lists them as unmatched plan kernels. Batch 1 and 64 (one token
# per sequence): the shapes the suite measured for every kernel of the layer (the T = 8 verify runs the
# three-kernel KDA fallback in the standard plan, which the suite measures as one fused kernel).

SUITE_BATCHES = (1, 64)


def suite_shape(batch: int) -> dict[str, Any]:
    return {"model": "kimi-k3", "tp": 8, "batch": batch, "tokens_per_seq": 1, "layer": "kda"}


def suite_layer_points(batch: int) -> list[Any]:
    """The suite's point for each non-collective kernel of the standard KDA layer, in plan order."""
    from points import all_points
    from simulator.config import load_model
    from simulator.cost.step import build_plan
    from simulator.plans.kernel import DecodeShape
    sh = suite_shape(batch)
    m = sh["batch"] * sh["tokens_per_seq"]
    plan = build_plan(load_model(sh["model"]), "standard", sh["tp"],
                      DecodeShape(sh["batch"], sh["tokens_per_seq"], 512), sh["layer"])
    pts = [p for p in all_points() if p.model == sh["model"] and p.tp == sh["tp"]]

    def pick(key: str, kind: str) -> Any:
        if kind == "attention":
            want = [p for p in pts if p.family == "kda" and p.impl == "triton" and p.variant == "final"
                    and p.B == sh["batch"] and p.T == sh["tokens_per_seq"]]
        elif kind == "moe":
            want = [p for p in pts if p.family == "moe" and p.plan_key == key and p.impl == "triton_w4a16"
                    and p.variant == "" and p.M == m]
        elif kind in ("gemm", "router") and key != "topk":
            want = [p for p in pts if p.family == "gemm" and p.plan_key == key and p.M == m
                    and p.layer == sh["layer"]]
        else:
            want = [p for p in pts if p.family == "small" and p.plan_key == key and p.M == m]
        if len(want) != 1:
            raise ValueError(f"suite layer: {len(want)} points for plan kernel {key!r} ({kind})")
        return want[0]

    return [pick(k.key, k.kind) for k in plan if k.kind != "collective"]


def suite_calls(torch: Any, p: Any) -> list:
    """The rotation launches `suite.py` times for point p (each family's own builder)."""
    import fam_attention
    import fam_dense
    import fam_moe
    import fam_small
    if p.family == "gemm":
        return fam_dense.gemm_calls(p, torch)
    if p.family == "small":
        return fam_small.small_calls(p, torch)
    if p.family == "moe":
        return fam_moe.moe_calls(p, torch)[0]
    if p.family == "kda":
        return fam_attention.kda_calls(p, torch)[0]
    raise ValueError(f"suite layer: no launches for family {p.family!r}")


def capture_suite(torch: Any, batch: int, n_layers: int, out_dir: Path) -> list[str]:
    """n_layers suite layers (rotation slot l of every kernel in layer l) as one CUDA graph; trace one replay."""
    pts = suite_layer_points(batch)
    calls = [suite_calls(torch, p) for p in pts]

    def run() -> None:
        for layer in range(n_layers):
            for c in calls:
                c[layer % len(c)]()

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        run()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    sh = suite_shape(batch)
    name = f"suite-graph-b{sh['batch']}t{sh['tokens_per_seq']}.json.gz"
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "graph.json"
        profile(torch, graph.replay, raw)
        extra = {"moeSimSuite": {**sh, "points": {p.plan_key: p.id for p in pts}}}
        return trim(raw, out_dir / name, extra)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for mini-{eager,graph}-b<batch>.json.gz")
    ap.add_argument("--batch", type=int, default=8, help="decode tokens M (batch x 1 token per sequence)")
    ap.add_argument("--layers", type=int, default=4, help="mini layers per trace")
    ap.add_argument("--suite", action="store_true",
                    help="instead: the suite layer (standard KDA layer, TP8, batch 1 and 64, the suite's own kernels)")
    args = ap.parse_args()
    if say_no_gpu("capture_traces", "nothing captured (run it on a machine with an NVIDIA GPU)"):
        return 0
    import torch
    args.out.mkdir(parents=True, exist_ok=True)
    with torch.inference_mode():
        if args.suite:
            for batch in SUITE_BATCHES:
                seen = capture_suite(torch, batch, args.layers, args.out)
                print(f"suite layer, batch {batch}: {len(seen)} kernels over {args.layers} layers")
                for name, count in Counter(seen).items():
                    print(f"  {count:3d} x {name}")
            return 0
        names = capture(torch, args.batch, args.layers, args.out)
    print(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA {torch.version.cuda}")
    for mode, seen in names.items():
        print(f"{mode}: {len(seen)} kernels over {args.layers} layers -> {args.out}/mini-{mode}-b{args.batch}.json.gz")
        for name, count in Counter(seen).items():
            print(f"  {count:3d} x {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
