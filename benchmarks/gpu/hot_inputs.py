"""Are short kernels faster inside a layer because their inputs are hot in L2? Time them both ways.

    python benchmarks/gpu/hot_inputs.py --out calibration/h200/hot_inputs.csv

For every small-kernel point of the suite layer (benchmarks/gpu/capture_traces.py --suite: Kimi K3 TP8,
batch 1 and 64) the kernel is timed back to back in one CUDA graph twice: inputs rotated cold over >= 4 x L2
(what suite.py measures) and one input set reused by every launch (hot in L2, as in a layer where the
previous kernel just wrote it). (The suite's GEMMs already reuse one activation tensor; only their weights
rotate.) The in-layer slot of the same kernel is in the suite-layer trace; tests/test_compare_trace.py
compares the three. No GPU: one sentence, exit 0.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import say_no_gpu, time_graph  # noqa: E402

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    if say_no_gpu("hot_inputs", "nothing measured"):
        return 0
    import torch
    import fam_small
    from capture_traces import SUITE_BATCHES, suite_layer_points
    rows = []
    with torch.inference_mode():
        for batch in SUITE_BATCHES:
            for p in suite_layer_points(batch):
                if p.family != "small":
                    continue
                cold = fam_small.small_calls(p, torch)
                res_cold = time_graph(torch, cold, reps=max(32, len(cold)))
                res_hot = time_graph(torch, fam_small.builders(p, torch, 1), reps=256)
                rows.append({"id": p.id, "batch": batch, "plan_key": p.plan_key, "family": p.family,
                             "cold_us": round(res_cold["median_us"], 4), "hot_us": round(res_hot["median_us"], 4)})
                print(rows[-1], flush=True)
                args.out.parent.mkdir(parents=True, exist_ok=True)
                with args.out.open("w", newline="") as fh:
                    w = csv.DictWriter(fh, fieldnames=list(rows[0]))
                    w.writeheader()
                    w.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
