"""Run a scenario: evaluate every grid point, collect flat rows, write CSV + JSON + plots atomically.

One row per (point, variant) for `step` and `layer` scenarios, one per (point, fusion) for `ablation`.
Columns: the configuration keys first (so every row says its own conditions), then `status`
("ok" or "skipped: <reason>"), then the metrics. A Ctrl-C keeps the rows already finished: they are
written (atomically, as complete files) and the summary says `interrupted: true`.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import replace
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

from simulator.config import ModelConfig, load_model
from simulator.cost.memory import memory_per_gpu, shortfall
from simulator.errors import UserError
from simulator.hardware import HardwareProfile, load_hardware
from simulator.plans.kernel import DecodeShape
from simulator.report.files import atomic_write
from simulator.scenario import DEFAULTS, Scenario

CONFIG_COLUMNS = list(DEFAULTS)


@lru_cache(maxsize=64)
def _model(name: str, precision: str | None) -> ModelConfig:
    cfg = load_model(name)
    return replace(cfg, expert_dtype=precision) if precision else cfg


@lru_cache(maxsize=64)
def _hardware(name: str) -> HardwareProfile:
    return load_hardware(name)


def _fusions(point: dict[str, Any]) -> frozenset[str]:
    from simulator.report.summary import fusion_set
    off = [] if point["fusion_off"] == "none" else [point["fusion_off"]]
    on = [] if point["fusion_on"] == "none" else [point["fusion_on"]]
    return fusion_set(off, on)


def _step_rows(point: dict[str, Any]) -> list[dict[str, Any]]:
    from simulator.report.summary import step_report
    doc = step_report(_model(point["model"], point["precision"]), _hardware(point["hardware"]), point["tp"],
                      point["batch"], point["context"], point["draft_tokens"], point["acceptance_length"],
                      point["variant"], point["drafter"], _fusions(point))
    rows = []
    for variant, v in doc["variants"].items():
        row = {"variant": variant, "step_ms": v["step_ms"], "tokens_per_s": v["tokens_per_s"],
               "tokens_per_s_per_user": v["tokens_per_s_per_user"], "kernels_per_step": v["kernels_per_step"],
               "speedup": doc.get("speedup"), "acceptance_length": doc["acceptance_length"]}
        row |= {f"{k}_ms": x for k, x in v["breakdown_ms"].items()}
        rows.append(row | _memory_columns(doc["memory_gb"]))
    return rows


def _layer_rows(point: dict[str, Any]) -> list[dict[str, Any]]:
    from simulator.report.summary import layer_report
    doc = layer_report(_model(point["model"], point["precision"]), _hardware(point["hardware"]), point["tp"],
                       _shape(point), point["layer"], point["variant"], _fusions(point))
    return [{"variant": variant, "kernel_count": v["kernel_count"], "layer_us": v["layer_us"],
             "floor_us": v["floor_us"], "hbm_mb": round(v["hbm_bytes"] / 1e6, 3), "speedup": doc.get("speedup")}
            | _memory_columns(doc["memory_gb"]) for variant, v in doc["variants"].items()]


def _memory_columns(gb: dict[str, Any]) -> dict[str, Any]:
    """The memory parts as CSV columns; a point that does not fit HBM becomes a skipped row saying why."""
    if not gb["fits"]:
        raise UserError(f"does not fit: {shortfall(gb)}")
    return {f"memory_{k}_gb": v for k, v in gb.items() if k != "fits"}


def _ablation_rows(point: dict[str, Any]) -> list[dict[str, Any]]:
    from simulator.cost.ablation import ablate
    cfg, hw = _model(point["model"], point["precision"]), _hardware(point["hardware"])
    doc = ablate(cfg, hw, point["tp"],
                 point["batch"], point["tokens_per_seq"], point["context"], point["layer"], point["acceptance_length"])
    memory = _memory_columns(memory_per_gpu(cfg, hw.hbm_capacity, point["tp"], _shape(point)).as_gb())
    base = {"standard_layer_us": doc["standard"]["layer_us"], "specialized_layer_us": doc["specialized"]["layer_us"],
            "standard_step_ms": doc["standard"]["step_ms"], "specialized_step_ms": doc["specialized"]["step_ms"]}
    return [{"variant": "specialized"} | r | base | memory for r in doc["fusions"]]


def _shape(point: dict[str, Any]) -> DecodeShape:
    return DecodeShape(point["batch"], point["tokens_per_seq"], point["context"])


EVALUATORS: dict[str, Callable[[dict[str, Any]], list[dict[str, Any]]]] = {
    "step": _step_rows, "layer": _layer_rows, "ablation": _ablation_rows}


def evaluate(point: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    """Rows for one grid point; an impossible point becomes one skipped row carrying the reason."""
    try:
        rows = EVALUATORS[kind](point)
    except UserError as exc:
        return [point | {"status": f"skipped: {exc}"}]
    return [point | {"status": "ok"} | row for row in rows]


def run(sc: Scenario, out_dir: str | Path | None = None,
        progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Evaluate the grid; write points.csv, summary.json and the plots into out_dir (if given)."""
    points, rows, interrupted = sc.points(), [], False
    try:
        for i, point in enumerate(points):
            rows += evaluate(point, sc.kind)
            if progress:
                progress(i + 1, len(points))
    except KeyboardInterrupt:
        interrupted = True
    summary = _summary(sc, points, rows, interrupted)
    if out_dir is not None:
        summary["files"] = write_outputs(sc, rows, summary, Path(out_dir), plots=not interrupted)
    if interrupted:
        raise ScenarioInterrupted(summary)
    return {"summary": summary, "rows": rows}


class ScenarioInterrupted(KeyboardInterrupt):
    """Ctrl-C during a sweep, after the finished rows were written."""

    def __init__(self, summary: dict[str, Any]):
        super().__init__("interrupted")
        self.summary = summary


def columns(rows: list[dict[str, Any]]) -> list[str]:
    seen = {c: None for c in CONFIG_COLUMNS + ["variant", "status"]}
    for row in rows:
        seen.update({k: None for k in row})
    return list(seen)


def to_csv(rows: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns(rows), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


def _summary(sc: Scenario, points: list[dict[str, Any]], rows: list[dict[str, Any]], interrupted: bool) -> dict[str, Any]:
    ok = [r for r in rows if r["status"] == "ok"]
    return {"scenario": sc.name, "file": sc.path, "question": sc.question, "kind": sc.kind, "base": sc.base,
            "sweep": sc.sweep, "points": len(points), "rows": len(rows), "rows_ok": len(ok),
            "skipped": sorted({r["status"].removeprefix("skipped: ") for r in rows if r["status"] != "ok"}),
            "interrupted": interrupted, "columns": columns(rows)}


def write_outputs(sc: Scenario, rows: list[dict[str, Any]], summary: dict[str, Any], out: Path,
                  plots: bool = True) -> list[str]:
    out.mkdir(parents=True, exist_ok=True)
    files = [atomic_write(out / "points.csv", to_csv(rows))]
    if plots and sc.outputs.get("plots"):
        from simulator.report.scenario_plots import scenario_plots
        files += scenario_plots(sc, rows, out)
    summary_text = json.dumps(summary | {"files": [str(f) for f in files] + [str(out / "summary.json")]}, indent=2,
                              allow_nan=False)
    files.append(atomic_write(out / "summary.json", summary_text))
    return [str(f) for f in files]
