"""What-if scenarios: a TOML file -> a grid of configurations -> rows of results, CSV, JSON, plots.

    question = "What does the specialized path buy at batch 32 on TP8?"   # one paragraph, required
    kind = "step"                  # step | layer | ablation
    [base]                         # one configuration (every key optional; defaults below)
    model = "kimi-k3"
    hardware = "gb300"
    tp = 8
    [sweep]                        # axes: each a non-empty list; the grid is their cartesian product
    batch = [1, 2, 4, 8, 16, 32, 64]
    [outputs]
    plots = ["step_vs_batch"]      # see PLOTS for each kind

Keys of [base] and [sweep]: model, hardware, tp, batch, tokens_per_seq, draft_tokens, acceptance_length,
context, layer, variant, precision (routed-expert weight format: mxfp4, fp8, bf16), fusion_off (one
fusion of the specialized plan switched off, or "none"), fusion_on (a what-if fusion, or "none"), drafter,
kernels (the kernel implementation set priced, as `--kernels`: "datasheet" or a set measured on the GPU,
e.g. "vllm" or "gpu-suite" on H200; unset, each GPU's default; each row names the set it used).

A scenario is data, never code: it is parsed with tomllib and checked key by key; every problem is one
sentence naming the file, the line and the key. A grid point that is physically impossible (TP16 on an
8-GPU NVLink domain, an acceptance length above draft tokens + 1) is kept as a skipped row with the
reason, so one bad corner does not sink a sweep.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import re
import tomllib
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

from simulator import attention, limits
from simulator.config import ATTENTION_KINDS
from simulator.errors import UserError
from simulator.paths import data_dir
from simulator.plans import VARIANTS

if TYPE_CHECKING:
    from simulator.config import ModelConfig
    from simulator.hardware import HardwareProfile

DEFAULTS: dict[str, Any] = {
    "model": "kimi-k3", "hardware": "gb300", "tp": 16, "batch": 1, "tokens_per_seq": 1, "draft_tokens": 0,
    "acceptance_length": None, "context": 512, "layer": "kda", "variant": "both", "precision": None,
    "fusion_off": "none", "fusion_on": "none", "drafter": "dspark-k3", "expert_skew": 0.0, "draft_correlation": 0.0,
    "kernels": None,
}
TYPES: dict[str, tuple[type, ...]] = {
    "model": (str,), "hardware": (str,), "tp": (int,), "batch": (int,), "tokens_per_seq": (int,),
    "draft_tokens": (int,), "acceptance_length": (int, float), "context": (int,), "layer": (str,),
    "variant": (str,), "precision": (str,), "fusion_off": (str,), "fusion_on": (str,), "drafter": (str,),
    "expert_skew": (int, float), "draft_correlation": (int, float), "kernels": (str,),
}
CHOICES: dict[str, tuple[str, ...]] = {"layer": ATTENTION_KINDS + ("dense",), "variant": VARIANTS + ("both",),
                                       "precision": ("mxfp4", "fp8", "bf16")}
KINDS = ("step", "layer", "ablation")
PLOTS: dict[str, tuple[str, ...]] = {
    "step": ("step_vs_x", "metric"),
    "layer": ("timeline", "kernel_bars", "roofline", "metric"),
    "ablation": ("waterfall",),
}
OUTPUT_KEYS = {"plots": list, "x": str, "y": str, "group": str, "logx": bool}
MEMORY_PARTS = ("weights", *(k.memory[0] for k in attention.entries()), "activations", "total", "capacity")
MEMORY_COLUMNS = tuple(f"memory_{k}_gb" for k in MEMORY_PARTS)  # sweep._memory_columns
Y_COLUMNS: dict[str, tuple[str, ...]] = {  # what `[outputs] y` may name: numeric columns of each kind's rows
    "step": ("step_ms", "tokens_per_s", "tokens_per_s_per_user", "kernels_per_step", "speedup",
             *(f"{kind}_layers_ms" for kind in ATTENTION_KINDS), "dense_layers_ms", "head_ms", *MEMORY_COLUMNS),
    "layer": ("layer_us", "floor_us", "kernel_count", "hbm_mb", "speedup", *MEMORY_COLUMNS),
    "ablation": ("add_one_layer_us", "remove_one_layer_us", "waterfall_layer_us", "add_one_step_ms",
                 "remove_one_step_ms", "waterfall_step_ms", "kernels_saved"),
}
TOP_KEYS = {"question": str, "kind": str, "base": dict, "sweep": dict, "outputs": dict}
SCENARIOS_DIR = data_dir("scenarios")


@dataclass(frozen=True)
class Scenario:
    name: str
    path: str
    question: str
    kind: str
    base: dict[str, Any]
    sweep: dict[str, list[Any]]
    outputs: dict[str, Any] = field(default_factory=dict)

    def points(self) -> Iterator[dict[str, Any]]:
        """The grid, one point at a time (a 10^6-point grid is never held as a list)."""
        axes = list(self.sweep)
        for values in itertools.product(*(self.sweep[a] for a in axes)):
            yield self.base | dict(zip(axes, values))

    @property
    def count(self) -> int:
        return math.prod(len(v) for v in self.sweep.values())

    @property
    def digest(self) -> str:
        """What the rows depend on (kind, base, sweep), hashed: a rerun with the same digest resumes."""
        key = json.dumps({"kind": self.kind, "base": self.base, "sweep": self.sweep}, sort_keys=True, default=str)
        return hashlib.sha256(key.encode()).hexdigest()[:16]

    def reduced(self, per_axis: int = 2) -> "Scenario":
        """The same scenario with each axis cut to its first and last values (for quick runs and tests)."""
        cut = {k: (v if len(v) <= per_axis else [v[0], v[-1]]) for k, v in self.sweep.items()}
        return replace(self, sweep=cut)


# ---------------------------------------------------------------------------------------
# parsing and validation
# ---------------------------------------------------------------------------------------

def _line_of(text: str, table: str | None, key: str) -> int:
    """1-based line where `key = ...` is written inside [table] (or at top level when table is None)."""
    current = None
    for number, line in enumerate(text.splitlines(), 1):
        header = re.match(r"\s*\[([^\]]+)\]\s*(#.*)?$", line)
        if header:
            current = header.group(1).strip()
        elif current == table and re.match(rf"\s*{re.escape(key)}\s*=", line):
            return number
    return 0


def _fail(path: str, text: str, table: str | None, key: str, message: str) -> UserError:
    line = _line_of(text, table, key)
    where = f"{path} line {line}" if line else path
    name = f"[{table}] key '{key}'" if table else f"key '{key}'"
    return UserError(f"{where}: {name} {message}.")


def _folded(value: Any) -> Any:
    """A choice's name in lower case (names are case-insensitive, as on the command line); others as given."""
    return value.lower() if isinstance(value, str) else value


def _check_value(path: str, text: str, table: str, key: str, value: Any) -> None:
    ok = isinstance(value, TYPES[key]) and not isinstance(value, bool)
    if not ok:
        kinds = " or ".join(t.__name__ for t in TYPES[key])
        raise _fail(path, text, table, key, f"= {value!r} should be {kinds}")
    if key in CHOICES and value not in CHOICES[key]:
        raise _fail(path, text, table, key, f"= {value!r} is not one of {', '.join(CHOICES[key])}")
    why = limits.problem(key, value) if key in limits.LIMITS else None
    if why:  # NaN and inf too: TOML has nan / inf literals
        raise _fail(path, text, table, key, f"= {value!r} {why}")


def _check_table(path: str, text: str, table: str, data: dict[str, Any], axis: bool) -> None:
    for key, value in data.items():
        if key not in TYPES:
            raise _fail(path, text, table, key, f"is unknown (known: {', '.join(TYPES)})")
        values = value if axis else [value]
        if axis and (not isinstance(value, list) or not value):
            raise _fail(path, text, table, key, "must be a non-empty list of values")
        for v in values:
            _check_value(path, text, table, key, v)


def _one_of(names: dict[str, str]) -> Callable[[str], None]:
    def check(name: str) -> None:
        if name != "none" and name not in names:
            raise UserError(f"known: none, {', '.join(names)}")
    return check


def _check_names(path: str, text: str, sc_base: dict[str, Any], sweep: dict[str, list[Any]]) -> None:
    """Unknown model, hardware or fusion names fail here, before any work and any output file."""
    from simulator.config import load_model
    from simulator.hardware import load_hardware
    from simulator.plans.specialized import FUSIONS, WHAT_IF_FUSIONS
    checks: dict[str, Callable[[str], Any]] = {
        "model": load_model, "drafter": load_model, "hardware": load_hardware,
        "fusion_off": _one_of(FUSIONS), "fusion_on": _one_of(WHAT_IF_FUSIONS),
    }
    for key, check in checks.items():
        table = "sweep" if key in sweep else "base"
        for value in sweep.get(key, [sc_base.get(key, DEFAULTS[key])]):
            try:
                check(value)
            except UserError as exc:
                raise _fail(path, text, table, key, f"= {value!r} cannot be used ({exc})") from None
    gpus = sweep.get("hardware", [sc_base.get("hardware", DEFAULTS["hardware"])])
    table = "sweep" if "kernels" in sweep else "base"
    for value in sweep.get("kernels", [sc_base.get("kernels")]):
        problems = []
        for gpu in gpus:  # a set some GPUs of the grid lack leaves their points skipped, one no GPU has is a typo
            try:
                load_hardware(gpu, value)
            except UserError as exc:
                problems.append(str(exc))
        if value is not None and len(problems) == len(gpus):
            raise _fail(path, text, table, "kernels", f"= {value!r} cannot be used ({problems[0]})")


def list_scenarios() -> list[str]:
    return sorted(p.stem for p in SCENARIOS_DIR.glob("*.toml"))


def scenario_path(name_or_path: str | Path) -> Path:
    """A scenario file: a path, or a shipped scenario by name (`batch-sweep`, `scenarios/batch-sweep.toml`)."""
    p = Path(name_or_path)
    if p.exists() or p.parent.name not in ("", "scenarios"):
        return p
    if p.stem in list_scenarios() and p.suffix in ("", ".toml"):
        return SCENARIOS_DIR / f"{p.stem}.toml"
    raise UserError(f"scenario '{name_or_path}' is not a file and not one of {', '.join(list_scenarios())}.")


def load_scenario(path: str | Path) -> Scenario:
    p = scenario_path(path)
    try:
        text = p.read_text(encoding="utf-8")
        raw = tomllib.loads(text)
    except FileNotFoundError:
        raise UserError(f"scenario file {p} does not exist.") from None
    except IsADirectoryError:
        raise UserError(f"scenario {p} is a folder: name one TOML file in it (see `moe-sim list scenarios`).") from None
    except OSError as exc:
        raise UserError(f"scenario file {p} cannot be read ({exc.strerror}).") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"{p}: not valid TOML ({exc}).") from None
    for key, value in raw.items():
        if key not in TOP_KEYS:
            raise _fail(str(p), text, None, key, f"is unknown (known: {', '.join(TOP_KEYS)})")
        if not isinstance(value, TOP_KEYS[key]):
            raise _fail(str(p), text, None, key, f"should be a {TOP_KEYS[key].__name__}")
    if not raw.get("question", "").strip():
        raise UserError(f"{p}: key 'question' is missing: a scenario states the question it answers.")
    kind = _folded(raw.get("kind", "step"))
    if kind not in KINDS:
        raise _fail(str(p), text, None, "kind", f"= {kind!r} is not one of {', '.join(KINDS)}")
    base, sweep, outputs = raw.get("base", {}), raw.get("sweep", {}), raw.get("outputs", {})
    base = {k: _folded(v) if k in CHOICES else v for k, v in base.items()}
    sweep = {k: [_folded(x) for x in v] if k in CHOICES and isinstance(v, list) else v for k, v in sweep.items()}
    _check_table(str(p), text, "base", base, axis=False)
    _check_table(str(p), text, "sweep", sweep, axis=True)
    _check_outputs(str(p), text, kind, outputs, sweep)
    _check_names(str(p), text, base, sweep)
    return Scenario(p.stem, str(p), raw["question"].strip(), kind, DEFAULTS | base, sweep, outputs)


def _check_outputs(path: str, text: str, kind: str, outputs: dict[str, Any], sweep: dict[str, Any]) -> None:
    for key, value in outputs.items():
        if key not in OUTPUT_KEYS:
            raise _fail(path, text, "outputs", key, f"is unknown (known: {', '.join(OUTPUT_KEYS)})")
        if not isinstance(value, OUTPUT_KEYS[key]):
            raise _fail(path, text, "outputs", key, f"should be a {OUTPUT_KEYS[key].__name__}")
    for plot in outputs.get("plots", []):
        if plot not in PLOTS[kind]:
            raise _fail(path, text, "outputs", "plots", f"names '{plot}', not a {kind} plot ({', '.join(PLOTS[kind])})")
    for key in ("x", "group"):
        if key in outputs and outputs[key] not in sweep:
            raise _fail(path, text, "outputs", key, f"= {outputs[key]!r} is not a [sweep] axis")
    if "y" in outputs and outputs["y"] not in Y_COLUMNS[kind]:
        raise _fail(path, text, "outputs", "y",
                    f"= {outputs['y']!r} is not a {kind} column ({', '.join(Y_COLUMNS[kind])})")


# ---------------------------------------------------------------------------------------
# a point's objects (shared by the sweep and the scenario pictures)
# ---------------------------------------------------------------------------------------

@lru_cache(maxsize=64)
def point_model(name: str, precision: str | None) -> "ModelConfig":
    """The point's model, its routed experts in `precision` when one is given."""
    from simulator.config import load_model
    cfg = load_model(name)
    return replace(cfg, expert_dtype=precision) if precision else cfg


@lru_cache(maxsize=64)
def point_hardware(name: str, kernels: str | None = None) -> "HardwareProfile":
    from simulator.hardware import load_hardware
    return load_hardware(name, kernels)


def fusion_set(disable: list[str] | None = None, enable: list[str] | None = None) -> frozenset[str]:
    """The specialized plan's fusions with some turned off and what-ifs turned on (the flags and a scenario's
    points); a name that would change nothing (already on, already off, both on and off) is refused rather than
    silently ignored."""
    from simulator.plans.specialized import FUSIONS, WHAT_IF_FUSIONS, resolve_fusions
    base = resolve_fusions(None, disable or ())
    on = resolve_fusions(base | set(enable or ()))
    for name in sorted(set(enable or ()) & set(disable or ())):
        raise UserError(f"--enable-fusion and --disable-fusion both name {name}: choose one.")
    for name in sorted(set(enable or ()) & set(FUSIONS)):
        takes = (f"a what-if fusion: {', '.join(WHAT_IF_FUSIONS)}" if WHAT_IF_FUSIONS
                 else "a what-if fusion, and there is none now")
        raise UserError(f"--enable-fusion {name} changes nothing: it is on by default (--enable-fusion takes {takes}).")
    for name in sorted(set(disable or ()) & set(WHAT_IF_FUSIONS)):
        raise UserError(f"--disable-fusion {name} changes nothing: it is off unless --enable-fusion turns it on.")
    return on


def point_fusions(point: dict[str, Any]) -> frozenset[str]:
    """The specialized plan's fusions at a point: one turned off, one what-if turned on, or none."""
    off = [] if point["fusion_off"] == "none" else [point["fusion_off"]]
    on = [] if point["fusion_on"] == "none" else [point["fusion_on"]]
    return fusion_set(off, on)
