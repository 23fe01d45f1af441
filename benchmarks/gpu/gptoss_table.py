"""The gpt-oss-20b decode-layer replays against the makespans committed before them, per kernel set.

    python benchmarks/gpu/gptoss_table.py --out calibration/h200/production/gptoss/comparison.csv

For each row of predictions.csv (predict_gptoss.py, committed before the GPU run: one per configuration and
kernel set) it runs compare-trace on the replay's trace (gptoss_replay.py; tests/data/traces/vllm-h200-*.json.gz)
as layer_table does (engine vllm-h200, the plan of that layer index restricted to the kernels
the replay ran) and writes one row: the pre-committed makespan, the measured one (first kernel start to last
kernel end of one layer, median over the layers compare-trace finds), the error, what was matched and folded,
and per family (gemm, gqa attention, moe, small) the error of the family's summed kernel time. Metric: makespan of
one gpt-oss-20b decoder layer on one rank (TP1, or one TP2 rank with the all-reduces left out), µs;
error = measured / predicted - 1.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path[:0] = [str(HERE), str(ROOT)]

import layer_table  # noqa: E402
from predict_gptoss import LAYER, plan_of  # noqa: E402

PREDICTIONS = ROOT / "calibration/h200/production/gptoss/predictions.csv"
FAMILIES = ("gemm", "gqa", "moe", "small")
FIELDS = (["replay", "kernel_set"] + layer_table.FIELDS[1:] + ["launches_per_layer"]
          + [f"{f}_error_pct" for f in FAMILIES])


def family_errors(kernels: list[dict]) -> dict:
    """Per family: summed measured / summed model kernel time - 1, in % (None where the family is absent)."""
    out = {}
    for fam in FAMILIES:
        ks = [k for k in kernels if k["family"] == fam and k["measured_us"] is not None]
        model = sum(k["model_us"] for k in ks)
        out[f"{fam}_error_pct"] = round((sum(k["measured_us"] for k in ks) / model - 1) * 100, 2) if model else None
    return out


def compare(trace: Path, pred: dict) -> dict:
    from simulator.config import load_model
    from simulator.hardware import load_hardware
    from simulator.plans.kernel import DecodeShape
    from simulator.report.trace_compare import compare_trace
    tp, b, c, li = (int(pred[k]) for k in ("tp", "batch", "context", "layer_index"))
    keys = tuple(k.key for k in plan_of(tp, b, c, li) if k.kind != "collective")
    doc, _ = compare_trace(str(trace), load_model(pred["model"]), load_hardware(pred["hardware"], pred["kernel_set"]),
                           tp, DecodeShape(b, 1, c), LAYER, engine=layer_table.ENGINE, plan_keys=keys, layer=li)
    row = layer_table.row_of(trace, pred, doc, keys)
    launches = sum(k["launches"] for k in doc["kernels"])
    return row | {"kernel_set": pred["kernel_set"], "launches_per_layer": launches} | family_errors(doc["kernels"])


def main() -> int:
    rows = layer_table.cli_table(__doc__.splitlines()[0], PREDICTIONS, FIELDS, compare, with_present=True)
    print("makespan of one gpt-oss-20b layer on one H200 rank, all-reduces left out (us); "
          "error = measured / predicted - 1; families: summed kernel time")
    print("| replay | kernels | predicted | measured | error | matched | folded | gemm | gqa | moe | small |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    pct = lambda v: "-" if v is None else f"{v:+.0f} %"  # noqa: E731
    for r in rows:
        print(f"| {r['replay']} | {r['kernel_set']} | {r['predicted_us']:.1f} | {r['measured_us']:.1f} | "
              f"{r['error_pct']:+.1f} % | {r['matched']} / {r['plan_kernels']} | {r['folded']} | "
              + " | ".join(pct(r[f"{f}_error_pct"]) for f in FAMILIES) + " |")
    for ks in dict.fromkeys(r["kernel_set"] for r in rows):
        errs = [abs(r["error_pct"]) for r in rows if r["kernel_set"] == ks]
        print(f"{ks}: |error| median {statistics.median(errs):.1f} %, worst {max(errs):.1f} %; "
              f"{sum(e <= 10 for e in errs)} of {len(errs)} within 10 %, {sum(e <= 25 for e in errs)} within 25 %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
