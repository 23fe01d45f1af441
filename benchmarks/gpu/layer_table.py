"""The whole-layer replays against the makespans committed before them: one compare-trace per trace.

    python benchmarks/gpu/layer_table.py                     # tests/data/traces/vllm-h200-*.json.gz
    python benchmarks/gpu/layer_table.py --traces calibration/h200/production/layers/repeat --prefix "" \
        --out calibration/h200/production/layers/repeat/comparison.csv

For each row of predictions.csv (predict_layers.py, committed before the GPU run) it reads the replay's
trace (layer_replay.py), runs `moe-sim compare-trace` on it (engine vllm-h200, the plan restricted to the
kernels the replay ran: predict_layers.replay_keys) and writes one row: the pre-committed makespan, the
measured one (compare-trace's: first kernel start to last kernel end of the layer it finds, median over
the layers that share its signature), the error against the pre-committed makespan, what compare-trace
matched, left unmatched and folded, how many layers it found, and as a cross-check the median makespan over
all the replay's layers (the trace's kernels cut into equal consecutive runs, one per replayed layer: a
CUDA-graph replay may put a layer's launches on other stream ids than the layer before it, which
compare-trace's per-stream signatures then tell apart). Metric: makespan of one decoder layer on one TP8
rank, all-reduces left out, µs; error = measured / predicted - 1.
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path[:0] = [str(Path(__file__).resolve().parent), str(ROOT)]

from predict_layers import LAYERS, replay_keys  # noqa: E402
from rows import read_rows, write_rows  # noqa: E402

PREDICTIONS = ROOT / "calibration/h200/production/layers/predictions.csv"
TRACES, PREFIX = ROOT / "tests/data/traces", "vllm-h200-"
ENGINE = "vllm-h200"
FIELDS = ["replay", "predicted_us", "measured_us", "error_pct", "all_layers_us", "all_layers_error_pct", "matched",
          "plan_kernels", "unmatched_measured", "unmatched_plan", "folded", "layers_found", "layers_replayed",
          "median_abs_kernel_error_pct", "median_abs_launch_error_pct"]


def read_trace(path: Path) -> dict:
    return json.loads(gzip.decompress(path.read_bytes()))


def all_layers_makespan(doc: dict) -> float | None:
    """Median over the replayed layers of first start to last end, the kernels (sorted by start) cut into
    `layers` equal runs; None when the runs do not hold the same kernel names (not one layer each)."""
    n = doc.get("moeSimReplay", {}).get("layers", 0)
    ks = sorted((e for e in doc["traceEvents"] if e.get("ph") == "X"), key=lambda e: e["ts"])
    if n < 1 or len(ks) % n:
        return None
    size = len(ks) // n
    runs = [ks[i * size:(i + 1) * size] for i in range(n)]
    if any(sorted(e["name"] for e in r) != sorted(e["name"] for e in runs[0]) for r in runs):
        return None
    return statistics.median(max(e["ts"] + e["dur"] for e in r) - min(e["ts"] for e in r) for r in runs)


def compare_replay(trace: Path, pred: dict, keys: tuple[str, ...] | None = None, layer_type: str | None = None,
                   layer_index: int | None = None) -> dict:
    """One row of the table for a replay's trace and its predictions.csv row; keys (the plan kernels the replay
    ran), layer_type and layer_index default to predict_layers' K3 / DeepSeek-V3 replays."""
    from simulator.config import load_model
    from simulator.hardware import load_hardware
    from simulator.plans.kernel import DecodeShape
    from simulator.report.trace_compare import compare_trace
    model, b, t = pred["model"], int(pred["batch"]), int(pred["tokens_per_seq"])
    keys = keys or replay_keys(model, b, t)
    doc, _ = compare_trace(str(trace), load_model(model), load_hardware(pred["hardware"], pred["kernel_set"]),
                           int(pred["tp"]), DecodeShape(b, t, int(pred["context"])), layer_type or dict(LAYERS)[model],
                           engine=ENGINE, plan_keys=keys, layer=layer_index)
    return row_of(trace, pred, doc, keys)


def row_of(trace: Path, pred: dict, doc: dict, keys: tuple[str, ...]) -> dict:
    """The table's row from compare-trace's doc of a replay's trace."""
    predicted, measured = float(pred["makespan_us"]), doc["makespan_us"]["measured"]
    raw = read_trace(trace)
    every = all_layers_makespan(raw)
    return {"replay": pred["replay"], "predicted_us": predicted, "measured_us": round(measured, 3),
            "error_pct": round((measured / predicted - 1) * 100, 2),
            "all_layers_us": None if every is None else round(every, 3),
            "all_layers_error_pct": None if every is None else round((every / predicted - 1) * 100, 2),
            "matched": doc["matched"], "plan_kernels": len(keys),
            "unmatched_measured": len(doc["unmatched_measured"]), "unmatched_plan": len(doc["unmatched_plan"]),
            "folded": len(doc["folded_measured"]), "layers_found": doc["layers_found"],
            "layers_replayed": raw.get("moeSimReplay", {}).get("layers", ""),
            "median_abs_kernel_error_pct": doc["median_abs_pct_error"],
            "median_abs_launch_error_pct": doc["median_abs_launch_error_pct"]}


def table(predictions: Path, traces: Path, prefix: str, compare=None, present: bool = False) -> list[dict]:
    """One row per prediction, by `compare(trace, prediction)` (compare_replay unless given); `present`: only
    the predictions whose trace is in `traces`."""
    compare = compare or compare_replay
    preds = read_rows(predictions)
    if present:
        preds = [p for p in preds if (traces / f"{prefix}{p['replay']}.json.gz").is_file()]
    missing = [p["replay"] for p in preds if not (traces / f"{prefix}{p['replay']}.json.gz").is_file()]
    if missing:
        raise FileNotFoundError(f"{traces}: no trace {prefix}{missing[0]}.json.gz (one per row of {predictions.name})")
    return [compare(traces / f"{prefix}{p['replay']}.json.gz", p) for p in preds]


def cli_table(description: str, predictions: Path, fields: list[str], compare=None, with_present: bool = False
              ) -> list[dict]:
    """The command line every replay table shares: --predictions, --traces, --prefix, --out (and --present), the
    table of `table`, the rows written to --out; a missing file is one line on stderr and exit 2."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--predictions", type=Path, default=predictions)
    ap.add_argument("--traces", type=Path, default=TRACES)
    ap.add_argument("--prefix", default=PREFIX, help="trace file name before the replay name")
    ap.add_argument("--out", type=Path, help="also write the rows to this CSV")
    if with_present:
        ap.add_argument("--present", action="store_true", help="only the predictions whose trace is there")
    args = ap.parse_args()
    if not args.predictions.is_file():
        ap.exit(2, f"--predictions {args.predictions}: no such file.\n")
    try:
        rows = table(args.predictions, args.traces, args.prefix, compare, getattr(args, "present", False))
    except FileNotFoundError as exc:
        ap.exit(2, f"{exc}.\n")
    if args.out:
        write_rows(args.out, rows, fields)
    return rows


def main() -> int:
    rows = cli_table(__doc__.splitlines()[0], PREDICTIONS, FIELDS)
    print("makespan of one layer on one TP8 rank, all-reduces left out (us); error = measured / predicted - 1")
    print("| replay | predicted | measured | error | all layers | error | matched | unmatched | folded | layers |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['replay']} | {r['predicted_us']:.1f} | {r['measured_us']:.1f} | {r['error_pct']:+.1f} % | "
              f"{r['all_layers_us']:.1f} | {r['all_layers_error_pct']:+.1f} % | {r['matched']} / {r['plan_kernels']} | "
              f"{r['unmatched_measured']} + {r['unmatched_plan']} | {r['folded']} | "
              f"{r['layers_found']} of {r['layers_replayed']} |")
    errs = [abs(r["error_pct"]) for r in rows]
    print(f"|error|: median {statistics.median(errs):.1f} %, worst {max(errs):.1f} %; "
          f"{sum(e <= 10 for e in errs)} of {len(errs)} within 10 %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
