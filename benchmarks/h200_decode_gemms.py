"""Measure Kimi K3's decode GEMMs on a real GPU (bf16, CUDA-graph replay, cold L2), for the cost-model check.

    python benchmarks/h200_decode_gemms.py --out data/h200_decode_gemms.csv     (on a machine with a GPU)

Per-rank shapes of Kimi K3 at TP8 (docs/sources.md §K1h). Each GEMM is captured REPS times in one
CUDA graph on one stream, so they run back to back like a layer's kernels, cycling over copies of the
weight so that at least 1 GB is read between two reads of one copy (L2 is 60 MB on H200: every read is
cold). Time per kernel = graph replay time / REPS, median of 20 replays.
This is torch.matmul, i.e. cuBLAS: a library GEMM, not vLLM's custom skinny kernels.
"""

from __future__ import annotations

import argparse
import csv
import statistics

SHAPES = {  # name: (K, N) per rank at TP8
    "kda_in_proj": (7168, 6288), "o_proj": (1536, 7168), "router": (7168, 896),
    "latent_down": (7168, 3584), "latent_up": (3584, 7168), "shared_gate_up": (7168, 1536),
    "shared_down": (768, 7168), "lm_head": (7168, 20480), "mla_fused_qkv_a": (7168, 2112),
}


def measure(k: int, n: int, m: int, reps: int, torch) -> float:
    dev = torch.device("cuda")
    copies = max(2, min(reps, -(-1_000_000_000 // (k * n * 2))))  # >= 1 GB between two reads of one copy
    weights = [torch.randn(k, n, device=dev, dtype=torch.bfloat16) * k ** -0.5 for _ in range(copies)]
    x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for i in range(reps):  # warm-up outside the graph (cuBLAS picks its kernels)
            torch.matmul(x, weights[i % len(weights)])
        torch.cuda.synchronize()
        with torch.cuda.graph(graph, stream=stream):
            for i in range(reps):  # one stream: the GEMMs run back to back, as a layer's kernels do
                torch.matmul(x, weights[i % len(weights)])
    times = []
    for _ in range(20):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1000 / reps)  # µs per GEMM
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--reps", type=int, default=32)
    args = parser.parse_args()
    import torch
    name = torch.cuda.get_device_name()
    rows = []
    for shape, (k, n) in SHAPES.items():
        for m in (1, 8, 64):
            us = measure(k, n, m, args.reps, torch)
            rows.append({"gpu": name, "kernel": shape, "K": k, "N": n, "M": m, "weight_mb": round(k * n * 2 / 1e6, 2),
                         "us_per_kernel": round(us, 3)})
            print(rows[-1], flush=True)
    with open(args.out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    main()
