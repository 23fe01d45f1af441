"""Human-readable tables (rich) for the CLI. Every number is printed with its metric and conditions."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from simulator import attention
from simulator.report.layout import console, show


def _console(wide: bool = False) -> Console:
    return console(wide)


def print_check(doc: dict[str, Any], wide: bool = False) -> None:
    con = _console(wide)
    con.print(f"model {doc['model']}  TP{doc['tp']}  batch {doc['batch']} x {doc['tokens_per_seq']} token(s)  "
              f"context {doc['context']}  precision {doc['precision']}")
    con.print(f"metric: {doc['metric']}")
    for layer in doc["layers"]:
        rows, flips = [], []
        for vname, v in layer["variants"].items():
            rows += [[vname if i == 0 else "", str(v["kernel_count"]) if i == 0 else "", t["name"],
                      f"{t['max_abs_error']:.2e}", f"{t['rel_rms_error']:.2e}", f"{t['tolerance']:.0e}",
                      "yes" if t["passed"] else "NO"] for i, t in enumerate(v["tensors"])]
            if v["flips"]:
                worst = max(f["margin"] for f in v["flips"])
                flips.append(f"routing flips, {vname}: {len(v['flips'])} token(s), max margin {worst:.1e} "
                             f"< {v['flip_bound']:.0e}: {'yes' if worst < v['flip_bound'] else 'NO'}")
        show(con, ("variant", "kernels", "tensor", "max abs err", "rel RMS err", "tolerance", "ok"), rows, key=3,
             title=f"{layer['layer']} layer (#{layer['layer_index']})")
        for line in flips:
            con.print(line, markup=False)
    con.print("PASSED" if doc["passed"] else "FAILED: a variant is outside its tolerance")


def _conditions(doc: dict[str, Any]) -> str:
    parts = [f"model {doc['model']}", f"{doc['hardware']}", f"kernels {doc['kernel_set']}", f"TP{doc['tp']}",
             f"batch {doc['batch']}"]
    if "tokens_per_seq" in doc:
        parts.append(f"{doc['tokens_per_seq']} token(s)/seq (M = {doc['tokens']})")
    parts.append(f"context {doc['context']}")
    return "  ".join(parts)


def _misfit(doc: dict[str, Any]) -> str:
    """The prefix of every table title of a configuration whose memory exceeds HBM."""
    return "" if doc.get("fits_in_hbm", True) else "[DOES NOT FIT IN HBM] "


def _memory_line(con: Console, doc: dict[str, Any]) -> None:
    """Memory per GPU by part; when it exceeds HBM, a line in capitals (the cost shown is still the TP one)."""
    mem = doc["memory_gb"]
    if mem["fits"]:
        caches = "".join(f" + {kind.memory[1]} {mem[kind.memory[0]]:.2f}" for kind in attention.entries()
                         if mem[kind.memory[0]])  # the model's kinds (another kind's part is 0)
        con.print(f"memory per GPU: {mem['total']:.1f} GB = weights {mem['weights']:.1f}{caches} + activations "
                  f"{mem['activations']:.2f}, of {mem['capacity']:.0f} GB HBM")
    else:
        con.print(f"DOES NOT FIT IN HBM: {doc['does_not_fit']}", markup=False)


def _speculation(doc: dict[str, Any]) -> str:
    """The acceptance assumption, as every step table states it."""
    spec = doc["speculation"]
    if not spec["draft_tokens"]:
        return "no speculative decoding: 1 token per sequence per step"
    drafter = f" ({spec['drafter']})" if spec.get("drafter") else ""
    return (f"{spec['draft_tokens']} draft tokens{drafter}, acceptance length "
            f"{spec['acceptance_length']:.2f} tokens per verify step, {spec['assumption']}")


def print_plots(con: Console, doc: dict[str, Any]) -> None:
    """Where --plot wrote its charts, when it did."""
    if doc.get("plots"):
        con.print(f"wrote {len(doc['plots'])} chart file(s): " + ", ".join(doc["plots"]), markup=False)


def print_layer(doc: dict[str, Any], wide: bool = False) -> None:
    con = _console(wide)
    _memory_line(con, doc)
    con.print(f"{doc['layer'].upper()} layer (#{doc['layer_index']})  " + _conditions(doc))
    con.print(f"metric: {doc['metric']}")
    headers = ("#", "kernel", "stream", "start us", "dur us", "MB", "bound", "GB/s", "% of HBM peak")
    for name, v in doc["variants"].items():
        rows = [[str(i), k["name"], k["stream"], f"{k['start_us']:.2f}", f"{k['duration_us']:.2f}",
                 f"{k['bytes'] / 1e6:.2f}", k["bound"], f"{k['achieved_gbps']:.0f}",
                 f"{100 * k['fraction_of_hbm_peak']:.0f}"] for i, k in enumerate(v["kernels"], 1)]
        show(con, headers, rows, key=2, title=(
            f"{_misfit(doc)}{name}: {v['kernel_count']} kernels, {v['layer_us']:.1f} us (speed-of-light floor "
            f"{v['floor_us']:.1f} us); GB/s = the kernel's HBM bytes over its duration, % of HBM peak = that "
            "GB/s over the datasheet's"))
    rows = [[name, str(v["kernel_count"]), f"{v['layer_us']:.1f}", *_interval_cell(v, "layer_us_interval", ".1f"),
             f"{v['floor_us']:.1f}", f"{v['hbm_bytes'] / 1e6:.1f}"] for name, v in doc["variants"].items()]
    show(con, ("variant", "kernels", "layer us", *_interval_header(doc), "floor us", "HBM MB"), rows,
         title=f"{_misfit(doc)}side by side")
    if "speedup" in doc:
        con.print(f"speedup (standard / specialized layer time): {doc['speedup']:.2f}x" + _speedup_interval(doc))
    _interval_note(con, doc)
    print_plots(con, doc)


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


def print_step(doc: dict[str, Any], wide: bool = False) -> None:
    con = _console(wide)
    _memory_line(con, doc)
    con.print("decode step  " + _conditions(doc))
    con.print(f"speculation: {_speculation(doc)}", markup=False)
    con.print(f"metric: {doc['metric']}")
    keys = list(next(iter(doc["variants"].values()))["breakdown_ms"])
    spans = [f"step ms {h}" for h in _interval_header(doc)] + [f"tok/s {h}" for h in _interval_header(doc)]
    rows = [[name, f"{v['step_ms']:.3f}", f"{v['ms_per_token']:.3f}", f"{v['tokens_per_s']:.1f}",
             f"{v['tokens_per_s_per_user']:.1f}", *_interval_cell(v, "step_ms_interval", ".3f"),
             *_interval_cell(v, "tokens_per_s_interval", ".1f"), *[f"{v['breakdown_ms'][k]:.3f}" for k in keys],
             str(v["kernels_per_step"])] for name, v in doc["variants"].items()]
    show(con, ("variant", "step ms", "ms per token (per user)", "tok/s (aggregate)", "tok/s per user", *spans,
               *[f"{k} ms" for k in keys], "kernels"), rows,
         title=f"{_misfit(doc)}per variant, acceptance length {doc['acceptance_length']:.2f}: ms per token = "
               "step ms / acceptance length")
    if "speedup" in doc:
        con.print(f"speedup (standard / specialized step time): {doc['speedup']:.2f}x" + _speedup_interval(doc))
    _interval_note(con, doc)
    if "sensitivity" in doc:
        _print_sensitivity(con, doc["sensitivity"])
    if "routing_bracket" in doc:
        _print_routing_bracket(con, doc)
    print_plots(con, doc)


def _print_sensitivity(con: Console, sens: dict[str, Any]) -> None:
    """Parameters by their share of the step time's variance, per variant (cost/sensitivity.py)."""
    con.print(f"sensitivity: {sens['metric']}")
    for v, panel in sens["variants"].items():
        rows = [[r["parameter"], f"{100 * r['share']:.1f} %", f"{r['low_ms']:.3f}", f"{r['high_ms']:.3f}"]
                for r in panel["ranking"]]
        show(con, ("parameter", "share", "step ms at its 5th pct", "at its 95th pct"), rows,
             title=f"{v}: {panel['central_ms']:.3f} ms, interval [{panel['interval_ms'][0]:.3f}, "
                   f"{panel['interval_ms'][1]:.3f}] ms; shares sum to {panel['sum_of_shares']:.2f}")


def _print_routing_bracket(con: Console, doc: dict[str, Any]) -> None:
    """Step time and tokens/s at both ends of the routing bracket (uniform vs concentrated routing)."""
    rows = [[name, f"{end['expert_skew']:g}", f"{end['draft_correlation']:g}", v, f"{row['step_ms']:.3f}",
             f"{row['ms_per_token']:.3f}", f"{row['tokens_per_s']:.1f}"]
            for name, end in doc["routing_bracket"].items() for v, row in end["variants"].items()]
    show(con, ("routing", "expert skew s", "draft correlation", "variant", "step ms", "ms per token",
               "tok/s (aggregate)"), rows, key=4,
         title=f"{_misfit(doc)}routing bracket: the experts a step touches depend on how tokens route; uniform "
               f"independent routing touches the most (acceptance length {doc['acceptance_length']:.2f})")


def print_ablation(doc: dict[str, Any], wide: bool = False) -> None:
    con = _console(wide)
    if "memory_gb" in doc:
        _memory_line(con, doc)
    con.print(f"fusion ablation  model {doc['model']}  {doc['hardware']}  kernels {doc['kernel_set']}  TP{doc['tp']}  "
              f"batch {doc['batch']} x {doc['tokens_per_seq']} token(s)/seq  context {doc['context']}  "
              f"layer {doc['layer']}")
    if "speculation" in doc:
        con.print(f"speculation: {_speculation(doc)} ({doc['speculation']['note']})", markup=False)
    con.print(f"metric: {doc['metric']}")
    std, spec = doc["standard"], doc["specialized"]
    con.print(f"standard {std['kernel_count']} kernels {std['layer_us']:.1f} us / step {std['step_ms']:.3f} ms  ->  "
              f"specialized {spec['kernel_count']} kernels {spec['layer_us']:.1f} us / step {spec['step_ms']:.3f} ms")
    for level, unit, digits in (("layer", "us", 2), ("step", "ms", 3)):  # two tables: each fits 80 columns
        rows = [[r["fusion"], str(r["kernels_saved"]), *[f"{r[f'{view}_{level}_{unit}']:.{digits}f}"
                                                          for view in ("add_one", "remove_one", "waterfall")]]
                for r in doc["fusions"]]
        show(con, ("fusion (--disable-fusion)", "kernels saved", "add one", "remove one", "waterfall"), rows,
             title=f"{_misfit(doc)}{level} time saved ({unit})")
    con.print("add one: the fusion alone added to standard; remove one: it alone removed from specialized; "
              "waterfall: added in turn, adding up to standard - specialized. Positive = time saved.")
    print_plots(con, doc)


RUN_METRICS = {
    "step": ("step_ms", "acceptance_length", "tokens_per_s", "tokens_per_s_per_user", "speedup", "memory_total_gb"),
    "layer": ("kernel_count", "layer_us", "floor_us", "hbm_mb", "speedup"),
    "ablation": ("fusion", "kernels_saved", "add_one_layer_us", "remove_one_layer_us", "waterfall_layer_us",
                 "waterfall_step_ms"),
}


def print_run(result: dict[str, Any], max_rows: int = 60, wide: bool = False) -> None:
    con = _console(wide)
    s = result["summary"]
    con.print(f"scenario {s['scenario']} ({s['kind']}): {s['question']}")
    base = ", ".join(f"{k}={v}" for k, v in s["base"].items() if k not in s["sweep"] and v is not None)
    con.print(f"conditions: {base}")
    if "acceptance_assumption" in s:
        con.print(f"acceptance length where drafts are verified: {s['acceptance_assumption']}", markup=False)
    axes = [a for a in s["sweep"] if a != "variant"] + ["variant"]
    metrics = [m for m in RUN_METRICS[s["kind"]] if m not in axes]
    rows = [[*[_fmt(row.get(a)) for a in axes], *[_fmt(row.get(m)) for m in metrics],
             "ok" if row["status"] == "ok" else "skipped (reason below)"] for row in result["rows"][:max_rows]]
    show(con, (*axes, *metrics, "status"), rows, key=len(axes))
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
