"""Pictures of one decode layer and of sweeps, drawn with matplotlib from the plain dicts the report builds.

What each picture answers
-------------------------
- `plot_timeline`: *where does one TP rank spend a layer?* A Gantt chart per variant, one row per CUDA
  stream: a kernel is a bar from start_us to start_us + duration_us, coloured by what bounds it (memory,
  compute, latency, communication), hatched if it is a collective; white space is a launch gap or a wait
  on the other stream; a thin strip under a bar is its weight-prefetch window (PDL prologue). Two vertical
  lines: the layer time (makespan) and the speed-of-light floor of cost/timeline.py,
      floor = max( B / BW, max over streams [ sum alpha_min + (B_s - PF_s) / BW ] ),
  so the gap between them is what fixed costs, launch gaps and serialisation lose.
- `plot_kernel_bars`: *which kernels add up to the layer?* The durations, stacked in launch order. On one
  stream, sum + launch gaps = layer time; overlap on the aux stream makes the sum exceed it.
- `plot_roofline`: *how far is each kernel from its roof?* Achieved F / t against I = F / S, under
  min(BW I, R). A decode GEMM has I ~ M FLOP/B (M tokens), far left of the GB300 bf16 ridge
  2.5e15 / 8e12 = 312 FLOP/B, and its distance below the memory roof is the fixed cost of
  docs/cost-model.md section 1.2 (2.4 µs of fixed cost halves the bandwidth of a 16 MB GEMM).
- `plot_step_vs_batch`: step time per variant against a sweep axis, and the speedup standard / specialized.
- `plot_waterfall`: the standard total, each fusion's saving, the specialized total.
- `plot_metric`: any column against any column, one line per group (context or speculative sweeps).
- Sweep lines carry a shaded band where the rows have `<y>_low` / `<y>_high` columns: the 90 % interval
  of docs/cost-model.md section 8 (and the per-draw speedup interval under the speedup line).

Dimension legend: M decode tokens, S HBM bytes of a kernel, F its FLOPs, t its duration, I = F / S,
BW datasheet HBM bandwidth, R dense peak FLOP/s of a math format, B / B_s / PF_s bytes of the layer /
of one stream / prefetched on it.

Mechanics
---------
- matplotlib is imported inside the functions, so importing this module is free. Figures live on the Agg
  canvas directly (`Figure` + `FigureCanvasAgg`), never pyplot: no global figure registry, no backend
  switch, nothing to close. Style is one read-only mapping applied with `rc_context` per drawing.
- Each public function checks its input first (ValueError, one sentence), then draws, then writes
  `<stem>.png` and `<stem>.svg` to hidden temporary files in `out_dir` and `os.replace`s them: a reader
  never sees half a picture and a failure leaves no file behind.
- SVG text stays text (`svg.fonttype = none`: searchable, small); ids are salted with a constant and the
  date is dropped, so a re-run writes identical files (diff-friendly for the README).
- Names go inside a bar where they fit, else beside it with a leader, measured with the renderer after
  the layout is fixed; a name that would overlap an earlier one is left out (longest kernels first).
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Hashable, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.backend_bases import RendererBase
    from matplotlib.figure import Figure

    from simulator.cost.timeline import Timeline
    from simulator.hardware import HardwareProfile

from simulator.plans import VARIANTS
from simulator.report.plot_kit import BAR_HEIGHT, GREY, _figure, _freeze_layout, _label_bars, _place_label, _render

Row = Mapping[str, Any]
WaterfallKind = Literal["total", "saving", "cost"]
WaterfallBar = tuple[str, float, float, WaterfallKind]  # label, bottom, height (>= 0), kind
Window = tuple[str, str, float, float]  # kernel key, stream, prefetch start (µs), prefetch end (µs)
Point = tuple[str, float, float, float]  # kernel key, intensity (FLOP/B), achieved FLOP/s, duration (µs)

COLLECTIVE_KINDS = frozenset({"collective", "gemm_collective"})
HATCH = "////"
INK = "#222222"
PREFETCH_COLOR = "#7B3294"
# Okabe-Ito colours, readable for colour-blind readers.
BOUND_COLORS: Mapping[str, str] = MappingProxyType(
    {"memory": "#0072B2", "compute": "#D55E00", "latency": "#E69F00", "communication": "#009E73"})
KIND_COLORS: Mapping[str, str] = MappingProxyType({
    "gemm": "#0072B2", "moe": "#56B4E9", "attention": "#CC79A7", "router": "#E69F00", "pointwise": "#B8B8B8",
    "collective": "#009E73", "gemm_collective": "#117A65"})
GROUP_COLORS = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#882255", "#999933")
VARIANT_STYLE: Mapping[str, tuple[str, str, str]] = MappingProxyType(  # colour, marker, line
    {"standard": ("#5F6B7A", "o", "--"), "specialized": ("#D55E00", "s", "-")})
WATERFALL_COLORS: Mapping[str, str] = MappingProxyType({"total": "#8C8C8C", "saving": "#2E9E5B", "cost": "#D0463B"})
# Sweep-row columns that state conditions (the scenario's configuration columns, less `variant`).
CONDITION_KEYS = ("model", "hardware", "tp", "batch", "tokens_per_seq", "context", "layer", "precision",
                  "draft_tokens", "acceptance_length", "drafter", "fusion_off", "fusion_on")
AXIS_LABELS: Mapping[str, str] = MappingProxyType({
    "batch": "batch (sequences)", "context": "context length (tokens)", "tp": "tensor-parallel degree P",
    "tokens_per_seq": "tokens per sequence per step", "draft_tokens": "draft tokens per verify step",
    "acceptance_length": "mean acceptance length (tokens / step)", "step_ms": "decode step time (ms)",
    "tokens_per_s": "throughput, all sequences (tokens/s)", "tokens_per_s_per_user": "per-user throughput (tokens/s)",
    "layer_us": "layer time (µs)", "speedup": "speedup, standard / specialized (×)"})
UNIT_SUFFIXES = (("_ms", "ms"), ("_us", "µs"), ("_gbps", "GB/s"), ("_gb", "GB"), ("_bytes", "B"), ("_per_s", "per s"))
# ============================================================================ one layer: timeline


def plot_timeline(layer_doc: Mapping[str, Any], out_dir: Path, stem: str,
                  timelines: Mapping[str, Timeline] | None = None) -> list[Path]:
    """Per-stream Gantt chart of one layer, one panel per variant (standard above specialized), one µs axis.

    `layer_doc` is `summary.layer_report(...)`; pass `summary.layer_timelines(...)` as `timelines` to draw
    the prefetch windows, which the dict does not carry.
    """
    variants = _variants(layer_doc)
    windows = prefetch_windows(timelines) if timelines else {}
    return _render(lambda: _timeline_figure(layer_doc, variants, windows), out_dir, stem)


def prefetch_windows(timelines: Mapping[str, Timeline]) -> dict[str, list[Window]]:
    """Per variant: (key, stream, start, end) of every kernel that loaded weights before it started."""
    return {v: [(s.key, s.stream, s.prefetch_start_us, s.prefetch_end_us) for s in tl.spans
                if s.prefetch_start_us is not None and s.prefetch_end_us is not None]
            for v, tl in timelines.items()}


def _timeline_figure(doc: Mapping[str, Any], variants: list[str], windows: Mapping[str, list[Window]]) -> Figure:
    streams = _streams(doc, variants)
    fig = _figure(12.0, 1.3 + len(variants) * (0.62 * len(streams) + 0.9))
    axes = fig.subplots(len(variants), 1, sharex=True, squeeze=False)[:, 0]
    for ax, v in zip(axes, variants):
        _timeline_panel(ax, doc["variants"][v], v, streams, windows.get(v, []))
    end = max(k["start_us"] + k["duration_us"] for v in variants for k in doc["variants"][v]["kernels"])
    axes[-1].set_xlim(0.0, end * 1.015)
    axes[-1].set_xlabel("time since the layer's first launch (µs)")
    head = "Kernel timeline of one decoder layer on one TP rank, per CUDA stream"
    if doc.get("speedup"):
        head += f": specialized {doc['speedup']:.2f}× faster"
    fig.suptitle(f"{head}\n{_conditions(doc)}", x=0.01, ha="left")
    handles = _timeline_legend(doc, variants, windows)
    fig.legend(handles=handles, loc="outside lower center", ncols=len(handles))
    renderer = _freeze_layout(fig)
    for ax, v in zip(axes, variants):
        _label_bars(ax, renderer, [(k["key"], k["start_us"], k["duration_us"], streams.index(k["stream"]),
                                    BOUND_COLORS.get(k["bound"], INK)) for k in doc["variants"][v]["kernels"]])
    return fig


def _timeline_panel(ax: Axes, run: Mapping[str, Any], variant: str, streams: list[str],
                    windows: list[Window]) -> None:
    for k in run["kernels"]:
        ax.barh(streams.index(k["stream"]), k["duration_us"], left=k["start_us"], height=BAR_HEIGHT,
                color=BOUND_COLORS.get(k["bound"], INK), edgecolor="white", linewidth=0.6,
                hatch=HATCH if k["kind"] in COLLECTIVE_KINDS else None)
    for _, stream, start, end in windows:  # a thin strip beneath the kernel row
        ax.barh(streams.index(stream) + 0.41, end - start, left=start, height=0.11, color=PREFETCH_COLOR,
                alpha=0.55, linewidth=0)
    for x, style, text in ((run["floor_us"], "--", "floor"), (run["layer_us"], "-", "layer")):
        ax.axvline(x, color=INK, linestyle=style, linewidth=1.1)
        ax.text(x, -0.9, f" {text} {x:.1f} µs", ha="left", va="center", fontsize=7.5, color=INK)
    ax.set_yticks(range(len(streams)), streams)
    ax.set_ylim(len(streams) - 0.1, -1.02)  # row 0 on top; room for names above it and below the last
    ax.set_ylabel("stream")
    ax.grid(axis="y", visible=False)
    ax.set_title(f"{variant}: {run['kernel_count']} kernels, layer {run['layer_us']:.1f} µs, "
                 f"speed-of-light floor {run['floor_us']:.1f} µs")


def _timeline_legend(doc: Mapping[str, Any], variants: list[str], windows: Mapping[str, list[Window]]) -> list[Any]:
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    bounds = {k["bound"] for v in variants for k in doc["variants"][v]["kernels"]}
    handles: list[Any] = [Patch(color=c, label=f"{b}-bound") for b, c in BOUND_COLORS.items() if b in bounds]
    handles.append(Patch(facecolor="#9A9A9A", edgecolor="white", hatch=HATCH, label="collective (hatched)"))
    if any(windows.get(v) for v in variants):
        handles.append(Patch(color=PREFETCH_COLOR, alpha=0.55, label="weight prefetch window (PDL)"))
    return handles + [Line2D([], [], color=INK, linestyle="-", label="layer time (makespan)"),
                      Line2D([], [], color=INK, linestyle="--", label="speed-of-light floor")]


# ============================================================================ one layer: kernel bars


def plot_kernel_bars(layer_doc: Mapping[str, Any], out_dir: Path, stem: str) -> list[Path]:
    """One horizontal stacked bar per variant: each segment one kernel's duration (µs), coloured by kind."""
    variants = _variants(layer_doc)
    return _render(lambda: _kernel_bars_figure(layer_doc, variants), out_dir, stem)


def _kernel_bars_figure(doc: Mapping[str, Any], variants: list[str]) -> Figure:
    from matplotlib.patches import Patch
    runs = [doc["variants"][v] for v in variants]
    found = _ordered(k["kind"] for run in runs for k in run["kernels"])
    kinds = [k for k in KIND_COLORS if k in found] + [k for k in found if k not in KIND_COLORS]
    colors = {kind: KIND_COLORS.get(kind, GROUP_COLORS[i % len(GROUP_COLORS)]) for i, kind in enumerate(kinds)}
    fig = _figure(12.0, 2.1 + 1.0 * len(variants))
    ax = fig.subplots()
    bars = [(k["key"], left, k["duration_us"], i, colors[k["kind"]], k["kind"] in COLLECTIVE_KINDS)
            for i, run in enumerate(runs) for k, left in zip(run["kernels"], _lefts(run["kernels"]))]
    for text, left, width, i, color, hatched in bars:
        ax.barh(i, width, left=left, height=BAR_HEIGHT, color=color, edgecolor="white", linewidth=0.6,
                hatch=HATCH if hatched else None)
    totals = [sum(k["duration_us"] for k in run["kernels"]) for run in runs]
    for i, (run, total) in enumerate(zip(runs, totals)):
        ax.text(total, i, f"  Σ {total:.1f} µs over {run['kernel_count']} kernels\n"
                          f"  (layer {run['layer_us']:.1f} µs)",
                va="center", ha="left", fontsize=8, color=INK)
    ax.set_yticks(range(len(variants)), variants)
    ax.set(ylim=(len(variants) - 0.05, -0.95), xlim=(0.0, max(totals) * 1.2),
           xlabel="sum of kernel durations (µs), kernels stacked in launch order")
    ax.grid(axis="y", visible=False)
    fig.suptitle("Kernel time of one decoder layer on one TP rank, by kernel (sum of durations: the layer time adds "
                 f"launch gaps and subtracts stream overlap)\n{_conditions(doc)}", x=0.01, ha="left")
    handles = [Patch(facecolor=c, edgecolor="white", hatch=HATCH if kind in COLLECTIVE_KINDS else None, label=kind)
               for kind, c in colors.items()]
    fig.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 8), title="kernel kind")
    _label_bars(ax, _freeze_layout(fig), [b[:5] for b in bars])
    return fig


def _lefts(kernels: Sequence[Mapping[str, Any]]) -> list[float]:
    """Left edges of the kernels' bars laid end to end from 0."""
    return [sum(k["duration_us"] for k in kernels[:i]) for i in range(len(kernels))]


# ============================================================================ one layer: roofline


def plot_roofline(layer_doc: Mapping[str, Any], out_dir: Path, stem: str, hw: HardwareProfile) -> list[Path]:
    """Log-log roofline: achieved F / t against F / S per kernel, under the HBM roof and the dense peaks."""
    points = roofline_points(layer_doc)
    if not any(points.values()):
        raise ValueError("plot_roofline: no kernel in layer_doc has both FLOPs and bytes; nothing to place")
    if str(layer_doc.get("hardware", hw.name)).lower() != hw.name.lower():
        raise ValueError(f"plot_roofline: layer_doc was priced on {layer_doc['hardware']} but hw is {hw.name}")
    return _render(lambda: _roofline_figure(layer_doc, points, hw), out_dir, stem)


def roofline_points(layer_doc: Mapping[str, Any]) -> dict[str, list[Point]]:
    """Per variant: (key, F / S in FLOP/B, F / t in FLOP/s, t in µs); kernels without FLOPs are skipped."""
    return {v: [(k["key"], k["flops"] / k["bytes"], k["flops"] / (k["duration_us"] * 1e-6), k["duration_us"])
                for k in layer_doc["variants"][v]["kernels"]
                if k["flops"] > 0 and k["bytes"] > 0 and k["duration_us"] > 0]
            for v in _variants(layer_doc)}


def _roofline_figure(doc: Mapping[str, Any], points: Mapping[str, list[Point]], hw: HardwareProfile) -> Figure:
    import numpy as np
    bf16, fp4 = hw.peak_flops("bf16"), hw.peak_flops("fp4")
    roofs = [("BF16", bf16)] + ([("FP4", fp4)] if fp4 != bf16 else [])  # Hopper runs MXFP4 as bf16
    every = [p for pts in points.values() for p in pts]
    x_lo, x_hi = min(p[1] for p in every) / 3, max(max(p[1] for p in every), max(fp4, bf16) / hw.hbm_bandwidth) * 6
    fig = _figure(9.0, 6.2)
    ax = fig.subplots()
    ax.set(xscale="log", yscale="log", xlim=(x_lo, x_hi), ylim=(min(p[2] for p in every) / 3, max(fp4, bf16) * 3),
           xlabel="arithmetic intensity F / S (FLOP per byte of HBM traffic)", ylabel="achieved F / t (FLOP/s)")
    xs = np.geomspace(x_lo, x_hi, 400)
    for (name, peak), style in zip(roofs, ("-", "--")):
        ax.plot(xs, np.minimum(hw.hbm_bandwidth * xs, peak), color=INK, linestyle=style, linewidth=1.3)
        below = name == "BF16" and len(roofs) > 1  # keep clear of the FP4 roof climbing past it
        ax.text(x_hi / 1.2, peak / 1.2 if below else peak * 1.2, f"{name} peak {peak / 1e15:.3g} PFLOP/s, ridge "
                f"{peak / hw.hbm_bandwidth:,.0f} FLOP/B", ha="right", va="top" if below else "bottom", fontsize=7.5)
    for v, pts in points.items():
        color, marker, _ = VARIANT_STYLE.get(v, (INK, "D", "-"))
        ax.scatter([p[1] for p in pts], [p[2] for p in pts], s=36, marker=marker, linewidth=1.1, zorder=3,
                   facecolor="none" if v == "standard" else color, edgecolor=color, label=f"{v} ({len(pts)} kernels)")
    ax.legend(loc="upper left", title="kernels with FLOPs (collectives without math omitted)")
    fig.suptitle(f"Roofline of one decoder layer's kernels on {hw.name}: achieved FLOP/s vs arithmetic intensity\n"
                 f"{_conditions(doc)}", x=0.01, ha="left")
    renderer = _freeze_layout(fig)
    _label_memory_roof(ax, hw, x_lo)
    _label_points(ax, renderer, points)
    return fig


def _label_points(ax: Axes, renderer: RendererBase, points: Mapping[str, list[Point]]) -> None:
    """Name the kernels that matter (>= 4 % of their variant's summed time), once per name and spot:
    beside the point, else nudged away with a leader, never over another name or marker."""
    from matplotlib.transforms import Bbox
    placed = [Bbox.from_bounds(x - 4, y - 4, 8, 8) for pts in points.values()
              for x, y in ax.transData.transform([(p[1], p[2]) for p in pts])]
    offsets = sorted(((side * reach, step * 9) for side in (1, -1) for reach in (7, 30) for step in range(-4, 5)),
                     key=lambda o: (math.hypot(*o), o[0] < 0))
    done: list[tuple[str, float, float]] = []
    for v, pts in points.items():
        total = sum(p[3] for p in pts)
        for key, x, y, t in sorted(pts, key=lambda p: -p[3]):
            twin = any(k == key and abs(math.log10(x / px)) < 0.1 and abs(math.log10(y / py)) < 0.1
                       for k, px, py in done)
            color = VARIANT_STYLE.get(v, (INK,))[0]
            if t >= 0.04 * total and not twin and _place_label(ax, renderer, (x, y), offsets, key, placed, color):
                done.append((key, x, y))


def _label_memory_roof(ax: Axes, hw: HardwareProfile, x_lo: float) -> None:
    """Write the bandwidth along the memory roof, rotated to its on-screen slope (known only after layout)."""
    x0, x1 = x_lo * 3, x_lo * 30
    (px0, py0), (px1, py1) = ax.transData.transform([(x0, hw.hbm_bandwidth * x0), (x1, hw.hbm_bandwidth * x1)])
    ax.text(x0, hw.hbm_bandwidth * x0 * 1.5, f"HBM roof {hw.hbm_bandwidth / 1e12:.1f} TB/s × intensity",
            rotation=math.degrees(math.atan2(py1 - py0, px1 - px0)), rotation_mode="anchor", ha="left",
            va="bottom", fontsize=7.5)


# ============================================================================ sweeps


def plot_step_vs_batch(rows: Sequence[Row], out_dir: Path, stem: str, x: str = "batch",
                       group: str | None = None) -> list[Path]:
    """Top: step time against `x` per variant (and group). Bottom: speedup standard / specialized per group.
    Log x when x spans more than 10x."""
    _check_rows(rows, [x, "variant", "step_ms"] + ([group] if group else []), x, group, True, "plot_step_vs_batch")
    return _render(lambda: _step_figure(rows, x, group), out_dir, stem)


def speedup_pairs(rows: Sequence[Row], x: str, group: str | None = None) -> dict[Hashable, list[tuple[Any, float]]]:
    """Per group value: [(x, standard step_ms / specialized step_ms)], pairing rows that differ only in variant."""
    by: dict[tuple[Hashable, Hashable], dict[str, float]] = {}
    for r in rows:
        by.setdefault((r.get(group) if group else None, r[x]), {})[r["variant"]] = float(r["step_ms"])
    out: dict[Hashable, list[tuple[Any, float]]] = {}
    for (g, xv), times in by.items():
        if "standard" in times and times.get("specialized", 0.0) > 0:
            out.setdefault(g, []).append((xv, times["standard"] / times["specialized"]))
    return {g: _sorted_by_x(pts) for g, pts in out.items()}


def _step_figure(rows: Sequence[Row], x: str, group: str | None) -> Figure:
    fig = _figure(8.5, 6.6)
    top, bottom = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [2.2, 1]})
    _lines(top, rows, x, "step_ms", group, by_variant=True)
    top.set(ylabel=AXIS_LABELS["step_ms"], ylim=(0, None))
    top.legend(loc="best", ncols=2 if len(_ordered(r.get(group) for r in rows)) > 3 else 1)
    groups = _ordered(r.get(group) if group else None for r in rows)
    _speedup_panel(bottom, speedup_pairs(rows, x, group), groups, group)
    for gi, g in enumerate(groups):  # the per-draw speedup interval, where the rows carry one
        _band(bottom, [r for r in rows if r["variant"] == "standard" and (not group or r[group] == g)], x, "speedup",
              GROUP_COLORS[gi % len(GROUP_COLORS)] if group else INK)
    bottom.set_xlabel(axis_label(x))
    _x_axis(bottom, [r[x] for r in rows])
    fig.suptitle(f"Decode step time vs {x} per variant, and the specialized path's speedup\n"
                 f"{_row_conditions(rows, (x, group))}", x=0.01, ha="left")
    return fig


def _speedup_panel(ax: Axes, pairs: Mapping[Hashable, list[tuple[Any, float]]], groups: list[Hashable],
                   group: str | None) -> None:
    ax.axhline(1.0, color="#888888", linewidth=0.8)
    ax.set_ylabel("speedup (×)\nstandard / specialized")
    if not pairs:
        ax.text(0.5, 0.5, "no standard/specialized pairs in the rows", transform=ax.transAxes, ha="center",
                va="center", color=GREY)
        return
    annotate = len(pairs) == 1 and sum(len(p) for p in pairs.values()) <= 12  # more would overlap
    for gi, g in enumerate(groups):
        color = GROUP_COLORS[gi % len(GROUP_COLORS)] if group else INK
        for xv, s in pairs.get(g, []) if annotate else []:
            ax.annotate(f"{s:.2f}×", (xv, s), xytext=(0, 5), textcoords="offset points", ha="center", fontsize=7,
                        color=color)
        if g in pairs:
            ax.plot(*zip(*pairs[g]), color=color, marker="o", markersize=4, label=_group_text(group, g))
    values = [s for p in pairs.values() for _, s in p]
    ax.set_ylim(min(0.9, min(values) * 0.95), max(values) * 1.15)
    if group:
        ax.legend(loc="best", ncols=min(len(pairs), 4))


def plot_metric(rows: Sequence[Row], out_dir: Path, stem: str, x: str, y: str, group: str | None = None,
                title: str = "", logx: bool = False) -> list[Path]:
    """One line of `y` against `x` per value of `group` (context-length or speculative-decoding sweeps).
    Rows of both variants (a step sweep) get a line per group and variant, the variant by line style."""
    by_variant = group != "variant" and len(_ordered(r.get("variant") for r in rows)) > 1
    _check_rows(rows, [x, y] + ([group] if group else []), x, group, by_variant, "plot_metric")
    return _render(lambda: _metric_figure(rows, x, y, group, title, logx, by_variant), out_dir, stem)


def _metric_figure(rows: Sequence[Row], x: str, y: str, group: str | None, title: str, logx: bool,
                   by_variant: bool) -> Figure:
    fig = _figure(8.5, 4.8)
    ax = fig.subplots()
    _lines(ax, rows, x, y, group, by_variant)
    ax.set(xlabel=axis_label(x), ylabel=axis_label(y))
    _x_axis(ax, [r[x] for r in rows], force_log=logx)
    if group or by_variant:
        ax.legend(loc="best")
    heading = title or f"{axis_label(y)[0].upper()}{axis_label(y)[1:]} vs {axis_label(x)}"
    fig.suptitle(f"{heading}\n{_row_conditions(rows, (x, group))}", x=0.01, ha="left")
    return fig


def _lines(ax: Axes, rows: Sequence[Row], x: str, y: str, group: str | None, by_variant: bool) -> None:
    """One line of y against x per group value (colour) and, if by_variant, per variant (line style)."""
    variants: list[str | None] = list(_ordered_variants(r["variant"] for r in rows)) if by_variant else [None]
    for gi, g in enumerate(_ordered(r.get(group) if group else None for r in rows)):
        for v in variants:
            pts = _sorted_by_x([(r[x], r[y]) for r in rows
                                if (not group or r[group] == g) and (v is None or r["variant"] == v)])
            name = str(v or g)  # the variant, if the line has one
            color, marker, line = VARIANT_STYLE.get(name, (GROUP_COLORS[gi % len(GROUP_COLORS)], "o", "-"))
            if group and group != "variant":
                color = GROUP_COLORS[gi % len(GROUP_COLORS)]
            label = ", ".join(t for t in (v, _group_text(group, g) if group else None) if t)
            if pts:
                ax.plot(*zip(*pts), color=color, marker=marker, linestyle=line, markersize=4.5, label=label or None)
                _band(ax, [r for r in rows if (not group or r[group] == g) and (v is None or r["variant"] == v)],
                      x, y, color)


def _band(ax: Axes, rows: Sequence[Row], x: str, y: str, color: str) -> None:
    """The rows' interval of y (columns y_low, y_high: docs/cost-model.md section 8) as a shaded band."""
    pts = _sorted_by_x([(r[x], (r[f"{y}_low"], r[f"{y}_high"])) for r in rows
                        if r.get(f"{y}_low") is not None and r.get(f"{y}_high") is not None])
    if pts:
        xs, ends = zip(*pts)
        ax.fill_between(xs, [e[0] for e in ends], [e[1] for e in ends], color=color, alpha=0.15, linewidth=0)


# ============================================================================ waterfall


def plot_waterfall(steps: Sequence[tuple[str, float]], out_dir: Path, stem: str, title: str, unit: str = "µs",
                   final_label: str = "specialized") -> list[Path]:
    """Start total, each fusion's change (negative = saving), and the end total: start + sum of changes."""
    bars = waterfall_bars(steps, final_label)
    return _render(lambda: _waterfall_figure(bars, title, unit), out_dir, stem)


def waterfall_bars(steps: Sequence[tuple[str, float]], final_label: str = "specialized") -> list[WaterfallBar]:
    """[(label, bottom, height, kind)]: the first step is a total, each later one a change from the running
    level, then a last total equal to start + sum(changes). Heights are >= 0; the kind carries the sign."""
    if not steps:
        raise ValueError("waterfall: steps is empty; give at least the starting total, e.g. [('standard', 128.4)]")
    bad = [label for label, value in steps if not math.isfinite(value)]
    if bad:
        raise ValueError(f"waterfall: non-finite value for {', '.join(map(repr, bad))}")
    (first, level), *changes = steps
    bars: list[WaterfallBar] = [(first, 0.0, float(level), "total")]
    for label, change in changes:
        bars.append((label, min(level, level + change), abs(change), "saving" if change < 0 else "cost"))
        level += change
    return bars + [(final_label, 0.0, float(level), "total")]


def _waterfall_figure(bars: list[WaterfallBar], title: str, unit: str) -> Figure:
    from matplotlib.patches import Patch
    fig = _figure(max(6.0, 1.6 + 0.75 * len(bars)), 5.0)
    ax = fig.subplots()
    start, final = bars[0][2], bars[-1][2]
    digits = 1 if max(b[2] for b in bars) >= 100 else 2 if max(b[2] for b in bars) >= 1 else 3
    for i, (label, bottom, height, kind) in enumerate(bars):
        ax.bar(i, height, bottom=bottom, width=0.7, color=WATERFALL_COLORS[kind], edgecolor="white", linewidth=0.6)
        text = f"{height:.{digits}f}"
        if kind != "total":
            text = "≈0" if float(text) == 0 else ("−" if kind == "saving" else "+") + text
        if i == len(bars) - 1 and start:
            text += f"\n({(final / start - 1) * 100:+.1f} %)".replace("-", "−")
        ax.annotate(text, (i, bottom + height), xytext=(0, 3), textcoords="offset points", ha="center",
                    va="bottom", fontsize=8, color=INK)
        if i < len(bars) - 1:  # a dotted step from this bar's end level to the next bar
            level = height if kind == "total" else (bottom if kind == "saving" else bottom + height)
            ax.plot([i + 0.35, i + 0.65], [level, level], color="#777777", linewidth=0.8, linestyle=":")
    slanted = len(bars) > 4
    ax.set_xticks(range(len(bars)), [b[0] for b in bars], rotation=30 if slanted else 0,
                  ha="right" if slanted else "center")
    ax.set(ylabel=f"time ({unit})", ylim=(0, max(b[1] + b[2] for b in bars) * 1.15))
    ax.grid(axis="x", visible=False)
    ax.set_title(title.replace("->", "→"), fontsize=10)
    ax.legend(handles=[Patch(color=c, label=k) for k, c in WATERFALL_COLORS.items()], loc="upper right", ncols=3)
    return fig


# ============================================================================ input and text


def axis_label(key: str) -> str:
    """A readable axis label with its unit: "step_ms" -> "decode step time (ms)", "foo_us" -> "foo (µs)"."""
    if key in AXIS_LABELS:
        return AXIS_LABELS[key]
    suffix, unit = next(((s, u) for s, u in UNIT_SUFFIXES if key.endswith(s)), ("", ""))
    return f"{key[: len(key) - len(suffix)].replace('_', ' ')}" + (f" ({unit})" if unit else "")


def _variants(doc: Mapping[str, Any]) -> list[str]:
    runs = doc.get("variants") if isinstance(doc, Mapping) else None
    if not runs or not all(isinstance(r, Mapping) and r.get("kernels") for r in runs.values()):
        raise ValueError("layer_doc has no variants with kernels; build it with summary.layer_report(...)")
    return _ordered_variants(runs)


def _ordered_variants(names: Any) -> list[str]:
    seen = _ordered(names)
    return [v for v in VARIANTS if v in seen] + [v for v in seen if v not in VARIANTS]


def _streams(doc: Mapping[str, Any], variants: list[str]) -> list[str]:
    found = _ordered(k["stream"] for v in variants for k in doc["variants"][v]["kernels"])
    return sorted(found, key=lambda s: (s != "main", found.index(s)))


def _ordered(items: Any) -> list[Any]:
    return list(dict.fromkeys(items))


def _conditions(doc: Mapping[str, Any]) -> str:
    """One line of conditions: model, layer, hardware, TP, tokens, context, fusions."""
    index = f" (#{doc['layer_index']})" if "layer_index" in doc else ""
    parts = [f"{doc.get('model', '?')} {doc.get('layer', '')} layer{index}", str(doc.get("hardware", "?")),
             f"TP{doc.get('tp', '?')}"]
    if "batch" in doc:
        per_seq, tokens = doc.get("tokens_per_seq", 1), doc.get("tokens", "?")
        parts.append(f"batch {doc['batch']} × {per_seq} tokens/seq (M = {tokens})")
    if "context" in doc:
        parts.append(f"context {doc['context']}")
    if "fusions" in doc and "specialized" in doc.get("variants", {}):
        parts.append(_fusion_note(set(doc["fusions"])))
    return ", ".join(parts)


def _fusion_note(on: set[str]) -> str:
    from simulator.plans.specialized import FUSIONS
    off, extra = sorted(set(FUSIONS) - on), sorted(on - set(FUSIONS))
    notes = [f"{what}: {', '.join(names)}" for what, names in (("fusions off", off), ("what-ifs on", extra)) if names]
    return "; ".join(notes) or "all published fusions"


def _row_conditions(rows: Sequence[Row], skip: tuple[str | None, ...]) -> str:
    """The condition columns that hold one value across all rows, e.g. "hardware gb300, tp 16, context 512"."""
    single = {k: _ordered(r.get(k) for r in rows) for k in CONDITION_KEYS if k not in skip}
    if single.get("draft_tokens") == [0]:  # no drafting: the drafter and acceptance length say nothing
        single.pop("drafter", None), single.pop("acceptance_length", None)
    parts = [f"{k} {v[0]}" for k, v in single.items() if len(v) == 1 and v[0] not in (None, "none")]
    return textwrap.fill(", ".join(parts) or "conditions as given in the rows", width=110)


def _group_text(group: str | None, value: Any) -> str | None:
    """How a group value reads in a legend: "TP8", "gb300", "context 512"; None without a group."""
    if group is None:
        return None
    if group == "tp":
        return f"TP{value}"
    return str(value) if group in ("variant", "hardware", "model") else f"{group} {value}"


def _check_rows(rows: Sequence[Row], keys: list[str], x: str, group: str | None, by_variant: bool, where: str) -> None:
    """Rows exist, carry `keys`, and each (x, group[, variant]) names one row: else another column varies
    and the lines would zigzag, so say which."""
    if not rows:
        raise ValueError(f"{where}: rows is empty; nothing to plot")
    for i, r in enumerate(rows):
        if missing := [k for k in keys if k not in r]:
            raise ValueError(f"{where}: row {i} lacks {', '.join(map(repr, missing))} (it has {', '.join(r)})")
    names = [(r[x], r.get(group) if group else None, r.get("variant") if by_variant else None) for r in rows]
    if len(set(names)) < len(names):
        varying = [k for k in CONDITION_KEYS + ("variant",) if k not in (x, group)
                   and not (by_variant and k == "variant") and len(_ordered(r.get(k) for r in rows)) > 1]
        raise ValueError(f"{where}: several rows share one {x}" + (f" and {group}" if group else "")
                         + f"; they also vary in {varying or 'other columns'}: filter the rows or pass group=")


def _sorted_by_x(points: list[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
    numeric = all(isinstance(p[0], (int, float)) for p in points)
    return sorted(points, key=lambda p: p[0]) if numeric else points


def _x_axis(ax: Axes, values: list[Any], force_log: bool = False) -> None:
    """Log x when asked or when x spans more than 10x; ticks at the swept values when there are few."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator
    numbers = sorted({float(v) for v in values if isinstance(v, (int, float))})
    if len(numbers) < len(set(map(str, values))):
        return  # categorical x: matplotlib's own handling
    if numbers and numbers[0] > 0 and (force_log or numbers[-1] / numbers[0] > 10):
        ax.set_xscale("log")
    if 1 < len(numbers) <= 12:
        ax.xaxis.set_major_locator(FixedLocator(numbers))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_locator(NullLocator())

