"""Benchmark: full-size routed-expert parts drawn and packed per second, split into its stages.

    python benchmarks/bench_draw.py                    # Kimi K3 expert parts (3584 x 3072), best of 5
    python benchmarks/bench_draw.py --repeats 9 --json
    PYTHONPATH=/path/to/older/checkout python benchmarks/bench_draw.py   # the same stages, older code

An expert part is drawn as `default_rng(seed).standard_normal((K, N), float32) * K^-0.5` and packed as
MXFP4 W^T (weights.LayerWeights._make_packed). Stages, each on one thread and timed alone (M params/s):

    numpy        NumPy's own Generator.standard_normal(float32): the reference the draws equal, bit for bit
    draw         rng.standard_normal_f32: the same numbers from rng.py's kernel
    draw_amax    rng.normal_block_amax: the numbers and the MXFP4 block maxima (the two-pass form: the part whole
                 in float32, then `pack`)
    pack         fast.mxfp4_quantize_t(w, amax): codes and scales from a drawn part
    fused        rng.draw_mxfp4_t: drawn and packed a 32-row strip at a time (no float32 part in memory)
    part         LayerWeights._make_packed: one part as the weight store draws it (the fused draw and its allocation)
    all_cores    LayerWeights._draw_parts over 2 parts per core on a thread pool: what `fullsize.py`
                 reports as `draw_rate_mparams_s` (per pass over the touched experts)

Best of `--repeats` (this machine is shared: rates move by up to 2x with the load, so compare ratios
measured in one run, and repeat). Napkin math: a part is 11 M normals; at batch 64 a layer draws 1,326
of them (442 experts x 3 parts, 14.6 G params), so 300 M params/s on both cores is ~50 s a pass.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from typing import Callable

import numpy as np

from fullsize import call_seconds  # benchmarks/ is the script's folder, first on sys.path
from simulator.fast import kernels as fast, rng
from simulator.config import load_model
from simulator.weights import LayerWeights, _seed


def best_rate(fn: Callable[[], object], params: int, repeats: int) -> dict[str, float]:
    """M params/s: the best and the median of `repeats` timed calls (after one warm-up call)."""
    times = call_seconds(fn, repeats)
    return {"best": round(params / min(times) / 1e6, 1), "median": round(params / statistics.median(times) / 1e6, 1)}


def run(repeats: int) -> dict[str, object]:
    cfg = load_model("kimi-k3")
    weights = LayerWeights(cfg, layer=1, seed=0)
    k, n = cfg.expert_in_dim, cfg.moe_intermediate
    params, std = k * n, np.float32(k ** -0.5)
    seed = _seed(0, 1, "expert.0.w_gate")
    w, amax_t = np.empty((k, n), np.float32), np.empty((k // 32, n), np.float32)
    rng.normal_block_amax(rng.pcg64_words(seed), std, w, amax_t)
    cores = os.cpu_count() or 1
    keys = [(e, "w_gate") for e in range(2 * cores)]
    stages: dict[str, Callable[[], object]] = {
        "numpy": lambda: np.random.default_rng(seed).standard_normal((k, n), dtype=np.float32),
        "draw": lambda: rng.standard_normal_f32(seed, (k, n), float(std)),
        "draw_amax": lambda: rng.normal_block_amax(rng.pcg64_words(seed), std, w, amax_t),
        "pack": lambda: fast.mxfp4_quantize_t(w, amax_t),
        "fused": lambda: rng.draw_mxfp4_t(seed, (k, n), float(std)),
        "part": lambda: weights._make_packed("expert.0.w_gate"),
    }
    if not hasattr(rng, "draw_mxfp4_t"):  # an older checkout (PYTHONPATH): the stages it has
        del stages["fused"]
    rates = {name: best_rate(fn, params, repeats) for name, fn in stages.items()}
    rates["all_cores"] = best_rate(lambda: weights._draw_parts(keys), params * len(keys), repeats)
    return {"part_shape": [k, n], "cores": cores, "repeats": repeats, "mparams_per_s": rates,
            "batch64_pass_s": round(14.6e3 / rates["all_cores"]["best"], 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per stage (best and median reported)")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    args = parser.parse_args()
    doc = run(args.repeats)
    if args.json:
        print(json.dumps(doc, indent=2))
        return
    print(f"expert part {doc['part_shape'][0]} x {doc['part_shape'][1]}, best / median of {args.repeats}, M params/s:")
    for name, rate in doc["mparams_per_s"].items():
        print(f"  {name:10s} {rate['best']:8.1f} {rate['median']:8.1f}")
    print(f"batch 64 (14.6 G params) at the all-cores rate: {doc['batch64_pass_s']} s a pass")


if __name__ == "__main__":
    main()
