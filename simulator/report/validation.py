"""`moe-sim validate` output: the error table per family and predicted-vs-measured plots (log-log)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from simulator.report.plot_kit import _figure, _render

if TYPE_CHECKING:
    from matplotlib.figure import Figure

COLOURS = {"ceiling": "#555555", "gemm": "#1f77b4", "moe": "#d62728", "small": "#ff7f0e", "kda": "#2ca02c",
           "mla": "#9467bd", "collective": "#8c564b"}


def _cell(s: Mapping[str, Any]) -> str:
    if not s or not s.get("n"):
        return "-"
    return f"{s['median_abs_pct_error']:.1f} / {s['worst_abs_pct_error']:.1f}  (n={s['n']})"


def print_validation(doc: Mapping[str, Any], wide: bool = False) -> None:
    from simulator.report.layout import console, show
    con = console(wide)
    con.print(f"{doc['measured_points']} measured points on {doc['hardware']} ({doc['measurements']})")
    con.print(f"metric: {doc['metric']}")
    rows = [[fam, _cell(s["preregistered"]), _cell(s), _cell(s["model_all_points"]), _cell(s["refit"])]
            for fam, s in doc["by_family"].items()]
    rows.append(["all", _cell(doc["preregistered"]),
                 _cell({"n": doc["held_back_points"], "median_abs_pct_error": doc["median_abs_pct_error"],
                        "worst_abs_pct_error": doc["worst_abs_pct_error"]}),
                 _cell(doc["model_all_points"]), _cell(doc["refit"])])
    show(con, ("family", "pre-registered", f"model ({doc['kernel_set']}), held back", "model, all points",
               "refit, held back"), rows, title="median / worst % error (n points)")
    if doc["profile_is_the_fit"]:
        con.print(f"the {doc['hardware']} profile's kernel set {doc['kernel_set']!r} is the fit of these CSVs: "
                  "model and refit are one law")
    else:
        con.print(f"the {doc['hardware']} profile's kernel set {doc['kernel_set']!r} is not the fit of these CSVs: "
                  "`moe-sim validate --fit` writes it")
    if doc.get("written"):
        con.print(f"wrote kernel set {doc['written']['set']!r} to {doc['written']['path']}")
    for fam, s in doc.get("probes", {}).items():
        con.print(f"{fam} probe (shapes off the grid, never fitted; the grid's laws): median / worst % {_cell(s)}")
    rows = [[g if i == 0 else "", str(f["n"]) if i == 0 else "", k, _num(v)]
            for g, f in doc["fits"].items() for i, (k, v) in enumerate((k, v) for k, v in f.items() if k != "n")]
    show(con, ("group", "points fitted", "constant of the family law", "value (µs, GB/s, TFLOP/s)"), rows,
         title="the family laws, refit on the fitted half of each grid")
    if "interval_coverage" in doc:
        _print_coverage(con, doc["interval_coverage"])
    from simulator.report.tables import print_plots
    print_plots(con, doc)


def _print_coverage(con: Any, cov: Mapping[str, Any]) -> None:
    """How often the interval built from the fitted half covers a held-back point (docs/cost-model.md section 8)."""
    from simulator.report.layout import show
    rows = [[fam, str(c["n"]), f"{c['covered']} ({100 * c['coverage']:.0f} %)",
             f"[{c['interval_pct'][0]:+.1f}, {c['interval_pct'][1]:+.1f}]"] for fam, c in cov["by_family"].items()]
    rows.append(["all", str(cov["n"]), f"{100 * cov['coverage']:.1f} %", ""])
    show(con, ("family", "held-back points", f"inside the {cov['level']:.0%} interval", "interval (% of the law)"),
         rows, title=f"interval coverage: {cov['method']}")


def _num(v: Any) -> str:
    return "-" if v is None else f"{v:,.2f}"


def plot_validation(doc: Mapping[str, Any], out_dir: str | Path) -> list[Path]:
    """predicted_vs_measured.{png,svg}: one panel per family, the model now and the refit law, log-log."""
    return _render(lambda: _figure_validation(doc), Path(out_dir), "predicted_vs_measured")


def _figure_validation(doc: Mapping[str, Any]) -> Figure:
    from matplotlib.ticker import FuncFormatter, NullFormatter
    fams = list(doc["by_family"])
    cols = min(4, len(fams))
    rows = -(-len(fams) // cols)
    fig = _figure(3.1 * cols, 3.0 * rows + 0.4)
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax, fam in zip(axes.flat, fams):
        pts = [p for p in doc["points"] if p["family"] == fam]
        meas = [p["measured_us"] for p in pts]
        ax.scatter(meas, [p["model_us"] for p in pts], s=9, marker="x", color="#AAAAAA", label="model")
        held = [p for p in pts if p["held_back"]]
        ax.scatter([p["measured_us"] for p in held], [p["refit_us"] for p in held], s=10, color=COLOURS.get(fam, "k"),
                   label="refit, held back")
        lo, hi = min(meas + [p["model_us"] for p in pts]) * 0.7, max(meas + [p["model_us"] for p in pts]) * 1.4
        ax.plot([lo, hi], [lo, hi], color="black", linewidth=0.7)
        ax.fill_between([lo, hi], [lo * 0.9, hi * 0.9], [lo * 1.1, hi * 1.1], color="#EEEEEE", zorder=0)
        ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), xlabel="measured µs", ylabel="predicted µs")
        s = doc["by_family"][fam]
        ax.set_title(f"{fam}\nheld back: median {s['median_abs_pct_error']:.1f} %, "
                     f"worst {s['worst_abs_pct_error']:.1f} %")
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_minor_formatter(NullFormatter())
            axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.legend(loc="upper left")
    for ax in list(axes.flat)[len(fams):]:
        ax.set_visible(False)
    fig.suptitle(f"Cost model vs {doc['measured_points']} kernels measured on {doc['hardware']} "
                 "(grey band: ±10 %; per launch, CUDA-graph replay)")
    return fig


def print_calibration(doc: Mapping[str, Any], wide: bool = False) -> None:
    """`moe-sim calibrate`: the constants, the fitted figures and the unfitted ones."""
    from simulator.report.layout import console, show
    con = console(wide)
    con.print(f"{doc['hardware']}: constants fitted to the published figures ({doc['metric']}; "
              f"{doc['degrees_of_freedom']} degrees of freedom left)")
    show(con, ("constant", "now", "refitted", "range", "on an edge"),
         [[c["name"], f"{c['now']:g}", f"{c['fitted']:g}", f"[{c['range'][0]:g}, {c['range'][1]:g}]",
           c["at_edge"] or "-"] for c in doc["constants"]])
    for title, rows in (("fitted figures", doc["fitted_figures"]), ("not used in the fit", doc["unfitted_figures"])):
        show(con, (title, "metric", "published", "model now", "error now %", "model refitted", "error refitted %"),
             [[f"{r['figure']} (TP{r['tp']}, {r['batch']} x {r['tokens_per_seq']})", r["metric"],
               f"{r['published']:g}", f"{r['model_now']:.2f}", f"{r['error_now_pct']:+.1f}",
               f"{r['model_fitted']:.2f}", f"{r['error_fitted_pct']:+.1f}"] for r in rows], key=2)
    con.print(f"loss now {doc['loss_now']:.2e}, refitted {doc['loss_fitted']:.2e} "
              f"({doc['evaluations']} model evaluations)")
