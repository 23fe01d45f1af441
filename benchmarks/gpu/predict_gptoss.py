"""The cost model's makespans of the gpt-oss-20b decode-layer replays (gptoss_replay.py), written before they run.

    python benchmarks/gpu/predict_gptoss.py --out calibration/h200/production/gptoss/predictions.csv

One row per replay and kernel set: gpt-oss-20b's standard plan on Hopper (arch sm90: the triton_kernels
matmul_ogs MoE of simulator/moe/ogs.py), one rank's shapes at TP1 and TP2, batch 1 / 8 / 32 / 64, one token per
sequence, context 1,720 and 8,192, a sliding-window layer (index 0) and a full-attention layer (index 1). The
price is predict_layers': the plan restricted to its non-collective kernels (at TP2 the all-reduces are left
out and named), scheduled on the H200 profile, makespan = first kernel start to last kernel end; once with the
profile's default kernel set (`vllm`) and once with `datasheet`. No GPU needed. --as-launched: the `vllm` set
with its PDL off, as the replay launches its cuBLAS GEMMs (predict_layers.py says why).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent.parent)]

from predict_layers import as_launched, makespan  # noqa: E402
from rows import simulator_commit, write_rows  # noqa: E402

MODEL, LAYER, HARDWARE = "gpt-oss-20b", "gqa", "h200"
TPS, BATCHES, CONTEXTS, LAYER_INDEXES = (1, 2), (1, 8, 32, 64), (1720, 8192), (0, 1)
KERNEL_SETS = ("vllm", "datasheet")
FIELDS = ["replay", "model", "layer_index", "attention", "tp", "batch", "tokens_per_seq", "context", "hardware",
          "kernel_set", "kernels", "left_out", "makespan_us", "full_layer_makespan_us", "left_out_us",
          "simulator_commit"]


def replay_name(tp: int, batch: int, context: int, layer_index: int) -> str:
    """File stem of a replay's trace: gptoss-tp1-b8-c8192-l0 (l0 the sliding-window layer, l1 a full one)."""
    return f"gptoss-tp{tp}-b{batch}-c{context}-l{layer_index}"


def plan_of(tp: int, batch: int, context: int, layer_index: int):
    """gpt-oss-20b's standard plan on Hopper for one rank at TP tp, one token per sequence."""
    from simulator.config import load_model
    from simulator.cost.step import build_plan
    from simulator.hardware import load_hardware
    from simulator.plans.kernel import DecodeShape
    from simulator.plans.standard import arch_of
    return build_plan(load_model(MODEL), "standard", tp, DecodeShape(batch, 1, context), LAYER, layer=layer_index,
                      arch=arch_of(load_hardware(HARDWARE)))


def configurations():
    return [(tp, b, c, li) for tp in TPS for b in BATCHES for c in CONTEXTS for li in LAYER_INDEXES]


def predict(tp: int, batch: int, context: int, layer_index: int, hw) -> dict:
    from simulator.cost.timeline import schedule
    from simulator.report.trace_patterns import partial_plan
    plan = plan_of(tp, batch, context, layer_index)
    keys = tuple(k.key for k in plan if k.kind != "collective")
    replay = makespan(schedule(partial_plan(plan, keys), hw))
    full = makespan(schedule(plan, hw))
    return {"replay": replay_name(tp, batch, context, layer_index), "model": MODEL, "layer_index": layer_index,
            "attention": "sliding" if layer_index % 2 == 0 else "full", "tp": tp, "batch": batch,
            "tokens_per_seq": 1, "context": context, "hardware": HARDWARE, "kernel_set": hw.kernels,
            "kernels": len(keys), "left_out": ";".join(k.key for k in plan if k.key not in keys),
            "makespan_us": round(replay, 3), "full_layer_makespan_us": round(full, 3),
            "left_out_us": round(full - replay, 3)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="the predictions CSV to write")
    ap.add_argument("--as-launched", action="store_true",
                    help="price the replay's cuBLAS GEMMs as they launch, without PDL (predict_layers.as_launched): "
                         "no weight prefetch under the kernel before; the vllm set only")
    args = ap.parse_args()
    from simulator.hardware import load_hardware
    commit = simulator_commit()
    rows = []
    for kernels in KERNEL_SETS[:1] if args.as_launched else KERNEL_SETS:
        hw = load_hardware(HARDWARE, kernels)
        if args.as_launched:
            hw = as_launched(hw)
        rows += [predict(*c, hw) | {"simulator_commit": commit}
                 for c in configurations()]
    write_rows(args.out, rows, FIELDS)
    for r in rows:
        print(f"{r['replay']:26s} {r['kernel_set']:9s} makespan {r['makespan_us']:7.1f} us "
              f"(full layer {r['full_layer_makespan_us']:.1f} us, left out: {r['left_out'] or '-'})")
    print(f"wrote {len(rows)} predictions to {args.out} ({MODEL} on {HARDWARE}, kernel sets {', '.join(KERNEL_SETS)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
