"""Where the shipped data lives: model configs, scenarios and hardware profiles.

In a clone (and an editable install) `models/` and `scenarios/` sit at the top of the repository; a
wheel or a plain `pip install .` carries them inside the package as `simulator/models` and
`simulator/scenarios` (see pyproject.toml's package-dir). Hardware profiles always live in the package.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parent


def data_dir(name: str) -> Path:
    """The folder of shipped `name` files (models or scenarios): inside the package when installed."""
    inside = PACKAGE / name
    return inside if inside.is_dir() else PACKAGE.parent / name
