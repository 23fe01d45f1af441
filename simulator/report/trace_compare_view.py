"""How `moe-sim compare-trace` shows its comparison: a table per kernel, and the measured layer drawn under
the model's with the layer-timeline picture of `plots.py` (a "measured" panel beneath the plan's)."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.table import Column, Table

from simulator.cost.timeline import Timeline
from simulator.report.tables import _console
from simulator.report.trace_reader import short


def _name_column(header: str, names: list[str]) -> Column:
    """A column of plan keys: always whole, on one line, whatever the width."""
    return Column(header, no_wrap=True, min_width=max(map(len, names), default=len(header)))


def _wrapped(header: str) -> Column:
    """A column of long kernel names: wrapped onto more lines at narrow widths, never cut."""
    return Column(header, overflow="fold", min_width=12)


def print_compare(doc: dict[str, Any]) -> None:
    """The comparison as a table per kernel and a few lines; every name from the trace is shown as text
    (escaped for rich's markup) and cut by `short_name`."""
    con = _console()
    con.print(escape(f"{doc['trace']} (engine {doc['engine']}) against the {doc['variant']} {doc['layer']} plan: "
                     f"{doc['model']} {doc['hardware']} TP{doc['tp']} batch {doc['batch']} x {doc['tokens_per_seq']} "
                     f"token(s)/seq, context {doc['context']}"))
    if "engine_detected" in doc:
        con.print(_detected(doc["engine_detected"]))
    numbers = [Column(h, no_wrap=True, justify="right") for h in ("model", "meas.", "err %", "gaps")]
    table = Table(_name_column("plan kernel", [k["plan"] for k in doc["kernels"]]), _wrapped("measured kernel"),
                  *numbers,
                  title=f"{doc['layers_found']} layer(s) found; medians over layers; us; gaps: model / measured")
    for k in doc["kernels"]:  # narrow enough for 80 columns: a long measured name wraps, no number is cut
        gaps = f"{_num(k['model_gap_us'], '.2f')} / {_num(k['measured_gap_us'], '.2f')}"
        table.add_row(k["plan"], escape(short_name(k["measured"])), f"{k['model_us']:.2f}", f"{k['measured_us']:.2f}",
                      _num(k["error_pct"], "+.1f"), gaps)
    con.print(table)
    span = doc["makespan_us"]
    con.print(f"matched {doc['matched']} kernels; median |error| {_num(doc['median_abs_pct_error'], '.1f')} %; "
              f"layer makespan measured {span['measured']:.1f} us vs model {span['model']:.1f} us "
              f"({_num(doc['makespan_error_pct'], '+.1f')} %)")
    cov = doc.get("step_coverage")
    if cov and cov.get("matched") is not None:
        missed = ", ".join(f"{escape(short_name(u['name']))} x{u['count']}" for u in cov["unmatched_measured"][:8])
        con.print(f"the trace's {cov['kernels']} kernels against the whole step's plan (every layer's own, the head): "
                  f"{cov['matched']} matched ({cov['matched_pct']:.1f} %)"
                  + (f"; unmatched: {missed}" if missed else ""))
    con.print(f"per launch (the idle gap before a kernel + its duration, where a profiler and the model split "
              f"them differently): median |error| {_num(doc['median_abs_launch_error_pct'], '.1f')} %")
    if "inside_family_interval" in doc:
        got = doc["inside_family_interval"]
        out = [f"{k['plan']} {k['launch_error_pct'] if k['launch_error_pct'] is not None else k['error_pct']:+.0f} % "
               f"({k['family']} [{k['interval_pct'][0]:+.0f}, {k['interval_pct'][1]:+.0f}])"
               for k in doc["kernels"] if k.get("inside_interval") is False]
        con.print(f"inside their family's {doc['interval_level']:.0%} interval (per launch): {got['inside']} of "
                  f"{got['checked']} kernels" + (f"; outside: {', '.join(out)}" if out else ""))
        if doc.get("kernel_set") == "datasheet":
            con.print(f"(no kernel of {doc['hardware']} is measured: these intervals are the spread of the laws' form "
                      "once their constants are measured, from the H200; they leave out this profile's constants' own "
                      "error)")
    if "model_streams" in doc:
        con.print(f"model streams: {doc['model_streams']}")
    con.print(f"unmatched plan kernels (the engine did not launch them): {', '.join(doc['unmatched_plan']) or 'none'}")
    extra = Counter(short_name(n) for n in doc["unmatched_measured"])
    con.print(escape("unmatched measured kernels (the plan lacks them; full names with --json): "
                     + (", ".join(f"{n}" + (f" x{c}" if c > 1 else "") for n, c in extra.items()) or "none")))
    step = doc.get("step") or {}
    if step.get("left_out_layer_shapes"):
        con.print(escape(f"left out {step['left_out_layer_shapes']} layer shape(s) that are not decode layers: "
                         f"{step['left_out_because'][0]}"))
    for path in doc.get("plots", []):
        con.print(escape(f"wrote {path}"))


def _detected(d: dict[str, Any]) -> str:
    """One line: the engine chosen from the kernel names, how well it fits, and the runner-up."""
    first, rest = d["ranking"][0], d["ranking"][1:]
    line = (f"engine {first['engine']} detected from the kernel names: its layer matches {first['matched']} of "
            f"{first['plan_kernels']} plan kernels (fit {first['fit']:.2f})")
    if rest:
        line += f"; next {rest[0]['engine']} (fit {rest[0]['fit']:.2f}); --engine to choose another"
    return escape(line)


_DETAIL = re.compile(r"\b(\w+(?:_kernel(?:_cuda)?|Functor(?:_\w+)?))\b")
_GENERIC = ("gpu_kernel_impl", "BinaryFunctor")


def short_name(name: str, width: int = 60) -> str:
    """A C++ kernel signature cut to its kernel and the op it instantiates:
    'void at::native::elementwise_kernel<128, 4, ...silu_kernel...>(...)' -> 'elementwise_kernel<silu_kernel>'."""
    core = short(name, 20 * width).removeprefix("void ").replace("(anonymous namespace)::", "")
    base = re.split(r"[<(]", core, maxsplit=1)[0].split("::")[-1]
    detail = [w for w in _DETAIL.findall(core) if w != base and not w.startswith(_GENERIC)]
    text = f"{base}<{detail[0]}>" if detail and base != core else base
    return text if len(text) <= width else text[:width - 3] + "..."


def _num(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def plot_compare(doc: dict[str, Any], timeline: Timeline, out: str | Path) -> list[Path]:
    """The model's layer timeline above the measured one, on one µs axis (PNG + SVG, atomic)."""
    from simulator.report.plots import plot_timeline
    shift = min(s.start_us for s in timeline.spans)  # the model's first launch gap: put both on one axis
    model = [{"key": s.key, "stream": s.stream, "kind": s.kind, "bound": s.bound, "start_us": s.start_us,
              "duration_us": s.duration_us} for s in timeline.spans]
    by_key = {s.key: s for s in timeline.spans}
    measured = [{"key": k["plan"] or short_name(k["name"], 24), "stream": k["stream"],
                 "start_us": k["start_us"] + shift,
                 "duration_us": k["duration_us"], "kind": by_key[k["plan"]].kind if k["plan"] else "unmatched",
                 "bound": by_key[k["plan"]].bound if k["plan"] else "unmatched"} for k in doc["measured_layer"]]
    end = shift + doc["makespan_us"]["measured"]
    layer_doc = {key: doc[key] for key in ("model", "layer", "hardware", "tp", "batch", "tokens_per_seq", "context")}
    layer_doc["tokens"] = doc["batch"] * doc["tokens_per_seq"]
    layer_doc["variants"] = {
        f"model ({doc['variant']})": {"kernels": model, "kernel_count": len(model), "layer_us": timeline.layer_us,
                                      "floor_us": timeline.floor_us},
        f"measured ({doc['engine']})": {"kernels": measured, "kernel_count": len(measured), "layer_us": end,
                                        "floor_us": timeline.floor_us}}
    return plot_timeline(layer_doc, Path(out), "compare-trace-timeline")
