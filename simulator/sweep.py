"""Run a scenario: evaluate every grid point, collect flat rows, write CSV + JSON + plots atomically.

One row per (point, variant) for `step` and `layer` scenarios, one per (point, fusion) for `ablation`.
Columns: the configuration keys first (so every row says its own conditions), then `status`
("ok" or "skipped: <reason>"), then the metrics. A Ctrl-C keeps the rows already finished: they are
written (atomically, as complete files) and the summary says `interrupted: true` and how many grid
points are done. A rerun into the same folder with the same scenario (summary.json's `scenario_hash`)
resumes after those points, so points.csv only grows; files of a different scenario are named in a
warning. Grid points are generated lazily; a grid over LIMIT points runs only when asked (`--yes`).
"""

from __future__ import annotations

import csv
import gc
import io
import itertools
import json
import multiprocessing
import os
import signal
from collections import deque
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterator

from simulator.cost.memory import memory_per_gpu, shortfall
from simulator.errors import UserError
from simulator.routing import RoutingStats
from simulator.plans.kernel import DecodeShape
from simulator.report.files import atomic_write, output_dir, output_file
from simulator.scenario import DEFAULTS, Scenario
from simulator.scenario import point_fusions as _fusions
from simulator.scenario import point_hardware as _hardware
from simulator.scenario import point_model as _model

CONFIG_COLUMNS = list(DEFAULTS)
OWN_FILES = ("points.csv", "summary.json")
# the 90 % interval of every row (docs/cost-model.md section 8); fewer draws than the CLI's 400, since a
# sweep prices many points and its bands only need to show their width
SWEEP_INTERVAL_DRAWS = 100


def _bounds(name: str, interval: list[float] | None) -> dict[str, Any]:
    """`<name>_low`, `<name>_high` columns from a report's `[low, high]` (none when it has no interval)."""
    return {} if interval is None else {f"{name}_low": interval[0], f"{name}_high": interval[1]}


def _interval_spec(interval: bool) -> Any:
    """The rows' interval (SWEEP_INTERVAL_DRAWS draws), or None for central values only (`run --no-interval`:
    about 20x faster a point, the rate a 10^5-point grid needs)."""
    if not interval:
        return None
    from simulator.cost.uncertainty import IntervalSpec
    return IntervalSpec(draws=SWEEP_INTERVAL_DRAWS)


def _step_inputs(point: dict[str, Any]) -> tuple:
    """`step_report`'s leading arguments at a point: (cfg, hw, tp, batch, context, draft tokens, acceptance
    length, variant, drafter, fusions, routing)."""
    return (_model(point["model"], point["precision"]), _hardware(point["hardware"], point["kernels"]), point["tp"],
            point["batch"],
            point["context"], point["draft_tokens"], point["acceptance_length"], point["variant"], point["drafter"],
            _fusions(point), _routing(point))


def _step_rows(point: dict[str, Any], interval: bool = True) -> list[dict[str, Any]]:
    from simulator.cost.fastsim import makespan_us  # thousands of plans: the compiled loop repays its load
    from simulator.report.summary import step_report
    doc = step_report(*_step_inputs(point), interval=_interval_spec(interval), makespan=makespan_us)
    rows = []
    for variant, v in doc["variants"].items():
        row = {"variant": variant, "step_ms": v["step_ms"], "tokens_per_s": v["tokens_per_s"],
               "tokens_per_s_per_user": v["tokens_per_s_per_user"], "kernels_per_step": v["kernels_per_step"],
               "speedup": doc.get("speedup"), "acceptance_length": doc["acceptance_length"]}
        row |= (_bounds("step_ms", v.get("step_ms_interval")) | _bounds("tokens_per_s", v.get("tokens_per_s_interval"))
                | _bounds("speedup", doc.get("speedup_interval")))
        row |= {f"{k}_ms": x for k, x in v["breakdown_ms"].items()}
        rows.append(row | _memory_columns(doc["memory_gb"]))
    return rows


def _schedule_step_draws(points: list[dict[str, Any]]) -> None:
    """Schedule under each GPU's draws, in one call of the compiled rows loop per GPU (`fastsim.makespan_us.draws`),
    every plan the points' step intervals will read, so that each point's own pricing finds them all
    (`uncertainty.priced`: one run, no loop). Why: point by point, `priced` would schedule them with lockstep's
    NumPy loop, all call overhead (~50 ms for 2 plans x 100 draws, ~80 events); a chunk's ~100 plans in one
    call cost ~3 µs a (plan, draw) row. Points that differ only in acceptance length build the same plans (it
    only scales the tokens) and are named once; an impossible point names none."""
    from simulator.cost.fastsim import makespan_us
    from simulator.cost.step import estimate_step
    from simulator.cost.uncertainty import schedule_plans, uncertainty_for
    from simulator.report.summary import variants_of
    plans: dict[Any, list] = {}
    named = set()
    for point in points:
        key = tuple(v for k, v in point.items() if k != "acceptance_length")
        if key in named:
            continue
        cfg, hw, tp, batch, context, draft, accept, variant, drafter, fusions, routing = _step_inputs(point)
        todo = plans.setdefault(hw, [])
        try:
            for v in variants_of(variant):
                estimate_step(cfg, hw, v, tp, batch, context, draft, accept, drafter, fusions, routing,
                              lambda plan, _: todo.append(plan) or 1.0)
        except UserError:
            continue
        named.add(key)
    for hw, todo in plans.items():
        schedule_plans(todo, uncertainty_for(hw, _interval_spec(True)).sample, makespan_us.draws)


def _layer_rows(point: dict[str, Any], interval: bool = True) -> list[dict[str, Any]]:
    from simulator.cost.fastsim import makespan_us
    from simulator.report.summary import layer_report
    doc = layer_report(_model(point["model"], point["precision"]), _hardware(point["hardware"], point["kernels"]),
                       point["tp"],
                       _shape(point), point["layer"], point["variant"], _fusions(point), _interval_spec(interval),
                       makespan_us)
    return [{"variant": variant, "kernel_count": v["kernel_count"], "layer_us": v["layer_us"],
             "floor_us": v["floor_us"], "hbm_mb": round(v["hbm_bytes"] / 1e6, 3), "speedup": doc.get("speedup")}
            | _bounds("layer_us", v.get("layer_us_interval")) | _bounds("speedup", doc.get("speedup_interval"))
            | _memory_columns(doc["memory_gb"]) for variant, v in doc["variants"].items()]


def _memory_columns(gb: dict[str, Any]) -> dict[str, Any]:
    """The memory parts as CSV columns; a point that does not fit HBM becomes a skipped row saying why."""
    if not gb["fits"]:
        raise UserError(f"does not fit: {shortfall(gb)}")
    return {f"memory_{k}_gb": v for k, v in gb.items() if k != "fits"}


def _ablation_rows(point: dict[str, Any], interval: bool = True) -> list[dict[str, Any]]:  # noqa: ARG001 (no interval)
    from simulator.cost.ablation import ablate
    from simulator.cost.fastsim import makespan_us
    cfg, hw = _model(point["model"], point["precision"]), _hardware(point["hardware"], point["kernels"])
    doc = ablate(cfg, hw, point["tp"],
                 point["batch"], point["tokens_per_seq"], point["context"], point["layer"], point["acceptance_length"],
                 _routing(point), makespan_us)
    memory = _memory_columns(memory_per_gpu(cfg, hw.hbm_capacity, point["tp"], _shape(point)).as_gb())
    base = {"standard_layer_us": doc["standard"]["layer_us"], "specialized_layer_us": doc["specialized"]["layer_us"],
            "standard_step_ms": doc["standard"]["step_ms"], "specialized_step_ms": doc["specialized"]["step_ms"]}
    return [{"variant": "specialized"} | r | base | memory for r in doc["fusions"]]


def _routing(point: dict[str, Any]) -> RoutingStats:
    return RoutingStats(float(point["expert_skew"]), float(point["draft_correlation"]))


def _shape(point: dict[str, Any]) -> DecodeShape:
    return DecodeShape(point["batch"], point["tokens_per_seq"], point["context"], _routing(point))


EVALUATORS: dict[str, Callable[[dict[str, Any], bool], list[dict[str, Any]]]] = {
    "step": _step_rows, "layer": _layer_rows, "ablation": _ablation_rows}


def evaluate(point: dict[str, Any], kind: str, interval: bool = True) -> list[dict[str, Any]]:
    """Rows for one grid point (with their interval bounds unless `interval` is False); an impossible
    point becomes one skipped row carrying the reason."""
    try:
        rows = EVALUATORS[kind](point, interval)
    except UserError as exc:
        return [point | {"status": f"skipped: {exc}"}]
    kernel_set = _hardware(point["hardware"], point["kernels"]).kernels
    return [point | {"status": "ok", "kernel_set": kernel_set} | row for row in rows]


LIMIT = 20_000  # grid points a run takes without --yes
# points/s on one core of a 2-core development machine, every point a new shape, with and without the rows'
# 100-draw interval: a lower bound for the time a refused grid would take (grids sharing plan shapes and
# several workers run faster; benchmarks/bench_sweep.py measures them)
POINTS_PER_S = {("step", True): 38, ("step", False): 100, ("layer", True): 170, ("layer", False): 400,
                ("ablation", True): 2, ("ablation", False): 2}


def estimate_s(sc: Scenario, interval: bool = True) -> float:
    return sc.count / POINTS_PER_S[sc.kind, interval]


def check_size(sc: Scenario, yes: bool, interval: bool = True) -> None:
    """A grid over LIMIT points runs only when asked for, and the refusal says how long it would take."""
    if sc.count > LIMIT and not yes:
        minutes = estimate_s(sc, interval) / 60
        took = f"{minutes / 60:,.1f} h" if minutes >= 120 else f"{minutes:,.0f} min"
        raise UserError(f"scenario {sc.name} has {sc.count:,} grid points, over the {LIMIT:,} a run takes unasked "
                        f"(about {took} on one core at ~{POINTS_PER_S[sc.kind, interval]} points/s): pass --yes "
                        "to run it" + (", or --no-interval for central values only." if interval else "."))


def run(sc: Scenario, out_dir: str | Path | None = None, progress: Callable[[int, int], None] | None = None,
        yes: bool = False, tell: Callable[[str], None] = lambda message: None,
        workers: int | None = None, interval: bool = True) -> dict[str, Any]:
    """Evaluate the grid lazily on `workers` processes (all cores by default); write points.csv,
    summary.json and the plots into out_dir (if given). Rows come in grid order whatever the workers.

    A rerun into an out_dir holding this scenario's unfinished rows (same digest) resumes after them.
    """
    check_size(sc, yes, interval)
    out = output_dir(out_dir, "--out") if out_dir is not None else None
    rows, done = prepare_out(sc, out, tell, interval) if out is not None else ([], 0)
    interrupted = False
    todo = itertools.islice(sc.points(), done, None)
    workers = workers or len(os.sched_getaffinity(0))
    try:
        for i, point_rows in enumerate(evaluate_points(todo, sc.kind, sc.count - done, workers, interval), done + 1):
            rows += point_rows
            done = i
            if progress:
                progress(i, sc.count)
    except KeyboardInterrupt:
        interrupted = True
    summary = _summary(sc, done, rows, interrupted) | {"interval": interval}
    if out is not None:
        summary["files"] = write_outputs(sc, rows, summary, out, plots=not interrupted)
    if interrupted:
        raise ScenarioInterrupted(summary)
    return {"summary": summary, "rows": rows}


PARALLEL_MIN_POINTS = 64  # fewer run in this process: starting workers would cost more than they save
CHUNK = 256  # points evaluated together at most: their interval plans share one call of the rows loop per GPU


def evaluate_points(points: Iterator[dict[str, Any]], kind: str, count: int, workers: int,
                    interval: bool = True) -> Iterator[list[dict[str, Any]]]:
    """Each point's rows, in order, chunk by chunk (`_chunk_rows`). With several workers, chunks of
    consecutive points go to forked processes (neighbours in the grid share plan shapes, so each worker's plan
    caches hit), at most two chunks per worker in flight (the grid is never held whole), and results are
    yielded in grid order. Fork is safe here: the cost model runs no parallel Numba kernel, whose thread pool
    a fork would lose."""
    serial = workers <= 1 or count < PARALLEL_MIN_POINTS
    size = CHUNK if serial else max(1, min(CHUNK, count // (16 * workers)))
    chunks = iter(lambda: list(itertools.islice(points, size)), [])
    if serial:
        for chunk in chunks:
            yield from _chunk_rows(chunk, kind, interval)
        return
    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"), initializer=_ignore_sigint)
    try:
        pending = deque(pool.submit(_evaluate_chunk, c, kind, interval) for c in itertools.islice(chunks, 2 * workers))
        while pending:
            done = pending.popleft().result()
            pending.extend(pool.submit(_evaluate_chunk, c, kind, interval) for c in itertools.islice(chunks, 1))
            yield from done
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def _chunk_rows(points: list[dict[str, Any]], kind: str, interval: bool) -> Iterator[list[dict[str, Any]]]:
    """The points' rows one point at a time (a Ctrl-C keeps the finished ones), their interval plans scheduled
    together first."""
    if interval and kind == "step":
        _schedule_step_draws(points)
    return (evaluate(p, kind, interval) for p in points)


def _evaluate_chunk(points: list[dict[str, Any]], kind: str, interval: bool) -> list[list[dict[str, Any]]]:
    """A worker's chunk. What is alive when it starts (the imports, the plan and pricing caches of the chunks
    before) is moved out of the cyclic collector's sight first (`gc.freeze`): those caches only grow, and
    every full collection went over all of them (~10 % of the time of a 6,000-point sweep on one process,
    docs/history/cpu-fast-path.md). Nothing in them is freed by the collector (no cycles: they die by reference
    count, or with the worker). Workers only: the calling process keeps its collector as it was."""
    gc.freeze()
    return list(_chunk_rows(points, kind, interval))


def _ignore_sigint() -> None:
    """Workers leave Ctrl-C to the parent, which keeps the finished rows and stops them."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class ScenarioInterrupted(KeyboardInterrupt):
    """Ctrl-C during a sweep, after the finished rows were written; the message is one line for the user."""

    def __init__(self, summary: dict[str, Any], while_doing: str = ""):
        s = summary
        where = f"{s['rows']} rows in {Path(s['files'][0]).parent}/points.csv: rerun the same command to resume" \
            if s.get("files") else "nothing written (no --out)"
        doing = while_doing or f"after {s['points_done']} of {s['points']} points"
        super().__init__(f"interrupted {doing}; {where}.")
        self.summary = summary


def prepare_out(sc: Scenario, out: Path, tell: Callable[[str], None],
                interval: bool = True) -> tuple[list[dict[str, Any]], int]:
    """Check the folder's files before any work; return the rows and points this scenario already did there
    (with the same interval setting: rows with and without bounds are not mixed in one file)."""
    for name in OWN_FILES:
        if (out / name).exists() or (out / name).is_symlink():
            output_file(out / name, "--out")
    old = _old_summary(out)
    same = (old.get("scenario_hash") == sc.digest and isinstance(old.get("points_done"), int)
            and old.get("interval", True) == interval)
    if same and (out / "points.csv").is_file():
        rows = read_csv(out / "points.csv")
        if len(rows) != old.get("rows"):
            raise UserError(f"{out}/points.csv holds {len(rows)} rows but its summary.json says {old.get('rows')}: "
                            "move one of them away, then rerun.")
        if old["points_done"]:
            tell(f"resuming: {old['points_done']} of {sc.count} points already in {out}/points.csv")
        return rows, old["points_done"]
    files = old.get("files") if isinstance(old.get("files"), list) else []
    names = [Path(str(f)).name for f in files] or list(OWN_FILES)
    earlier = [n for n in dict.fromkeys(names) if (out / n).exists()]
    if earlier and not same:
        tell(f"warning: {out} holds files of an earlier, different scenario ({old.get('scenario', 'unknown')}): "
             f"{', '.join(earlier)}; this run replaces the ones it writes again, the others stay as they are")
    return [], 0


def _old_summary(out: Path) -> dict[str, Any]:
    try:
        old = json.loads((out / "summary.json").read_text())
    except (OSError, ValueError):
        return {}
    return old if isinstance(old, dict) else {}


def read_csv(path: Path) -> list[dict[str, Any]]:
    """Rows of a points.csv, numbers as numbers again (for plots and --json of a resumed run)."""
    with open(path, newline="") as f:
        return [{k: _cell(v) for k, v in row.items()} for row in csv.DictReader(f)]


def _cell(text: str) -> Any:
    if text in ("", "True", "False"):
        return None if text == "" else text == "True"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


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


def _summary(sc: Scenario, done: int, rows: list[dict[str, Any]], interrupted: bool) -> dict[str, Any]:
    ok = [r for r in rows if r["status"] == "ok"]
    return {"scenario": sc.name, "file": sc.path, "question": sc.question, "kind": sc.kind, "base": sc.base,
            "sweep": sc.sweep, "scenario_hash": sc.digest, "points": sc.count, "points_done": done,
            "rows": len(rows), "rows_ok": len(ok),
            "skipped": sorted({r["status"].removeprefix("skipped: ") for r in rows if r["status"] != "ok"}),
            "interrupted": interrupted, "columns": columns(rows)}


def write_outputs(sc: Scenario, rows: list[dict[str, Any]], summary: dict[str, Any], out: Path,
                  plots: bool = True) -> list[str]:
    out.mkdir(parents=True, exist_ok=True)
    files = [atomic_write(out / "points.csv", to_csv(rows))]
    stopped = None
    if plots and sc.outputs.get("plots"):
        from simulator.report.scenario_plots import scenario_plots
        try:
            files += scenario_plots(sc, rows, out)
        except KeyboardInterrupt:
            stopped, summary["interrupted"] = "while drawing the plots", True
    names = [str(f) for f in files] + [str(out / "summary.json")]
    atomic_write(out / "summary.json", json.dumps(summary | {"files": names}, indent=2, allow_nan=False))
    if stopped:
        raise ScenarioInterrupted(summary | {"files": names}, stopped)
    return names
