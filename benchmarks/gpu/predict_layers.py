"""The cost model's makespans of the whole-layer replays (layer_replay.py), written before they are measured.

    python benchmarks/gpu/predict_layers.py --out calibration/h200/production/layers/predictions.csv

One row per replay: the standard Kimi K3 KDA layer and the DeepSeek-V3 MLA layer at TP8 (one rank's shapes),
batch 1, 8, 64, one token and 1 + 3 drafts per sequence, context CONTEXT. The price is the one
`moe-sim compare-trace --hardware h200 --kernels vllm --tp 8` puts beside a replay trace: the standard plan
restricted to its non-collective kernels (trace_patterns.partial_plan: the two all-reduces and the
dependencies on them dropped, so each kernel after an all-reduce follows the kernel before it after one
launch gap), scheduled by cost.timeline.schedule on the H200 profile with the `vllm` kernel set, makespan =
first kernel start to last kernel end. The full layer's makespan (all-reduces in) and what the all-reduces
cost in it are written beside, for reference. No GPU needed.

--as-launched prices the replay as layer_replay.py launches it rather than as vLLM would: its dense GEMMs
are cuBLAS through torch, which launches without programmatic dependent launch (in the round-1 and round-2
traces every cuBLAS kernel starts 0.29-1.10 µs after the kernel before it ends), so no plan kernel prefetches
its weights before its predecessor ends and every boundary costs the launch gap: the `vllm` set with its
`pdl` off. (vLLM's own K3 projections at few tokens are CuTe DSL skinny GEMMs launched with PDL,
docs/production-kernels.md, which is what the set's `pdl = true` describes.)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path[:0] = [str(HERE), str(ROOT)]

from rows import simulator_commit, write_rows  # noqa: E402

LAYERS = (("kimi-k3", "kda"), ("deepseek-v3", "mla"))
TP, BATCHES, TOKENS, CONTEXT = 8, (1, 8, 64), (1, 4), 8192
HARDWARE, KERNELS = "h200", "vllm"
FIELDS = ["replay", "model", "layer", "tp", "batch", "tokens_per_seq", "context", "hardware", "kernel_set",
          "kernels", "left_out", "makespan_us", "full_layer_makespan_us", "left_out_us", "simulator_commit", "pdl"]


def replay_name(model: str, batch: int, tokens: int) -> str:
    """File stem of a replay's trace: kda-b8t1, mla-b64t4 (the layer type of the model's layers)."""
    layer = dict(LAYERS)[model]
    return f"{layer}-b{batch}t{tokens}"


def replay_keys(model: str, batch: int, tokens: int) -> tuple[str, ...]:
    """The plan keys a one-GPU replay runs: every kernel of the standard plan but the collectives."""
    return tuple(k.key for k in _plan(model, batch, tokens) if k.kind != "collective")


def _plan(model: str, batch: int, tokens: int):
    from simulator.config import load_model
    from simulator.cost.step import build_plan
    from simulator.hardware import load_hardware
    from simulator.plans.kernel import DecodeShape
    from simulator.plans.standard import arch_of
    return build_plan(load_model(model), "standard", TP, DecodeShape(batch, tokens, CONTEXT), dict(LAYERS)[model],
                      arch=arch_of(load_hardware("h200")))  # Hopper's stock plan: the kernels the replay ran


def makespan(timeline) -> float:
    """First kernel start to last kernel end: compare-trace's makespan of the model's layer."""
    return timeline.layer_us - min(s.start_us for s in timeline.spans)


def predict(model: str, batch: int, tokens: int, hw) -> dict:
    from simulator.cost.timeline import schedule
    from simulator.report.trace_patterns import partial_plan
    plan = _plan(model, batch, tokens)
    keys = replay_keys(model, batch, tokens)
    replay = makespan(schedule(partial_plan(plan, keys), hw))
    full = makespan(schedule(plan, hw))
    return {"replay": replay_name(model, batch, tokens), "model": model, "layer": plan.layer, "tp": TP,
            "batch": batch, "tokens_per_seq": tokens, "context": CONTEXT, "hardware": HARDWARE,
            "kernel_set": hw.kernels, "pdl": hw.kernel_set.pdl, "kernels": len(keys),
            "left_out": ";".join(k.key for k in plan if k.key not in keys),
            "makespan_us": round(replay, 3), "full_layer_makespan_us": round(full, 3),
            "left_out_us": round(full - replay, 3)}


def as_launched(hw):
    """The profile with its kernel set's PDL off (module docstring: the replay's cuBLAS launches have none)."""
    from dataclasses import replace
    return replace(hw, kernel_set=replace(hw.kernel_set, pdl=False))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="the predictions CSV to write")
    ap.add_argument("--as-launched", action="store_true",
                    help="price the replay's cuBLAS launches as they run: no PDL, so no weight prefetch")
    args = ap.parse_args()
    from simulator.hardware import load_hardware
    hw = load_hardware(HARDWARE, KERNELS)
    if args.as_launched:
        hw = as_launched(hw)
    commit = simulator_commit()
    rows = [predict(m, b, t, hw) | {"simulator_commit": commit} for m, _ in LAYERS for b in BATCHES for t in TOKENS]
    write_rows(args.out, rows, FIELDS)
    for r in rows:
        print(f"{r['replay']:10s} {r['model']:12s} makespan {r['makespan_us']:8.1f} us without {r['left_out']} "
              f"(full layer {r['full_layer_makespan_us']:.1f} us)")
    print(f"wrote {len(rows)} predictions to {args.out} (H200, kernel set {hw.kernels}, TP{TP}, context {CONTEXT})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
