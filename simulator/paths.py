"""Where the shipped data lives: model configs, scenarios, H200 measurements and hardware profiles.

In a clone (and an editable install) `models/`, `scenarios/` and `calibration/` sit at the top of the
repository; a wheel or a plain `pip install .` carries them inside the package as `simulator/models`,
`simulator/scenarios` and `simulator/calibration` (see pyproject.toml's package-dir). Hardware profiles
always live in the package.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parent


def data_dir(name: str) -> Path:
    """The folder of shipped `name` files (models, scenarios, calibration): inside the package when installed."""
    inside = PACKAGE / name
    return inside if inside.is_dir() else PACKAGE.parent / name


def measurement_folder(given: str | None) -> Path:
    """The folder of GPU measurement CSVs `moe-sim validate` reads: `given` when it is a folder, else the
    shipped set of that name (`h200`), else the shipped H200 set when nothing is given."""
    from simulator.errors import UserError
    shipped = data_dir("calibration")
    if given is None:
        return shipped / "h200"
    if Path(given).is_dir():
        return Path(given)
    if (shipped / given).is_dir() and "/" not in given:
        return shipped / given
    names = ", ".join(sorted(p.name for p in shipped.iterdir() if p.is_dir())) if shipped.is_dir() else "none"
    raise UserError(f"--measurements {given}: not a folder of measurement CSVs, nor a shipped set ({names}).")
