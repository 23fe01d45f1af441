"""Variant name -> plan builder: the one dict the CLI, the check and the cost model dispatch through."""

from __future__ import annotations

from typing import Callable

from simulator.plans import VARIANTS, specialized, standard
from simulator.plans.kernel import Plan

BUILDERS: dict[str, Callable[..., Plan]] = {"standard": standard.build, "specialized": specialized.build}
assert tuple(BUILDERS) == VARIANTS
