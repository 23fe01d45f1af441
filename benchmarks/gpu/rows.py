"""The suite's CSV rows: the columns every measurement file shares and the appending writer.

Shared by suite.py (single-GPU families), fam_collective.py (rank 0 of the collectives run) and
production.py and gqa_rows.py (the production kernels, through `time_points`, their one point loop), so none of
them imports another's driver. One row per point:
the point's fields (points.FIELDS, `id` first), the environment, the timing results, then any extra
columns a measurement set adds (production rows name their package and the kernels they launched).
"""

from __future__ import annotations

import csv
import subprocess
import time
import traceback
from pathlib import Path

import points as pts

RESULT_FIELDS = ["median_us", "p10_us", "p90_us", "reps", "replays", "launches", "max_err", "skew_us", "status"]
ENV_FIELDS = ["gpu", "driver", "torch", "triton"]


def write_row(path: Path, row: dict, extra: tuple[str, ...] = ()) -> None:
    """Append one row to a family CSV (header on first write), so a run cut short keeps what it measured."""
    append_row(path, row, pts.FIELDS + ENV_FIELDS + RESULT_FIELDS + list(extra))


def append_row(path: Path, row: dict, fields: list[str]) -> None:
    """Append `row` (its `fields`, in order; other keys ignored) to a CSV, writing the header first when the
    file is new: every GPU script's writer, so a run cut short keeps the rows it finished."""
    new = not path.exists()
    with path.open("a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        if new:
            w.writeheader()
        w.writerow(row)


def read_rows(path: Path) -> list[dict]:
    """Every row of a CSV as a dict of strings: a measurement, prediction or comparison file read back."""
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def write_rows(path: Path, rows: list[dict], fields: list[str]) -> None:
    """Write a whole CSV at once (a predictions file, written before the run it predicts), its folder made."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)


def simulator_commit() -> str:
    """The repository's short HEAD, stamped on every prediction so a run can be matched to the model priced."""
    return subprocess.run(["git", "-C", str(Path(__file__).resolve().parent), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True).stdout.strip()


def measured_ids(folder: Path) -> set[str]:
    """Ids of the ok rows in a folder's measurement CSVs (any with a median_us column: the family CSVs and
    side sets such as gemm_probe.csv; predictions and pre-registrations have none)."""
    ids = set()
    for path in folder.glob("*.csv"):
        with path.open(newline="") as f:
            rows = csv.DictReader(f)
            if "median_us" in (rows.fieldnames or ()):
                ids |= {r["id"] for r in rows if r.get("status", "ok") == "ok"}
    return ids


def time_points(todo: list, measure_one, torch, path: Path, env: dict, extra: tuple[str, ...], t0: float,
                budget_s: float) -> tuple[int, int]:
    """(points measured, points failed) of measuring each point with measure_one(p) -> its result: one row each,
    appended to `path` as it finishes (a run cut short keeps what it measured), the production kernel named from
    points.PRODUCTION_IMPLS; no point is started once budget_s has passed since t0. Every production script's loop
    (production.py's, gqa_rows.py's)."""
    done = failed = 0
    for i, p in enumerate(todo):
        if time.time() - t0 > budget_s:
            print(f"budget of {budget_s:.0f} s spent: stopping before point {i} of {len(todo)}", flush=True)
            break
        t1 = time.time()
        try:
            res = {"status": "ok", **measure_one(p)}
            done += 1
        except Exception as exc:  # one bad point must not cost the rest of the run
            traceback.print_exc()
            res = {"status": f"error: {type(exc).__name__}: {exc}"[:300]}
            failed += 1
            torch.cuda.empty_cache()
        package, kernel, standin = pts.PRODUCTION_IMPLS[p.impl]
        names = res.pop("kernel_names", [])
        row = {**p.row(), **{k: env.get(k, "") for k in ENV_FIELDS}, **res, "package": package, "kernel": kernel,
               "stands_in_for": standin, "kernel_names": ";".join(n[:80] for n in names)[:400],
               "launches": len(names) or "", "point_s": round(time.time() - t1, 2)}
        write_row(path, row, extra)
        print(f"[{time.time() - t0:6.1f}s] {p.id}: {res.get('median_us', '-')} us {res['status']}", flush=True)
    return done, failed
