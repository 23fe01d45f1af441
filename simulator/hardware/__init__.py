"""GPU hardware profiles: one TOML data file per GPU, every constant with its unit and source.

A profile file holds one table per constant:

    hbm_bandwidth = { value = 8.0e12, unit = "B/s", source = "NVIDIA 'Inside Blackwell Ultra' blog" }

A *fitted* constant also says what it was fitted to and the sourced range it must stay inside; it is
written as a table of its own after the plain constants:

    [launch_gap_us]
    value = 1.62
    unit = "us"
    source = "H200 read chain, sources.md §3.1"
    fitted_to = "t0(no PDL) - t0(PDL) = 2.06 - 0.44 us"
    range = [1.3, 2.1]
    range_source = "Hazy Research 1.3 us bubble per boundary (H100); H200 run t0 = 2.06 us"

A GPU without FP4 tensor cores writes `fp4_flops = { runs_as = "bf16", unit = "FLOP/s", source = "..." }`
and FP4 math is priced at that format's rate. A user adds a GPU by writing one such file and passing its
path wherever a hardware name is accepted. Every problem becomes one `UserError` sentence naming the
file and the key.

Units: B bytes, B/s bytes per second, FLOP/s dense (non-sparse) operations per second, us microseconds,
fraction in (0, 1]. Bus bandwidths (`beta_*`) follow the nccl-tests busbw convention.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

from simulator.errors import UserError
from simulator.hardware.kernel_sets import DATASHEET, laws_path, load_sets

PROFILES_DIR = Path(__file__).resolve().parent
MATH_FORMATS = ("fp4", "fp8", "bf16", "fp32")
RUNS_AS = ("fp8", "bf16")  # what FP4 math may fall back to on a GPU without FP4 tensor cores


@dataclass(frozen=True, slots=True)
class Fit:
    """A fitted constant: what it was fitted to and the sourced range it must lie in."""

    fitted_to: str
    low: float
    high: float
    range_source: str


@dataclass(frozen=True, slots=True)
class HardwareProfile:
    """One GPU as the cost model sees it. Field comments give units; sources live in `sources`."""

    name: str
    description: str
    hbm_capacity: float  # B
    hbm_bandwidth: float  # B/s, datasheet peak
    fp4_flops: float  # FLOP/s dense; the `fp4_runs_as` format's rate when FP4 is not native
    fp8_flops: float  # FLOP/s dense
    bf16_flops: float  # FLOP/s dense
    fp32_flops: float  # FLOP/s, CUDA-core (non-tensor) FP32
    sm_count: int
    l2_bytes: float  # B
    nvlink_bandwidth: float  # B/s per direction per GPU
    nvlink_domain: int  # GPUs that share one NVLink fabric
    launch_gap_us: float  # idle time at a kernel boundary in CUDA-graph replay, no PDL
    launch_gap_pdl_us: float  # same, kernel launched with PDL that has independent work (weights) to start on
    pdl_dependent_hidden_us: float  # what PDL hides of the gap for a kernel whose every input is its predecessor's
    kernel_fixed_us: float  # per-kernel cost PDL cannot hide (first-byte latency, tail): a streaming kernel's floor
    floor_reduction_us: float  # the same for a row reduction (RMSNorm and its fusions)
    floor_topk_us: float  # the same for a routing top-k (sigmoid + bias + top-k over the experts)
    floor_finalize_us: float  # the same for the MoE finalize (gather k slots, weighted sum)
    floor_attention_us: float  # the same for a split-KV attention decode, its combine pass included
    gemm_fixed_us: float  # extra fixed cost of a tensor-core GEMM (tile setup, split-K reduce)
    hbm_efficiency: float  # asymptotic fraction of peak HBM bandwidth, streaming kernel
    moe_expert_us: float  # per touched expert of a grouped MoE GEMM (one group of tiles to schedule)
    compute_efficiency: float  # fraction of the dense tensor-core peak a compute-bound GEMM reaches
    alpha_one_shot_us: float  # latency of a one-shot all-reduce
    alpha_in_kernel_us: float  # latency of an exchange done inside a computing kernel (symmetric-memory flags)
    cta_bandwidth: float  # B/s one CTA streams on its own (latency-bound: bytes in flight / DRAM latency)
    serial_step_us: float  # one dependent step of a recurrence (a KDA token) per wave of CTAs
    alpha_two_shot_us: float  # latency of a two-shot (reduce-scatter + all-gather) all-reduce
    alpha_ring_us: float  # ring all-reduce base latency
    alpha_ring_step_us: float  # ring all-reduce latency per step (2(P-1) steps)
    beta_one_shot: float  # B/s effective bus bandwidth per GPU
    beta_two_shot: float  # B/s
    beta_ring: float  # B/s
    alpha_nvls_us: float  # latency of an NVLink SHARP (multimem) all-reduce, quoted at P = 8
    beta_nvls: float  # B/s of the payload through the switch, each direction
    alpha_growth_per_doubling: float  # fraction an alpha grows per doubling of ranks (P = 8 reference)
    fp4_runs_as: str = "fp4"  # "fp4" where native, else "bf16" or "fp8"
    kernels: str = DATASHEET  # the implementation set an answer prices (kernel_sets.py); "datasheet": none measured
    kernel_set: Any = None  # that set's measured laws (a kernel_sets.KernelSet), None for the datasheet law
    sources: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)
    fits: Mapping[str, Fit] = field(default_factory=dict, compare=False, repr=False)

    def floor_us(self, family: str) -> float:
        """The unhidable latency of a kernel of one floor family ("" = a streaming kernel)."""
        return self.kernel_fixed_us if not family else float(getattr(self, f"floor_{family}_us"))

    def peak_flops(self, math: str) -> float:
        """Dense tensor-core (or, for fp32, CUDA-core) FLOP/s of one math format."""
        if math not in MATH_FORMATS:
            raise ValueError(f"unknown math format {math!r}; expected one of {MATH_FORMATS}")
        return float(getattr(self, f"{math}_flops"))

    @property
    def critical_intensity(self) -> float:
        """FLOP per byte above which a bf16 kernel turns compute-bound (H200: 989e12 / 4.8e12 = 206)."""
        return self.bf16_flops / self.hbm_bandwidth


# key -> expected unit; the loader reads exactly these keys (plus name and description).
UNITS: dict[str, str] = {
    "hbm_capacity": "B", "hbm_bandwidth": "B/s",
    "fp4_flops": "FLOP/s", "fp8_flops": "FLOP/s", "bf16_flops": "FLOP/s", "fp32_flops": "FLOP/s",
    "sm_count": "count", "l2_bytes": "B", "nvlink_bandwidth": "B/s", "nvlink_domain": "GPUs",
    "launch_gap_us": "us", "launch_gap_pdl_us": "us", "pdl_dependent_hidden_us": "us", "kernel_fixed_us": "us",
    "gemm_fixed_us": "us",
    "floor_reduction_us": "us", "floor_topk_us": "us", "floor_finalize_us": "us", "floor_attention_us": "us",
    "hbm_efficiency": "fraction", "moe_expert_us": "us", "compute_efficiency": "fraction",
    "alpha_one_shot_us": "us", "alpha_in_kernel_us": "us", "cta_bandwidth": "B/s", "serial_step_us": "us",
    "alpha_two_shot_us": "us", "alpha_ring_us": "us", "alpha_ring_step_us": "us",
    "beta_one_shot": "B/s", "beta_two_shot": "B/s", "beta_ring": "B/s",
    "alpha_nvls_us": "us", "beta_nvls": "B/s", "alpha_growth_per_doubling": "fraction",
}
INTEGER_KEYS = ("sm_count", "nvlink_domain")
ENTRY_KEYS = {"value", "unit", "source", "fitted_to", "range", "range_source", "runs_as"}


def list_hardware() -> tuple[str, ...]:
    """Names of the bundled profiles (file stems), sorted."""
    return tuple(sorted(p.stem for p in PROFILES_DIR.glob("*.toml")))


def load_hardware(name_or_path: str | Path, kernels: str | None = None) -> HardwareProfile:
    """A bundled profile by name (case-insensitive, e.g. "gb300") or a user's TOML file by path, pricing with
    the kernel set `kernels` (case-insensitive; None: the GPU's default set, the best-measured one)."""
    text = str(name_or_path)
    path = Path(text)
    if not (text.endswith(".toml") or path.is_file()):
        path = PROFILES_DIR / f"{text.lower()}.toml"
        if not path.is_file():
            names = ", ".join(list_hardware())
            raise UserError(f"Unknown hardware {text!r}; choose one of {names} or give a path to a .toml file.")
    hw = _parse(_read_toml(path), path.name)
    return _with_kernels(hw, measured_sets(path.stem if path.parent == PROFILES_DIR else None), kernels)


def measured_sets(stem: str | None) -> tuple[str, dict[str, Any]]:
    """(default set, {name: KernelSet}) measured for a bundled GPU; ("datasheet", {}) where none is."""
    path = laws_path(stem) if stem else None
    return load_sets(path) if path is not None and path.is_file() else (DATASHEET, {})


def _with_kernels(hw: HardwareProfile, found: tuple[str, dict[str, Any]], kernels: str | None) -> HardwareProfile:
    default, sets = found
    name = default if kernels is None else kernels.lower()
    if name == DATASHEET:
        return replace(hw, kernels=DATASHEET, kernel_set=None)
    if name not in sets:
        known = ", ".join(sorted(sets) + [DATASHEET])
        raise UserError(f"Unknown kernel set {kernels!r} for {hw.name}; choose one of {known}.")
    sets[name].check_terms(f"{hw.name.lower()}.toml")
    return replace(hw, kernels=name, kernel_set=sets[name])


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"Hardware profile {path} does not exist.") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"Hardware profile {path} is not valid TOML ({exc}).") from None


def _parse(data: dict[str, Any], where: str) -> HardwareProfile:
    unknown = sorted(set(data) - set(UNITS) - {"name", "description"})
    if unknown:
        raise UserError(f"Hardware profile {where}: unknown key {unknown[0]!r} (typo?).")
    values: dict[str, Any] = {k: _text(data, k, where) for k in ("name", "description")}
    sources: dict[str, str] = {}
    fits: dict[str, Fit] = {}
    for key in UNITS:
        if key != "fp4_flops":
            values[key], sources[key], fit = _constant(data, key, where)
            if fit:
                fits[key] = fit
    values["fp4_flops"], values["fp4_runs_as"], sources["fp4_flops"] = _fp4(data, values, where)
    _check_physics(values, where)
    return HardwareProfile(**values, sources=MappingProxyType(sources), fits=MappingProxyType(fits))


def _text(data: dict[str, Any], key: str, where: str) -> str:
    value = data.get(key)
    if not isinstance(value, str) or not value.strip():
        raise UserError(f"Hardware profile {where}: {key!r} must be a non-empty string.")
    return value


def _entry(data: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    entry = data.get(key)
    if entry is None:
        raise UserError(f"Hardware profile {where}: {key!r} is missing.")
    if not isinstance(entry, dict):
        raise UserError(f"Hardware profile {where}: {key!r} must be a table {{ value, unit, source }}.")
    extra = sorted(set(entry) - ENTRY_KEYS)
    if extra:
        raise UserError(f"Hardware profile {where}: {key!r} has unknown field {extra[0]!r}.")
    if entry.get("unit") != UNITS[key]:
        raise UserError(f"Hardware profile {where}: {key!r} must have unit = {UNITS[key]!r}.")
    if not isinstance(entry.get("source"), str) or not entry["source"].strip():
        raise UserError(f"Hardware profile {where}: {key!r} needs a non-empty source.")
    return entry


def _constant(data: dict[str, Any], key: str, where: str) -> tuple[float | int, str, Fit | None]:
    """(value, source, fit) of one constant, checked for type, sign and its fitted range."""
    entry = _entry(data, key, where)
    value = entry.get("value")
    wanted = int if key in INTEGER_KEYS else (int, float)
    if isinstance(value, bool) or not isinstance(value, wanted):
        kind = "an integer" if key in INTEGER_KEYS else "a number"
        raise UserError(f"Hardware profile {where}: {key!r} value must be {kind}.")
    if not math.isfinite(value):  # TOML has nan and inf literals
        raise UserError(f"Hardware profile {where}: {key!r} value = {value} must be a finite number.")
    if value < 0 or (value == 0 and not key.startswith("launch_gap")):
        raise UserError(f"Hardware profile {where}: {key!r} value = {value} must be positive.")
    fit = _fit(entry, key, where)
    if fit and not fit.low <= value <= fit.high:
        raise UserError(f"Hardware profile {where}: fitted {key!r} = {value} lies outside its range "
                        f"[{fit.low}, {fit.high}].")
    return (value if key in INTEGER_KEYS else float(value)), entry["source"], fit


def _fit(entry: dict[str, Any], key: str, where: str) -> Fit | None:
    if not {"fitted_to", "range", "range_source"} & set(entry):
        return None
    bounds = entry.get("range")
    ok = isinstance(bounds, list) and len(bounds) == 2 and all(
        isinstance(b, (int, float)) and not isinstance(b, bool) and math.isfinite(b) for b in bounds)
    texts = all(isinstance(entry.get(k), str) and entry[k].strip() for k in ("fitted_to", "range_source"))
    if not ok or not texts or bounds[0] > bounds[1]:
        raise UserError(f"Hardware profile {where}: fitted {key!r} needs fitted_to, range = [low, high] "
                        "and range_source.")
    return Fit(entry["fitted_to"], float(bounds[0]), float(bounds[1]), entry["range_source"])


def _fp4(data: dict[str, Any], values: dict[str, Any], where: str) -> tuple[float, str, str]:
    """FP4 rate: native (a value) or `runs_as` another format's rate (Hopper has no FP4 tensor cores)."""
    entry = _entry(data, "fp4_flops", where)
    if "runs_as" not in entry:
        value, source, _ = _constant(data, "fp4_flops", where)
        return float(value), "fp4", source
    if entry["runs_as"] not in RUNS_AS or "value" in entry:
        raise UserError(f"Hardware profile {where}: 'fp4_flops' runs_as must be one of {RUNS_AS} "
                        "and then carries no value.")
    fmt = entry["runs_as"]
    return values[f"{fmt}_flops"], fmt, entry["source"]


def _check_physics(values: dict[str, Any], where: str) -> None:
    """Cross-field sanity: efficiencies are fractions and no bus bandwidth beats the NVLink link."""
    for key in ("hbm_efficiency", "compute_efficiency"):
        if values[key] > 1.0:
            raise UserError(f"Hardware profile {where}: {key!r} is a fraction and must be <= 1.")
    for key in ("beta_one_shot", "beta_two_shot", "beta_ring"):
        if values[key] > values["nvlink_bandwidth"]:
            raise UserError(f"Hardware profile {where}: {key!r} exceeds 'nvlink_bandwidth'.")

