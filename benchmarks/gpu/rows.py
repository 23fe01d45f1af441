"""The suite's CSV rows: the columns every measurement file shares and the appending writer.

Shared by suite.py (single-GPU families), fam_collective.py (rank 0 of the collectives run) and
production.py (the production kernels), so none of them imports another's driver. One row per point:
the point's fields (points.FIELDS, `id` first), the environment, the timing results, then any extra
columns a measurement set adds (production rows name their package and the kernels they launched).
"""

from __future__ import annotations

import csv
import subprocess
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
