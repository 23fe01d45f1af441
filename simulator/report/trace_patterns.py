"""The pattern table of `moe-sim compare-trace` (kernel_patterns.toml): how each engine names the plan's
kernels, loaded and compiled (patterns are data: Python's `re`, nothing executed), and the Classifier that
maps each distinct kernel label of a trace to the plan kernels it could be."""

from __future__ import annotations

import fnmatch
import re
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from simulator.errors import UserError
from simulator.plans.kernel import Plan
from simulator.report.trace_reader import KernelEvent, short

PATTERNS_FILE = Path(__file__).with_name("kernel_patterns.toml")
LAYER_PREFIX = re.compile(r"^(?:L\d+|head)\.")  # moe-sim step traces key kernels "L5.o_proj"


@dataclass(frozen=True)
class Engine:
    """One entry of the pattern table: how an engine names the plan's kernels."""

    name: str
    about: str
    variant: str | None
    match_on: str  # "name" | "key"
    plan_keys: tuple[str, ...] | None
    patterns: dict[str, tuple[re.Pattern[str], ...]]
    part_of_previous: tuple[re.Pattern[str], ...] = ()  # second launches of one plan kernel (split-K reduce)
    kernel_set: str | None = None  # the measured implementation set whose kernels the engine's traces show


def load_engine(name: str, path: str | Path | None = None) -> Engine:
    """The engine `name` from the bundled table, or from a user's `--patterns` file of the same shape."""
    source, table = load_table(path)
    engines = table.get("engine", {})
    if name not in engines:
        raise UserError(f"engine '{short(name)}' is not in {source}; it has {', '.join(engines) or 'no engines'}.")
    entry = engines[name]
    patterns = {key: tuple(compile_pattern(p, source, name) for p in string_list(pats, source))
                for key, pats in entry.get("patterns", {}).items()}
    keys = entry.get("plan_keys")
    parts = tuple(compile_pattern(p, source, name) for p in string_list(entry.get("part_of_previous", []), source))
    kernel_set = entry.get("kernel_set")
    if kernel_set is not None and not isinstance(kernel_set, str):
        raise UserError(f"{source}: engine '{short(name)}' has kernel_set {short(repr(kernel_set))}, not a set name.")
    return Engine(name, str(entry.get("about", "")), entry.get("variant"), str(entry.get("match_on", "name")),
                  tuple(string_list(keys, source)) if keys is not None else None, patterns, parts, kernel_set)


def load_table(path: str | Path | None = None) -> tuple[Path, dict[str, Any]]:
    """The pattern table as TOML data: the bundled one, or a user's `--patterns` file."""
    source = Path(path) if path else PATTERNS_FILE
    try:
        return source, tomllib.loads(source.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise UserError(f"cannot read the pattern table {source}: {short(str(exc), 120)}.") from None


def engine_names(path: str | Path | None = None) -> list[str]:
    """The engines of the bundled pattern table (or of a user's `--patterns` file), in table order."""
    return list(load_table(path)[1].get("engine", {}))


def string_list(value: Any, source: Path) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise UserError(f"{source}: patterns and plan_keys must be lists of strings, not {short(repr(value))}.")
    return value


def compile_pattern(pattern: str, source: Path, engine: str) -> re.Pattern[str]:
    text = fnmatch.translate(pattern[5:]) if pattern.startswith("glob:") else pattern
    try:
        return re.compile(text, re.IGNORECASE)
    except re.error as exc:
        raise UserError(f"{source}: engine '{engine}' pattern '{short(pattern)}' is not a valid regex "
                        f"({exc}).") from None


def partial_plan(plan: Plan, keys: tuple[str, ...] | None) -> Plan:
    """The plan restricted to `keys` (a partial layer), dependencies on left-out kernels dropped."""
    if keys is None:
        return plan
    known = [k.key for k in plan]
    unknown = [k for k in keys if k not in known]
    if unknown:
        raise UserError(f"plan key(s) {', '.join(unknown)} are not in the {plan.variant} {plan.layer} plan "
                        f"({', '.join(known)}).")
    kept = [replace(k, deps=tuple(d for d in k.deps if d in keys)) for k in plan if k.key in keys]
    return replace(plan, kernels=tuple(kept))


class Classifier:
    """Label -> the plan indices it could be, computed once per distinct label."""

    def __init__(self, engine: Engine, plan: Plan) -> None:
        self.engine, self.plan = engine, plan
        self.keys = [k.key for k in plan]
        self.names = [k.name for k in plan]
        self._cache: dict[str, frozenset[int]] = {}

    def label(self, k: KernelEvent) -> str:
        if self.engine.match_on == "key" and k.key is not None:
            return LAYER_PREFIX.sub("", k.key)
        return k.name

    def __call__(self, label: str) -> frozenset[int]:
        hit = self._cache.get(label)
        if hit is None:
            hit = self._cache[label] = frozenset(self._match(label))
        return hit

    def _match(self, label: str) -> list[int]:
        if self.engine.match_on == "key":
            return [i for i, (key, name) in enumerate(zip(self.keys, self.names)) if label in (key, name)]
        pats = self.engine.patterns
        return [i for i, key in enumerate(self.keys) if any(p.search(label) for p in pats.get(key, ()))]
