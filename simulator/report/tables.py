"""Human-readable tables (rich) for the CLI. Every number is printed with its metric and conditions."""

from __future__ import annotations

import os
from typing import Any

from rich.console import Console
from rich.table import Column, Table

from simulator.cost.memory import shortfall


def _console() -> Console:
    console = Console(highlight=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:  # pipes and CI logs: wide enough for every table
        console = Console(highlight=False, width=140)
    return console


def _name_column(header: str, names: list[str]) -> Column:
    """A column of names a user types (fusions): always whole, on one line, whatever the width."""
    return Column(header, no_wrap=True, min_width=max(map(len, names), default=len(header)))


def _wrapped(header: str) -> Column:
    """A column of long names (kernels): wrapped onto more lines at narrow widths, never cut."""
    return Column(header, overflow="fold", min_width=12)


def print_check(doc: dict[str, Any]) -> None:
    con = _console()
    con.print(f"model {doc['model']}  TP{doc['tp']}  batch {doc['batch']} x {doc['tokens_per_seq']} token(s)  "
              f"context {doc['context']}  precision {doc['precision']}")
    con.print(f"metric: {doc['metric']}")
    table = Table("layer", "variant", "kernels", "tensor", "max abs err", "rel RMS err", "tolerance", "ok")
    for layer in doc["layers"]:
        for vname, v in layer["variants"].items():
            for i, t in enumerate(v["tensors"]):
                first = i == 0
                table.add_row(f"{layer['layer']} (#{layer['layer_index']})" if first else "", vname if first else "",
                              str(v["kernel_count"]) if first else "", t["name"], f"{t['max_abs_error']:.2e}",
                              f"{t['rel_rms_error']:.2e}", f"{t['tolerance']:.0e}", "yes" if t["passed"] else "NO")
            flips = v["flips"]
            if flips:
                worst = max(f["margin"] for f in flips)
                table.add_row("", "", "", "routing flips", f"{len(flips)} token(s)", f"max margin {worst:.1e}",
                              f"< {v['flip_bound']:.0e}", "yes" if worst < v["flip_bound"] else "NO")
    con.print(table)
    con.print("PASSED" if doc["passed"] else "FAILED: a variant is outside its tolerance")


def _conditions(doc: dict[str, Any]) -> str:
    parts = [f"model {doc['model']}", f"{doc['hardware']}", f"TP{doc['tp']}", f"batch {doc['batch']}"]
    if "tokens_per_seq" in doc:
        parts.append(f"{doc['tokens_per_seq']} token(s)/seq (M = {doc['tokens']})")
    if doc.get("draft_tokens"):
        parts.append(f"{doc['draft_tokens']} draft tokens, acceptance length {doc['acceptance_length']:g} ({doc['drafter']})")
    parts.append(f"context {doc['context']}")
    return "  ".join(parts)


def _memory_line(con: Console, doc: dict[str, Any]) -> None:
    """Memory per GPU by part; a warning when it exceeds HBM (the cost shown is still the TP one)."""
    mem = doc["memory_gb"]
    if mem["fits"]:
        con.print(f"memory per GPU: {mem['total']:.1f} GB = weights {mem['weights']:.1f} + MLA cache "
                  f"{mem['mla_cache']:.2f} + KDA state {mem['kda_state']:.2f} + activations {mem['activations']:.2f}, "
                  f"of {mem['capacity']:.0f} GB HBM")
    else:
        con.print(f"warning: {doc['model']} at TP{doc['tp']} on {doc['hardware']} {shortfall(mem)}: this layout needs "
                  "pipeline parallelism or a smaller batch or context (the per-layer cost shown is the TP one)")


def print_layer(doc: dict[str, Any]) -> None:
    con = _console()
    _memory_line(con, doc)
    con.print(f"{doc['layer'].upper()} layer (#{doc['layer_index']})  " + _conditions(doc))
    con.print(f"metric: {doc['metric']}")
    for name, v in doc["variants"].items():
        table = Table("#", _wrapped("kernel"), "stream", "start", "dur", "MB", "bound", "GB/s", "%pk", title=
                      f"{name}: {v['kernel_count']} kernels, {v['layer_us']:.1f} us (speed-of-light floor {v['floor_us']:.1f} us); "
                      "start, dur in us, %pk = % of peak")
        for i, k in enumerate(v["kernels"], 1):
            table.add_row(str(i), k["name"], k["stream"], f"{k['start_us']:.2f}", f"{k['duration_us']:.2f}",
                          f"{k['bytes'] / 1e6:.2f}", k["bound"], f"{k['achieved_gbps']:.0f}", f"{100 * k['fraction_of_peak']:.0f}")
        con.print(table)
    summary = Table("variant", "kernels", "layer us", *_interval_header(doc), "floor us", "HBM MB", title="side by side")
    for name, v in doc["variants"].items():
        summary.add_row(name, str(v["kernel_count"]), f"{v['layer_us']:.1f}", *_interval_cell(v, "layer_us_interval", ".1f"),
                        f"{v['floor_us']:.1f}", f"{v['hbm_bytes'] / 1e6:.1f}")
    con.print(summary)
    if "speedup" in doc:
        con.print(f"speedup (standard / specialized layer time): {doc['speedup']:.2f}x" + _speedup_interval(doc))
    _interval_note(con, doc)


def _interval_header(doc: dict[str, Any]) -> list[str]:
    return [f"{doc['interval']['level']:.0%} interval"] if "interval" in doc else []


def _interval_cell(row: dict[str, Any], key: str, fmt: str) -> list[str]:
    return [f"[{format(row[key][0], fmt)}, {format(row[key][1], fmt)}]"] if key in row else []


def _speedup_interval(doc: dict[str, Any]) -> str:
    if "speedup_interval" not in doc:
        return ""
    lo, hi = doc["speedup_interval"]
    return f", {doc['interval']['level']:.0%} interval [{lo:.2f}, {hi:.2f}]x (ratio taken draw by draw)"


def _interval_note(con: Console, doc: dict[str, Any]) -> None:
    """What the interval is: draws, seed, and what they were conditioned on."""
    if "interval" not in doc:
        return
    i = doc["interval"]
    n = i["parameter_counts"]
    cond = (f"; conditioned on the {len(i['conditioned_on_published']['figures'])} published figures the constants "
            f"were fitted to ({i['effective_draws']:.0f} effective draws)") if i["conditioned_on_published"] else ""
    con.print(f"interval: {i['level']:.0%} of {i['draws']} seeded draws (seed {i['seed']}) of {n['constant']} ranged "
              f"constants, {n['family']} kernel-family factors and {n['structure']} layer-structure factors{cond} "
              "(docs/cost-model.md section 8)")


def print_step(doc: dict[str, Any]) -> None:
    con = _console()
    _memory_line(con, doc)
    con.print("decode step  " + _conditions(doc))
    con.print(f"metric: {doc['metric']}")
    keys = list(next(iter(doc["variants"].values()))["breakdown_ms"])
    spans = [f"step ms {h}" for h in _interval_header(doc)] + [f"tok/s {h}" for h in _interval_header(doc)]
    table = Table("variant", "step ms", "tok/s (aggregate)", "tok/s per user", *spans, *[f"{k} ms" for k in keys], "kernels")
    for name, v in doc["variants"].items():
        table.add_row(name, f"{v['step_ms']:.3f}", f"{v['tokens_per_s']:.1f}", f"{v['tokens_per_s_per_user']:.1f}",
                      *_interval_cell(v, "step_ms_interval", ".3f"), *_interval_cell(v, "tokens_per_s_interval", ".1f"),
                      *[f"{v['breakdown_ms'][k]:.3f}" for k in keys], str(v["kernels_per_step"]))
    con.print(table)
    if "speedup" in doc:
        con.print(f"speedup (standard / specialized step time): {doc['speedup']:.2f}x" + _speedup_interval(doc))
    _interval_note(con, doc)
    if "sensitivity" in doc:
        _print_sensitivity(con, doc["sensitivity"])
    if "routing_bracket" in doc:
        _print_routing_bracket(con, doc["routing_bracket"])


def _print_sensitivity(con: Console, sens: dict[str, Any]) -> None:
    """Parameters by their share of the step time's variance, per variant (cost/sensitivity.py)."""
    con.print(f"sensitivity: {sens['metric']}")
    for v, panel in sens["variants"].items():
        table = Table("parameter", "share", "step ms at its 5th pct", "at its 95th pct",
                      title=f"{v}: {panel['central_ms']:.3f} ms, interval [{panel['interval_ms'][0]:.3f}, "
                            f"{panel['interval_ms'][1]:.3f}] ms; shares sum to {panel['sum_of_shares']:.2f}")
        for r in panel["ranking"]:
            table.add_row(r["parameter"], f"{100 * r['share']:.1f} %", f"{r['low_ms']:.3f}", f"{r['high_ms']:.3f}")
        con.print(table)


def _print_routing_bracket(con: Console, bracket: dict[str, Any]) -> None:
    """Step time and tokens/s at both ends of the routing bracket (uniform vs concentrated routing)."""
    table = Table("routing", "expert skew s", "draft correlation", "variant", "step ms", "tok/s (aggregate)")
    for name, end in bracket.items():
        for v, row in end["variants"].items():
            table.add_row(name, f"{end['expert_skew']:g}", f"{end['draft_correlation']:g}", v,
                          f"{row['step_ms']:.3f}", f"{row['tokens_per_s']:.1f}")
    con.print("routing bracket: the experts a step touches depend on how tokens route; uniform independent "
              "routing touches the most")
    con.print(table)


def print_ablation(doc: dict[str, Any]) -> None:
    con = _console()
    con.print(f"fusion ablation  model {doc['model']}  {doc['hardware']}  TP{doc['tp']}  batch {doc['batch']} x "
              f"{doc['tokens_per_seq']} token(s)/seq  context {doc['context']}  layer {doc['layer']}")
    con.print(f"metric: {doc['metric']}")
    std, spec = doc["standard"], doc["specialized"]
    con.print(f"standard {std['kernel_count']} kernels {std['layer_us']:.1f} us / step {std['step_ms']:.3f} ms  ->  "
              f"specialized {spec['kernel_count']} kernels {spec['layer_us']:.1f} us / step {spec['step_ms']:.3f} ms")
    names = [r["fusion"] for r in doc["fusions"]]
    for level, unit, digits in (("layer", "us", 2), ("step", "ms", 3)):  # two tables: each fits 80 columns
        table = Table(_name_column("fusion (--disable-fusion)", names), "kernels saved", "add one", "remove one",
                      "waterfall", title=f"{level} time saved ({unit})")
        for r in doc["fusions"]:
            table.add_row(r["fusion"], str(r["kernels_saved"]), *[f"{r[f'{view}_{level}_{unit}']:.{digits}f}"
                                                                  for view in ("add_one", "remove_one", "waterfall")])
        con.print(table)
    con.print("add one: the fusion alone added to standard; remove one: it alone removed from specialized; "
              "waterfall: added in turn, adding up to standard - specialized. Positive = time saved.")


RUN_METRICS = {
    "step": ("step_ms", "tokens_per_s", "tokens_per_s_per_user", "speedup", "memory_total_gb"),
    "layer": ("kernel_count", "layer_us", "floor_us", "hbm_mb", "speedup"),
    "ablation": ("fusion", "kernels_saved", "add_one_layer_us", "remove_one_layer_us", "waterfall_layer_us",
                 "waterfall_step_ms"),
}


def print_run(result: dict[str, Any], max_rows: int = 60) -> None:
    con = _console()
    s = result["summary"]
    con.print(f"scenario {s['scenario']} ({s['kind']}): {s['question']}")
    base = ", ".join(f"{k}={v}" for k, v in s["base"].items() if k not in s["sweep"] and v is not None)
    con.print(f"conditions: {base}")
    axes = [a for a in s["sweep"] if a != "variant"] + ["variant"]
    table = Table(*axes, *RUN_METRICS[s["kind"]], "status")
    for row in result["rows"][:max_rows]:
        cells = [row.get(a) for a in axes] + [row.get(m) for m in RUN_METRICS[s["kind"]]]
        table.add_row(*[_fmt(c) for c in cells], "ok" if row["status"] == "ok" else "skipped (reason below)")
    con.print(table)
    for reason in s["skipped"]:
        con.print(f"skipped: {reason}")
    if len(result["rows"]) > max_rows:
        con.print(f"... {len(result['rows']) - max_rows} more rows in points.csv")
    con.print(f"{s['rows_ok']} of {s['rows']} rows ok over {s['points']} grid points"
              + (f"; written: {', '.join(s['files'])}" if s.get("files") else ""))


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else str(value)
