"""Human-readable tables (rich) for the CLI. Every number is printed with its metric and conditions."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table


def _console() -> Console:
    console = Console(highlight=False)
    if not console.is_terminal:  # pipes and CI logs: wide enough that numbers are never elided
        console = Console(highlight=False, width=140)
    return console


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
