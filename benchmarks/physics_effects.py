"""The four decode steps issue 9's table tracks: GB300 TP16 batch 1, 8 and 64, and H200 TP8 batch 32.

    python benchmarks/physics_effects.py [--json]

Standard and specialized step ms (context 512, no speculation, uniform routing) with the profiles as they
stand, plus the four published figures. Run it after each cost-model change; docs/cost-model.md keeps
the table of what each change did.
"""

from __future__ import annotations

import argparse
import json

from simulator.config import load_model
from simulator.cost import calibrate as cal
from simulator.cost.step import estimate_step
from simulator.hardware import load_hardware

CONFIGS = (("gb300", 16, 1), ("gb300", 16, 8), ("gb300", 16, 64), ("h200", 8, 32))


def measure() -> dict:
    cfg = load_model("kimi-k3")
    out = {}
    for hw_name, tp, batch in CONFIGS:
        hw = load_hardware(hw_name)
        out[f"{hw_name} TP{tp} B{batch}"] = {v: round(estimate_step(cfg, hw, v, tp, batch, 512).step_us / 1000, 3)
                                            for v in ("standard", "specialized")}
    gb300 = load_hardware("gb300")
    out["published"] = {f.name: round(cal.model_value(f, cfg, gb300), 3) for f in cal.FITTED}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    doc = measure()
    if ap.parse_args().json:
        print(json.dumps(doc, indent=1))
        return
    for name, vals in doc.items():
        print(f"{name:34s} " + "  ".join(f"{k} {v}" for k, v in vals.items()))


if __name__ == "__main__":
    main()
