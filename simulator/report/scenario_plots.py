"""Which pictures a scenario draws, from its rows (and, for one-layer pictures, its base point).

    step      step_vs_x  step time and speedup against the `x` axis, one line per `group`
              metric     any column `y` against `x`
    layer     timeline / kernel_bars / roofline of the base configuration; metric
    ablation  waterfall  per grid point, layer and step: standard -> each fusion -> specialized
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from simulator.scenario import Scenario, point_fusions, point_hardware, point_model


def _point_label(row: dict[str, Any], axes: list[str]) -> str:
    return "-".join(f"{a}{row[a]}" for a in axes) or "base"


LAYER_PICTURES = ("timeline", "kernel_bars", "roofline")


def layer_plots(doc: dict[str, Any], cfg: Any, hw: Any, tp: int, shape: Any, layer: str, variant: str,
                fusions: frozenset[str] | None, out: str | Path, names: tuple[str, ...] = LAYER_PICTURES,
                prefix: str = "layer") -> list[Path]:
    """Timeline (with prefetch windows), per-kernel bars and roofline of one layer report."""
    from simulator.report import plots
    from simulator.report.summary import layer_timelines
    out, files = Path(out), []
    if "timeline" in names:
        tls = layer_timelines(cfg, hw, tp, shape, layer, variant, fusions)
        files += plots.plot_timeline(doc, out, f"{prefix}-timeline", timelines=tls)
    if "kernel_bars" in names:
        files += plots.plot_kernel_bars(doc, out, f"{prefix}-kernels")
    if "roofline" in names:
        files += plots.plot_roofline(doc, out, f"{prefix}-roofline", hw)
    return files


def _layer_pictures(sc: Scenario, out: Path, names: list[str]) -> list[Path]:
    from simulator.plans.kernel import DecodeShape
    from simulator.report.summary import layer_report
    b = sc.base
    cfg, hw = point_model(b["model"], b["precision"]), point_hardware(b["hardware"], b["kernels"])
    shape = DecodeShape(b["batch"], b["tokens_per_seq"], b["context"])
    doc = layer_report(cfg, hw, b["tp"], shape, b["layer"], "both", point_fusions(b))
    return layer_plots(doc, cfg, hw, b["tp"], shape, b["layer"], "both", point_fusions(b), out,
                       tuple(n for n in names if n in LAYER_PICTURES), prefix=sc.name)


def _waterfalls(sc: Scenario, rows: list[dict[str, Any]], out: Path) -> list[Path]:
    from simulator.report import plots
    axes, files = list(sc.sweep), []
    points: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        points.setdefault(_point_label(row, axes), []).append(row)
    for label, group in points.items():
        for level, unit, start in (("layer", "µs", "standard_layer_us"), ("step", "ms", "standard_step_ms")):
            column = f"waterfall_{level}_{unit.replace('µs', 'us')}"
            steps = [("standard", group[0][start])] + [(r["fusion"], -r[column]) for r in group]
            title = f"{sc.name} {label}: {level} time, standard -> specialized ({unit})"
            files += plots.plot_waterfall(steps, out, f"{sc.name}-{label}-{level}-waterfall", title, unit)
    return files


def scenario_plots(sc: Scenario, rows: list[dict[str, Any]], out: Path) -> list[Path]:
    from simulator.report import plots
    names = list(sc.outputs.get("plots", []))
    ok = [r for r in rows if r["status"] == "ok"]
    if not ok:
        return []
    o = sc.outputs
    x = o.get("x", next(iter(sc.sweep), "batch"))
    files: list[Path] = []
    if "step_vs_x" in names:
        files += plots.plot_step_vs_batch(ok, out, f"{sc.name}-step", x=x, group=o.get("group"))
    if "metric" in names:
        y = o.get("y", "step_ms" if sc.kind == "step" else "layer_us")
        files += plots.plot_metric(ok, out, f"{sc.name}-{y}", x, y, group=o.get("group"),
                                   title=f"{sc.name}: {y} vs {x}", logx=bool(o.get("logx", False)))
    if sc.kind == "layer" and {"timeline", "kernel_bars", "roofline"} & set(names):
        files += _layer_pictures(sc, out, names)
    if "waterfall" in names:
        files += _waterfalls(sc, ok, out)
    return files


def ablation_plots(doc: dict[str, Any], out_dir: str | Path) -> list[Path]:
    """Layer and step waterfalls of one `ablate` result (for `moe-sim ablation --plot DIR`)."""
    from simulator.cost.ablation import waterfall
    from simulator.report import plots
    out = Path(out_dir)
    cond = f"{doc['hardware']} TP{doc['tp']} batch {doc['batch']} x {doc['tokens_per_seq']}"
    return (plots.plot_waterfall(waterfall(doc, "layer"), out, "ablation-layer-waterfall",
                                 f"{doc['layer'].upper()} layer time, standard -> specialized ({cond})", "µs")
            + plots.plot_waterfall(waterfall(doc, "step"), out, "ablation-step-waterfall",
                                   f"decode step time, standard -> specialized ({cond})", "ms"))
