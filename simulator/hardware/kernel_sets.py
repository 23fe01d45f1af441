"""Kernel sets: a GPU's measured kernel laws per implementation set, as data (laws/<gpu>.toml).

A set maps each kernel *role* (a dense GEMM, a W4A16 MoE, vLLM's split-V KDA recurrence, an all-reduce,
...) to the measured implementations that stand for it, and holds the fitted constants of each group's law.
The law itself, its terms and which kernel takes which role, is simulator/cost/laws.py; this module only
reads, checks and writes the constants. Every problem in a file is one UserError sentence.

    [sets.gpu-suite.laws."gemm/torch_matmul/long_k"]
    n = 47                                  points fitted
    terms = ["t0", "bytes", "flops", ...]    the law's regressors (cost/laws.py features)
    regimes = [[4.41, 2.6e-07, ...]]         µs per unit of each term; NCCL's two protocols: two regimes
"""

from __future__ import annotations

import functools
import math
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

from simulator.errors import UserError

LAWS_DIR = Path(__file__).resolve().parent / "laws"
DATASHEET = "datasheet"  # the set of no measured kernel: every kernel priced from the profile's constants
LAW_FAMILIES = ("ceiling", "gemm", "moe", "small", "kda", "mla", "gqa", "collective")


# Roofs: a law whose features include both sides of a pair takes the slower side, not their sum.
ROOFS = ((("bytes",), ("flops",)),  # a kernel's streaming against its math
         (("bytes",), ("rounds",)),  # ... or against the round trips of the loads its programs keep in flight
         # KDA: own work against HBM
         (("serial", "state_bytes", "token_state_bytes"), ("drain_bytes", "drain_state_bytes")),
         (("tile_steps",), ("cache_bytes",)),  # MLA: the grid's tile steps against streaming the cache
         (("tile_bytes",), ("cache_bytes",)),  # FA3: each program's stream of key blocks against HBM's
         (("bytes",), ("program_bytes", "program_rows")),  # matmul_ogs: HBM against each wave of programs
         (("chain_t0", "sources"), ("stream_t0", "stream_bytes")))  # AttnRes: its chain of source reads, streaming


# Terms every law of a family carries beside its own (cost/laws.py features): a table fitted before a term existed
# is refused rather than read as covering no kernel.
FAMILY_TERMS = {"small": ("bytes", "extra_launches", "experts", "aligned_rows", "sources", "token_steps")}


def roof_of(names: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """The pair of roofs a law with these features takes the max of (at most one pair applies)."""
    found = [r for r in ROOFS if all(any(n in names for n in side) for side in r)]
    return found[0] if found else None


def evaluate(names: tuple[str, ...], coef: tuple[float, ...], feats: Mapping[str, float]) -> float:
    """t = max(one roof's terms, the other's) + every other term (ROOFS)."""
    terms = {n: c * feats.get(n, 0.0) for n, c in zip(names, coef)}
    roof = roof_of(names)
    if roof is None:
        return sum(terms.values())
    sides = [sum(terms.pop(n, 0.0) for n in side) for side in roof]
    return max(sides) + sum(terms.values())


@dataclass(frozen=True)
class Fit:
    """Constants of one group's law: a coefficient per regressor (µs per unit) for each regime. A law
    with two regimes (NCCL's small- and large-message protocols) predicts the cheaper one."""

    names: tuple[str, ...]
    regimes: tuple[tuple[float, ...], ...]
    n: int

    def predict(self, feats: Mapping[str, float]) -> float:
        return min(evaluate(self.names, coef, feats) for coef in self.regimes)

    def covers(self, feats: Mapping[str, float]) -> bool:
        """Every regressor the kernel has is one this law fitted (a small kernel needs its own floor)."""
        return all(n in self.names for n, v in feats.items() if v)

    def constants(self) -> dict[str, float | None]:
        """Physical reading: t0 µs, bw GB/s, R TFLOP/s, beta GB/s, other terms in µs per unit."""
        out: dict[str, float | None] = {}
        for i, coef in enumerate(self.regimes):
            tag = "" if len(self.regimes) == 1 else f"_regime{i + 1}"
            for name, c in zip(self.names, coef):
                if name.endswith("bytes"):
                    out[f"{name}_gbps{tag}"] = 1e-3 / c if c > 0 else None
                elif name == "flops":
                    out[f"tflops{tag}"] = 1e-6 / c if c > 0 else None
                else:
                    out[f"{name}_us{tag}"] = c
        return out


# The roles a set maps to measured implementations, and what a kernel must be to take one.
ROLES = ("gemm", "gemm.bias", "moe.mxfp4", "moe.bf16", "moe.fp8", "kda.split_v", "kda.per_head", "mla", "gqa", "small",
         "all_reduce", "reduce_scatter", "all_gather")
# Ranges every fitted constant must lie in, by the unit of its regressor: a byte term between 1 GB/s and
# 20 TB/s (above any H200 HBM or L2 rate: written bytes may land in L2), a FLOP term between 1 TFLOP/s
# and 2.5 PFLOP/s (above H200's 1,979 dense FP8), a latency term up to 200 µs per unit; 0 = term unused.
UNIT_RANGES = {"us/B": (1e6 / 20e12, 1e6 / 1e9), "us/FLOP": (1e6 / 2.5e18, 1e6 / 1e12), "us": (0.0, 200.0)}


def unit_of(name: str) -> str:
    return "us/B" if name.endswith("bytes") else "us/FLOP" if name == "flops" else "us"


@dataclass(frozen=True)
class KernelSet:
    """One implementation set of one GPU: the measured implementation(s) of each role, the ranks its
    collectives were measured at, and the fitted law of each group."""

    name: str
    description: str
    source: str
    impls: tuple[tuple[str, tuple[str, ...]], ...]
    ranks: tuple[int, ...]
    fits: tuple[tuple[str, Fit], ...]
    pdl: bool = True  # its kernels support programmatic dependent launch (and so a plan's prefetch before the wait)
    unmapped: tuple[str, ...] = ()  # implementations measured and fitted that stand for no role of the plans
    # per family: (log(measured / law) on the fitted half, widened and sorted; on the held-back half): what the
    # intervals of an answer priced with this set draw from (cost/uncertainty.py)
    residuals: tuple[tuple[str, tuple[float, ...], tuple[float, ...]], ...] = ()

    @functools.cached_property
    def _fits(self) -> dict[str, Fit]:
        return dict(self.fits)

    @functools.cached_property
    def _impls(self) -> dict[str, tuple[str, ...]]:
        return dict(self.impls)

    def fit(self, group: str) -> Fit | None:
        return self._fits.get(group)

    def impls_of(self, role: str) -> tuple[str, ...]:
        return self._impls.get(role, ())

    @property
    def role_impls(self) -> Mapping[str, tuple[str, ...]]:
        """role -> the implementations that stand for it (what the engine launches around a kernel: cost/laws.py)."""
        return self._impls

    def check_terms(self, where: str) -> None:
        """Refuse a set whose law lacks a term its family's law now has (FAMILY_TERMS): fitted before the term
        existed, it would leave the kernels that need the term to the datasheet law, silently. Checked when a set
        is chosen to price with, so that `validate --fit` can still rewrite a stale table."""
        for group, fit in self.fits:
            missing = [t for t in FAMILY_TERMS.get(group.split("/")[0], ()) if t not in fit.names]
            if missing:
                raise UserError(f"Kernel laws {where}, set {self.name!r}, law {group!r}: lacks the term(s) "
                                f"{', '.join(missing)} of the {group.split('/')[0]} law (cost/laws.py); refit it "
                                "with moe-sim validate --measurements <its folder> --fit.")


# ---------------------------------------------------------------------------------------------------
# the table file
# ---------------------------------------------------------------------------------------------------

def laws_path(gpu: str) -> Path:
    return LAWS_DIR / f"{gpu.lower()}.toml"


def load_sets(path: Path) -> tuple[str, dict[str, KernelSet]]:
    """(default set name, {name: KernelSet}) of a laws file; every problem is one UserError sentence."""
    where = path.name
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"Kernel laws {where} is not valid TOML ({exc}).") from None
    sets = data.get("sets")
    if not isinstance(sets, dict) or not sets:
        raise UserError(f"Kernel laws {where}: no [sets.NAME] table.")
    default = data.get("default")
    if default not in sets and default != DATASHEET:
        raise UserError(f"Kernel laws {where}: default = {default!r} names no set "
                        f"(sets: {', '.join(sets)}, or {DATASHEET}).")
    return default, {name: parse_set(name, body, where) for name, body in sets.items()}


def parse_set(name: str, body: Any, where: str) -> KernelSet:
    at = f"Kernel laws {where}, set {name!r}"
    if not isinstance(body, dict):
        raise UserError(f"{at}: must be a table.")
    for key in ("description", "source"):
        if not isinstance(body.get(key), str) or not body[key].strip():
            raise UserError(f"{at}: {key!r} must be a non-empty string.")
    impls = body.get("impls")
    if not isinstance(impls, dict) or not impls:
        raise UserError(f"{at}: needs an [impls] table of role = [implementations].")
    for role, names in impls.items():
        if role not in ROLES:
            raise UserError(f"{at}: unknown role {role!r} in [impls] (known: {', '.join(ROLES)}).")
        if not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names):
            raise UserError(f"{at}: impls.{role} must be a list of implementation names.")
    if not isinstance(body.get("pdl"), bool):
        raise UserError(f"{at}: 'pdl' must be true or false (do its kernels support programmatic dependent launch?).")
    ranks = body.get("ranks", [])
    if not isinstance(ranks, list) or not all(isinstance(r, int) and r > 1 for r in ranks):
        raise UserError(f"{at}: 'ranks' must list the rank counts its collectives were measured at.")
    unmapped = body.get("unmapped", [])
    if not isinstance(unmapped, list) or not all(isinstance(n, str) and n for n in unmapped):
        raise UserError(f"{at}: 'unmapped' must list implementation names.")
    measured = {n for names in impls.values() for n in names} | set(unmapped)
    laws = body.get("laws")
    if not isinstance(laws, dict) or not laws:
        raise UserError(f"{at}: needs [laws.GROUP] tables.")
    fits = tuple((group, _parse_fit(group, law, measured, f"{at}, law {group!r}")) for group, law in laws.items())
    residuals = body.get("residuals", {})
    ok = isinstance(residuals, dict) and all(
        isinstance(r, dict) and set(r) == {"fitted", "held_back"} and all(
            isinstance(v, list) and all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
                                        for x in v) for v in r.values()) for r in residuals.values())
    if not ok or not set(residuals) <= set(LAW_FAMILIES):
        raise UserError(f"{at}: [residuals.FAMILY] tables need fitted = [...] and held_back = [...] of finite numbers.")
    res = tuple((f, tuple(float(x) for x in r["fitted"]), tuple(float(x) for x in r["held_back"]))
                for f, r in residuals.items())
    return KernelSet(name, body["description"], body["source"],
                     tuple((r, tuple(n)) for r, n in impls.items()), tuple(ranks), fits, body["pdl"], tuple(unmapped),
                     res)


def _parse_fit(group: str, law: Any, measured: set[str], at: str) -> Fit:
    parts = group.split("/")
    if parts[0] not in LAW_FAMILIES:
        raise UserError(f"{at}: unknown family {parts[0]!r} (known: {', '.join(LAW_FAMILIES)}).")
    if len(parts) > 1 and parts[1] not in measured:
        raise UserError(f"{at}: implementation {parts[1]!r} is not in the set's [impls] nor its unmapped list.")
    if not isinstance(law, dict) or not isinstance(law.get("n"), int) or not isinstance(law.get("terms"), list):
        raise UserError(f"{at}: needs n = points fitted and terms = [names].")
    names = tuple(law["terms"])
    regimes = law.get("regimes")
    if not isinstance(regimes, list) or not regimes:
        raise UserError(f"{at}: needs regimes = [[constants], ...].")
    for coef in regimes:
        if not isinstance(coef, list) or len(coef) != len(names):
            raise UserError(f"{at}: each regime needs one constant per term ({len(names)}).")
        for n, c in zip(names, coef):
            if isinstance(c, bool) or not isinstance(c, (int, float)) or not math.isfinite(c):
                raise UserError(f"{at}: constant {n!r} must be a finite number.")
            lo, hi = UNIT_RANGES[unit_of(n)]
            if c != 0 and not lo <= c <= hi:
                raise UserError(f"{at}: constant {n!r} = {c} {unit_of(n)} lies outside its range [{lo:g}, {hi:g}].")
    return Fit(names, tuple(tuple(float(c) for c in coef) for coef in regimes), law["n"])


def dump_sets(hardware: str, default: str, sets: Iterable[KernelSet]) -> str:
    """The laws file's text (constants at full precision: the committed file must equal the fit)."""
    lines = [f"# Kernel laws of the {hardware}: written by `moe-sim validate --fit`; edit the CSVs or the law,",
             "# not this file. Each law's terms are regressors of simulator/cost/laws.py (features); each",
             "# constant is µs per unit of its term (us, us/B, us/FLOP) inside kernel_sets.UNIT_RANGES.", "",
             f'hardware = "{hardware}"', f'default = "{default}"']
    for s in sets:
        lines += ["", f'[sets.{s.name}]', f"description = {_q(s.description)}", f"source = {_q(s.source)}",
                  f"pdl = {str(s.pdl).lower()}", f"ranks = {list(s.ranks)}",
                  f"unmapped = [{', '.join(_q(n) for n in s.unmapped)}]", "", f"[sets.{s.name}.impls]"]
        lines += [f'"{role}" = [{", ".join(_q(n) for n in names)}]' for role, names in s.impls]
        for group, fit in s.fits:
            lines += ["", f'[sets.{s.name}.laws."{group}"]', f"n = {fit.n}",
                      f"terms = [{', '.join(_q(n) for n in fit.names)}]",
                      "regimes = [" + ", ".join("[" + ", ".join(repr(float(c)) for c in coef) + "]"
                                               for coef in fit.regimes) + "]"]
        for fam, fitted, held in s.residuals:
            lines += ["", f"[sets.{s.name}.residuals.{fam}]", f"fitted = [{', '.join(repr(x) for x in fitted)}]",
                      f"held_back = [{', '.join(repr(x) for x in held)}]"]
    return "\n".join(lines) + "\n"


def _q(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
