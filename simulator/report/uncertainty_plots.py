"""The tornado chart of `moe-sim step --sensitivity --plot DIR`: which parameter widens the step interval.

One panel per variant; one bar per uncertain parameter, from the step time expected with that parameter at its 5th
percentile to the time at its 95th (a straight-line fit over the interval's draws, cost/sensitivity.py), sorted by
share of variance, the largest on top. A vertical line marks the central step time; a shaded band the full 90 %
interval of the draws, so a reader sees both what each parameter does alone and what they do together.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:
    from matplotlib.figure import Figure

from simulator.report.plot_kit import GREY, _figure, _render

TOP = 12  # parameters shown per panel (the rest swing less)


def plot_tornado(doc: Mapping[str, Any], out_dir: str | Path) -> list[Path]:
    """`<out_dir>/step-sensitivity.png/.svg` from a step report carrying `sensitivity`."""
    if "sensitivity" not in doc:
        raise ValueError("plot_tornado needs a step report with a 'sensitivity' entry (--sensitivity).")
    return _render(lambda: _tornado_figure(doc), Path(out_dir), "step-sensitivity")


def _tornado_figure(doc: Mapping[str, Any]) -> Figure:
    panels = doc["sensitivity"]["variants"]
    rows = max(min(len(p["ranking"]), TOP) for p in panels.values())
    fig = _figure(8.5, 1.2 + 0.32 * rows * len(panels))
    axes = fig.subplots(len(panels), 1, squeeze=False)[:, 0]
    for ax, (variant, panel) in zip(axes, panels.items()):
        ranking = panel["ranking"][:TOP][::-1]
        central = panel["central_ms"]
        lo, hi = panel["interval_ms"]
        ax.axvspan(lo, hi, color="#0072B2", alpha=0.10, linewidth=0, label=f"{doc['interval']['level']:.0%} interval")
        for i, r in enumerate(ranking):
            left, right = sorted((r["low_ms"], r["high_ms"]))
            color = "#D55E00" if r["high_ms"] >= r["low_ms"] else "#009E73"
            ax.barh(i, right - left, left=left, height=0.6, color=color)
            ax.text(right, i, f"  {100 * r['share']:.0f} %", va="center", fontsize=7, color=GREY)
        ax.axvline(central, color="#222222", linewidth=0.9, label=f"central {central:.3f} ms")
        ax.set_yticks(range(len(ranking)), [r["parameter"] for r in ranking], fontsize=7.5)
        ax.set_title(f"{variant}: step time at each parameter's 5th / 95th percentile (share of variance)",
                     fontsize=9, loc="left")
        ax.set_xlabel("step time (ms)")
        ax.legend(loc="lower right", fontsize=7)
    fig.suptitle(f"What widens the step interval: {doc['model']} on {doc['hardware']}, TP{doc['tp']}, "
                 f"batch {doc['batch']}, context {doc['context']}", x=0.01, ha="left")
    return fig
