"""Every prediction with its uncertainty: seeded draws of the constants and the kernel-family errors,
each draw scheduled on the timeline again.

Three sources of error, each a parameter z ~ N(0, 1) before any conditioning:

- **Constants** with a sourced range in the hardware profile (`fitted_to`, `range`): value + z (high - low) / 4
  (a range read as +-2 sd about its value). Sampled once per draw and shared by every
  kernel that reads them (the launch gap moves all 2,000 boundaries of a step together). A constant
  without a range (datasheet bandwidths and FLOP rates) is taken as known.
- **Family factors**: one per kernel family (gemm, moe, small, kda, mla, collective), exp(Q(Phi(z))) with
  Q the quantiles of that family's H200 residuals log(measured / law) on the *fitted* half of
  `moe-sim validate`'s grids, each group's residuals widened by sqrt(n / (n - p)) (n points, p fitted
  constants: in-sample residuals understate out-of-sample ones). A kernel's work phases (fixed, bytes,
  math) take its family's factor, its collective phase the collective factor. Sampled once per draw
  per family: every kernel of a family moves together, which is wider than independent errors that
  would partly cancel over a layer (see docs/cost-model.md section 8 for why no per-kernel part).
  Other GPUs take the H200 residuals as the same *relative* spread.
- **Structure**: one factor per variant, log-normal with the RMS of the GB300 fit's residuals on the
  published figures as its sd: what no kernel-level parameter explains.

Constants with a range are drawn inside it (rejection). Where the profile's constants were fitted to the
published figures (GB300), the draws are conditioned on those figures instead: with J the Jacobian of
log(figure) in z (central differences at z = +-1) and R the squared RMS of the fit's residuals,

    proposal  N(J^T (J J^T + R)^-1 (log published - log model),  I - J^T (J J^T + R)^-1 J)
    weight    prior(z) x exp(-|log published - log figures(z)|^2 / 2R) / proposal(z)

(importance sampling: the linear-Gaussian update proposes, each draw's four figures priced exactly weigh).
Draws: Latin hypercube normal scores (seeded) times a square root of the covariance. Every draw prices each
kernel with `kernel_terms` on the drawn profile and runs the timeline again, so a draw that moves the
critical path (a collective outgrowing its overlapped GEMM) is scheduled as it would run.

    interval = [q_(1-L)/2, q_(1+L)/2] of the (weighted) draws       (L = 0.9 by default)

Dimension legend: N draws, K parameters, F published figures, n kernels of a plan.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field, replace
from functools import cached_property, lru_cache
from pathlib import Path
from statistics import NormalDist
from typing import Any, Callable, Mapping

import numpy as np
import numpy.typing as npt

from simulator.cost import lockstep
from simulator.cost.pricing import kernel_terms
from simulator.cost.layout import launch_layout, plan_scalars
from simulator.errors import UserError
from simulator.hardware import HardwareProfile
from simulator.memo import remember
from simulator.paths import data_dir
from simulator.plans import VARIANTS
from simulator.plans.kernel import FAMILIES, Kernel, Plan

Array = npt.NDArray[np.float64]
RESIDUALS_FILE = Path(__file__).with_name("residuals_h200.json")
DEFAULT_DRAWS = 400
DEFAULT_LEVEL = 0.9
DEFAULT_SEED = 0
_NORMAL = NormalDist()
# the standard normal's cdf and quantile elementwise on arrays, each element through NormalDist's own C code
# (the same bits as a Python loop over it, in a fraction of the time)
_NORMAL_CDF, _NORMAL_INV_CDF = np.frompyfunc(_NORMAL.cdf, 1, 1), np.frompyfunc(_NORMAL.inv_cdf, 1, 1)


# ---------------------------------------------------------------------------------------------------
# the family residuals (derived from moe-sim validate, cached in residuals_h200.json)
# ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Residuals:
    """log(measured / law) per family: the fitted half (widened, sorted) and the held-back half; and
    `machine_us`, how far one short kernel's time moves from one H200 to another (`machine_spread`)."""

    source: str
    fitted: Mapping[str, tuple[float, ...]]
    held_back: Mapping[str, tuple[float, ...]]
    machine_us: float = 0.0

    def quantile(self, family: str, p: Array) -> Array:
        """Q(p) of a family's widened fitted residuals (plotting positions (i + 0.5) / n)."""
        r = np.asarray(self.fitted[family])
        return np.interp(p, (np.arange(r.size) + 0.5) / r.size, r)

    def interval_pct(self, family: str, level: float = DEFAULT_LEVEL) -> tuple[float, float]:
        """The family's central `level` interval as % of the law: 100 (exp(Q) - 1) at the two tails."""
        lo, hi = self.quantile(family, np.array([(1 - level) / 2, (1 + level) / 2]))
        return 100 * math.expm1(float(lo)), 100 * math.expm1(float(hi))


SHORT_KERNEL_US = 10.0  # kernels this short: their machine-to-machine spread is absolute, not relative
REPEAT = ("h200/production", "h200/production/repeat")  # one grid on two fresh H200s (the shipped calibration/)


def machine_spread(first: str, again: str, level: float = DEFAULT_LEVEL) -> dict[str, Any]:
    """The `level` quantile of |again - first| (µs) over the short kernels (< SHORT_KERNEL_US) that both folders
    of the shipped calibration measured: the same kernel, the same shape, the same script, on two fresh
    machines. A trace taken on another H200 than the kernel rows moves each short kernel by about this much,
    whatever the law."""
    def medians(path: Path) -> dict[str, float]:  # a measurement CSV's ok rows; {} for any other CSV
        with path.open(newline="", encoding="utf-8") as f:
            rows = csv.DictReader(f)
            if not {"id", "median_us", "status"} <= set(rows.fieldnames or ()):
                return {}
            return {r["id"]: float(r["median_us"]) for r in rows if r["status"] == "ok"}
    moves = []
    root = data_dir("calibration")
    for path in sorted((root / again).glob("*.csv")):
        if (root / first / path.name).exists():
            a, b = medians(root / first / path.name), medians(path)
            moves += [abs(b[k] - a[k]) for k in a.keys() & b.keys() if a[k] < SHORT_KERNEL_US]
    if not moves:
        raise UserError(f"no short kernel is measured in both {first} and {again}.")
    return {"us": round(float(np.quantile(moves, level)), 4), "kernels": len(moves),
            "metric": f"q{level:.2f} of |median again - median first| over kernels under {SHORT_KERNEL_US:g} us",
            "folders": [f"calibration/{first}", f"calibration/{again}"]}


def derive_residuals(folder: str | Path, hw: HardwareProfile) -> dict[str, Any]:
    """The residuals of the measurements, exactly as `moe-sim validate` splits and refits them."""
    from simulator.cost import validate as v
    points, fits = v.fitted_points(folder, hw)
    fitted, held = v.family_residuals(points, fits)
    return {"source": f"moe-sim validate --measurements {folder} --hardware {hw.name.lower()}",
            "metric": "log(measured / refit law) per launch; fitted half widened by sqrt(n / (n - p)) per group",
            "fitted": fitted, "held_back": held}


def residuals_document(folder: str | Path, hw: HardwareProfile) -> dict[str, Any]:
    """What residuals_h200.json caches: the residuals and the machine spread from the grid measured twice
    (REPEAT, in a clone's calibration/; the installed package carries the cached file, not the repeat)."""
    return derive_residuals(folder, hw) | {"machine_spread": machine_spread(*REPEAT)}


def residuals_of(hw: HardwareProfile) -> Residuals:
    """The family residuals of the law `hw` prices with: its kernel set's own (written by validate --fit with
    its constants), and for a family the set did not measure (its kernels keep the datasheet law) or on a
    GPU with no set, the H200 gpu-suite laws' (residuals_h200.json: how well a law of the model's form
    predicts a kernel once its constants are known)."""
    base, kset = load_residuals(), hw.kernel_set
    if kset is None or not kset.residuals:
        return base
    fitted, held = dict(base.fitted), dict(base.held_back)
    fitted.update({f: fit for f, fit, _ in kset.residuals})
    held.update({f: h for f, _, h in kset.residuals})
    return Residuals(f"kernel set {kset.name} ({kset.source}); other families: {base.source}", fitted, held,
                     base.machine_us)


def residuals_from(doc: Mapping[str, Any]) -> Residuals:
    return Residuals(doc["source"], {f: tuple(r) for f, r in doc["fitted"].items()},
                     {f: tuple(r) for f, r in doc["held_back"].items()},
                     float(doc.get("machine_spread", {}).get("us", 0.0)))


@lru_cache(maxsize=1)
def load_residuals(path: Path = RESIDUALS_FILE) -> Residuals:
    return residuals_from(json.loads(path.read_text(encoding="utf-8")))


def coverage(res: Residuals, level: float = DEFAULT_LEVEL) -> dict[str, Any]:
    """Share of held-back points inside law x exp([q_lo, q_hi]) of their family's fitted residuals."""
    by_family, inside_all, n_all = {}, 0, 0
    for fam, held in res.held_back.items():
        if fam not in res.fitted:
            continue
        lo, hi = res.interval_pct(fam, level)
        inside = int(sum(lo <= 100 * math.expm1(r) <= hi for r in held))
        by_family[fam] = {"n": len(held), "covered": inside, "coverage": round(inside / len(held), 4),
                          "interval_pct": [round(lo, 2), round(hi, 2)]}
        inside_all, n_all = inside_all + inside, n_all + len(held)
    return {"level": level, "n": n_all, "coverage": round(inside_all / n_all, 4), "by_family": by_family,
            "method": "family residual quantiles from the fitted half of each grid, checked on the held-back half"}


def kernel_families(kernel: Kernel) -> tuple[str | None, str | None]:
    """(family of the work phases, family of the collective phase) of a plan kernel: its declared family,
    and "collective" for its exchange where it has one. A collective kernel's work (a top-k or a norm done
    after the exchange) takes no work factor: validate measures collectives as exchanges alone."""
    comm = "collective" if kernel.collective is not None else None
    return (None if kernel.family == "collective" else kernel.family), comm


# ---------------------------------------------------------------------------------------------------
# parameters and draws
# ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Parameter:
    """One uncertain quantity: a ranged constant of the profile, or a family's residual factor."""

    name: str
    kind: str  # "constant" | "family" | "structure" (a variant's whole-layer error, sd in `value`)
    value: float = 0.0  # constants: the profile's value
    low: float = 0.0
    high: float = 0.0
    bounded: bool = True  # draws stay inside [low, high]; False for a constant the draws are conditioned on

    @property
    def label(self) -> str:
        if self.kind == "structure":
            return f"{self.name} layer structure (published residuals)"
        return self.name if self.kind == "constant" else f"{self.name} kernels (H200 residual)"

    @property
    def sd(self) -> float:
        """A constant's sourced range read as +-2 sd about its value (a family's z is its own scale)."""
        return (self.high - self.low) / 4.0 if self.kind == "constant" else 1.0

    def at(self, z: Array, res: Residuals) -> Array:
        """The constant's value, or the family's multiplicative factor, at normal scores z."""
        if self.kind == "constant":
            return self.value + z * self.sd
        if self.kind == "structure":
            return np.exp(z * self.value)
        return np.exp(res.quantile(self.name, _cdf(z)))

    def admits(self, z: Array) -> Array:
        """Whether normal scores z keep a constant inside its sourced range (families: always)."""
        if self.kind != "constant":
            return np.ones(np.shape(z), dtype=bool)
        x = self.value + z * self.sd
        return (x >= self.low) & (x <= self.high) if self.bounded else x > 0


def _cdf(z: Array) -> Array:
    return np.asarray(_NORMAL_CDF(np.asarray(z, dtype=np.float64)), dtype=np.float64)


def parameters(hw: HardwareProfile, res: Residuals, conditioned: tuple[str, ...] = ()) -> tuple[Parameter, ...]:
    """The profile's ranged constants, then the family factors. A constant fitted to the figures the draws
    are conditioned on (`conditioned`) is bounded by them, not by its range: its fit sits where the figures
    put it, on a range edge when figures and sources disagree (docs/cost-model.md section 6.2)."""
    consts = [Parameter(n, "constant", float(getattr(hw, n)), f.low, f.high, n not in conditioned)
              for n, f in sorted(hw.fits.items()) if f.high > f.low]
    return tuple(consts) + tuple(Parameter(f, "family") for f in FAMILIES if f in res.fitted)


def structure_parameters(sd: float) -> tuple[Parameter, ...]:
    """One whole-layer error per variant, log-normal with the published figures' residual RMS as its sd:
    what the kernel-level parameters cannot explain (overlap rules, kernels the plans leave out)."""
    return tuple(Parameter(v, "structure", sd) for v in VARIANTS)


def published_sd(cfg: Any) -> float:
    """RMS of log(model / published) over the GB300 figures the constants were fitted to."""
    from simulator.cost.calibrate import FITTED, model_value
    from simulator.hardware import load_hardware
    gb300 = load_hardware("gb300")
    return math.sqrt(float(np.mean([math.log(model_value(f, cfg, gb300) / f.published) ** 2 for f in FITTED])))


@dataclass(frozen=True)
class Sample:
    """N draws: a profile and a factor per family for each, and the normal scores they came from."""

    params: tuple[Parameter, ...]
    z: Array  # [N, K]
    stacked: HardwareProfile  # one profile whose drawn constants are arrays [N] (vectorised pricing)
    factors: Array  # [N, len(FAMILIES) + 1]; the last column is 1 (kernels of no family)
    structure: Array  # [N, len(VARIANTS)]: each variant's whole-layer factor
    timelines: dict = field(default_factory=dict, compare=False, repr=False)  # id(plan) -> (plan, makespans
    # before the structural factor): plans are cached and immutable, and the conditioning prices the figures'
    # plans, which a default `step` prices again
    terms: dict = field(default_factory=dict, compare=False, repr=False)  # kernel -> `kernel_draws`: plans of
    # neighbouring shapes share most kernels (an MLA layer at two contexts: 25 of 27)
    scaled: dict = field(default_factory=dict, compare=False, repr=False)  # (kernel, families) -> its
    # `_draw_arrays` columns, the family factors applied

    @property
    def n(self) -> int:
        return self.z.shape[0]

    @cached_property
    def profiles(self) -> tuple[HardwareProfile, ...]:
        """Each draw's own profile (for pricing that cannot take arrays, and for tests)."""
        drawn = [p.name for p in self.params if p.kind == "constant"]
        return tuple(replace(self.stacked, **{c: float(getattr(self.stacked, c)[i]) for c in drawn})
                     for i in range(self.n))


def realise(hw: HardwareProfile, params: tuple[Parameter, ...], z: Array, res: Residuals) -> Sample:
    """Profiles and family factors at normal scores z [N, K]."""
    values = {p.name: p.at(z[:, k], res) for k, p in enumerate(params)}
    consts = [p.name for p in params if p.kind == "constant"]
    stacked = replace(hw, **{c: np.asarray(values[c], dtype=np.float64) for c in consts})
    factors = np.ones((z.shape[0], len(FAMILIES) + 1))
    structure = np.ones((z.shape[0], len(VARIANTS)))
    for k, p in enumerate(params):
        if p.kind == "family":
            factors[:, FAMILIES.index(p.name)] = values[p.name]
        elif p.kind == "structure":
            structure[:, VARIANTS.index(p.name)] = values[p.name]
    return Sample(params, z, stacked, factors, structure)


def lhs_normal(n: int, k: int, rng: np.random.Generator) -> Array:
    """Latin hypercube normal scores [n, k]: each column hits each of n equal-probability strata once."""
    u = (np.argsort(rng.random((k, n)), axis=1).T + rng.random((n, k))) / n
    return np.asarray(_NORMAL_INV_CDF(u), dtype=np.float64)


def sqrt_psd(cov: Array) -> Array:
    """A matrix square root S with S S^T = cov (eigendecomposition: cov may be singular)."""
    w, v = np.linalg.eigh(cov)
    return v * np.sqrt(np.clip(w, 0.0, None))


# ---------------------------------------------------------------------------------------------------
# pricing a plan under every draw
# ---------------------------------------------------------------------------------------------------

def plan_draws(plan: Plan, sample: Sample) -> Array:
    """Makespan of `plan` under each draw [N]: every kernel re-priced on the drawn profile, its phases
    scaled by its families' factors, the timeline run again."""
    return _scheduled(plan, sample)[0] * (sample.structure[:, VARIANTS.index(plan.variant)]
                                          if plan.variant in VARIANTS else 1.0)


def kernel_duration_draws(plan: Plan, sample: Sample) -> Array:
    """[N, n] each kernel's span on the timeline (start to end, stretched by shared bandwidth) under each
    draw: the kernel-level parameters only (the structural factor belongs to a whole layer)."""
    return _scheduled(plan, sample)[1]


def _scheduled(plan: Plan, sample: Sample) -> tuple[Array, Array]:
    seen = sample.timelines.get(id(plan))
    if seen is None or seen[0] is not plan:
        schedule_plans([plan], sample)
        seen = sample.timelines[id(plan)]
    return seen[1]


def schedule_plans(plans: list[Plan], sample: Sample, simulate: Callable = lockstep.simulate_plans) -> None:
    """Schedule under every draw each plan the sample has not seen, all in one call of `simulate` (`lockstep`'s
    NumPy loop runs as long as the longest plan, not all of them; sweeps pass `fastsim.makespan_us.draws`,
    which runs each (plan, draw) row compiled), and remember (makespans [N], kernel spans [N, n]) before any
    structural factor."""
    todo = list({id(p): p for p in plans if sample.timelines.get(id(p), (None,))[0] is not p}.values())
    if not todo:
        return
    scalars = (np.broadcast_to(np.asarray(x, dtype=np.float64), (sample.n,)) for x in plan_scalars(sample.stacked))
    for plan, (start, end, *_) in zip(todo, simulate([_draw_arrays(p, sample) for p in todo], *scalars)):
        sample.timelines[id(plan)] = (plan, (end.max(axis=1), end - start))


def _draw_arrays(plan: Plan, sample: Sample) -> tuple:
    """The plan's `events.simulate` arrays under every draw: phases [N, n] re-priced on the drawn constants and
    scaled by the kernels' family factors; the layout (deps, bytes, prefetch targets) is the same in all."""
    pred, deps, nbytes, can_pf = launch_layout(plan, sample.stacked)
    launch, fixed, math_us, comm, bw = np.stack([_scaled_draws(k, sample) for k in plan], axis=2)  # [N, n] each
    return pred, deps, launch, fixed, math_us, comm, nbytes, bw, can_pf


def _scaled_draws(kernel: Kernel, sample: Sample) -> Array:
    """[5, N] a kernel's `_draw_arrays` columns: launch gap, fixed, math and comm phases scaled by its families'
    factors, and its bandwidth (B/µs) divided by the work family's; remembered per kernel and families (a
    sweep's new plans share most kernels with the plans before them)."""
    fams = kernel_families(kernel)
    return remember(sample.scaled, (kernel, fams), _scale_draws, kernel, fams, sample, limit=TERMS_KEPT)


def _scale_draws(kernel: Kernel, fams: tuple, sample: Sample) -> Array:
    launch, fixed, math_us, comm, stream = kernel_draws(kernel, sample)
    none = len(FAMILIES)
    fw, fc = (sample.factors[:, FAMILIES.index(f) if f in FAMILIES else none] for f in fams)
    return np.stack([launch, fixed * fw, math_us * fw, comm * fc, stream * 1e-6 / fw])


TERMS_KEPT = 20_000  # kernels whose draws a sample remembers (5 x 100 draws: 4 KB each, 80 MB): then it forgets all


def kernel_draws(kernel: Kernel, sample: Sample) -> Array:
    """`kernel_terms` under every draw [5, N], remembered per kernel (equal kernels price the same: pricing
    reads no field that equality ignores): one call on a profile whose drawn constants are arrays, or,
    should the pricing branch on a drawn constant (numpy refuses to branch on an array), one call per draw."""
    return remember(sample.terms, kernel, _draw_terms, kernel, sample, limit=TERMS_KEPT)


def _draw_terms(kernel: Kernel, sample: Sample) -> Array:
    try:
        terms = kernel_terms(kernel, sample.stacked)
        out = np.empty((5, sample.n))
        for j, t in enumerate(terms):
            out[j] = t
    except (TypeError, ValueError):
        out = np.array([kernel_terms(kernel, hw) for hw in sample.profiles], dtype=np.float64).T
    return out


def priced(sample: Sample, price: Callable[[Callable[[Plan, HardwareProfile], Array]], Any]) -> Any:
    """`price(makespan)` under the sample's draws, every plan it asks for scheduled together: a first run reads
    the plans already scheduled and names the others (a stand-in for their draws); if it named any, one
    lockstep loop schedules them all and a second run reads them. Plans scheduled beforehand (a sweep
    schedules a chunk of points' plans in one loop, `schedule_plans`) cost one run."""
    missing: list[Plan] = []

    def seen_or_named(plan: Plan, hw: HardwareProfile) -> Array:
        if sample.timelines.get(id(plan), (None,))[0] is plan:
            return plan_draws(plan, sample)
        missing.append(plan)
        return np.ones(sample.n)
    result = price(seen_or_named)
    if not missing:
        return result
    schedule_plans(missing, sample)
    return price(makespan_with(sample))


def makespan_with(sample: Sample) -> Callable[[Plan, HardwareProfile], Array]:
    """A drop-in for `timeline.makespan_us` that returns the N draws (for `estimate_step(makespan=...)`)."""
    def makespan(plan: Plan, hw: HardwareProfile) -> Array:
        return plan_draws(plan, sample)
    return makespan


# ---------------------------------------------------------------------------------------------------
# conditioning on the published figures
# ---------------------------------------------------------------------------------------------------

def figure_values(cfg: Any, sample: Sample, figures: tuple) -> Array:
    """[N, F] the published figures' model values under each draw, in each figure's metric."""
    return priced(sample, lambda makespan: np.stack([_figure(cfg, sample, f, makespan) for f in figures], axis=1))


def _figure(cfg: Any, sample: Sample, fig: Any, makespan: Callable[[Plan, HardwareProfile], Array]) -> Array:
    from simulator.cost.step import build_plan, estimate_step
    from simulator.plans.kernel import DecodeShape
    from simulator.plans.standard import arch_of
    if fig.metric == "layer_us":
        shape = DecodeShape(fig.batch, fig.tokens_per_seq, fig.context)
        return makespan(build_plan(cfg, fig.variant, fig.tp, shape, fig.layer or "kda", arch=arch_of(sample.stacked)),
                        sample.stacked)
    step = estimate_step(cfg, sample.stacked, fig.variant, fig.tp, fig.batch, fig.context, makespan=makespan)
    us = np.asarray(step.step_us)
    return us / 1000.0 if fig.metric == "step_ms" else fig.batch * step.tokens_per_step / (us * 1e-6)


def posterior(cfg: Any, hw: HardwareProfile, params: tuple[Parameter, ...], res: Residuals,
              figures: tuple) -> tuple[Array, Array, dict[str, Any]]:
    """(mean, covariance) of the normal scores given the published figures, and what they were: the
    linear-Gaussian update with J from central differences at z = +-1 (module docstring)."""
    k = len(params)
    # one sd down, or a forward difference where that would make a constant negative
    down = np.array([0.0 if p.kind == "constant" and p.value - p.sd <= 0 else 1.0 for p in params])
    z = np.vstack([np.zeros((1, k)), np.eye(k), -np.diag(down)])
    y = np.log(figure_values(cfg, realise(hw, params, z, res), figures))  # [2K + 1, F]
    jac = ((y[1:k + 1] - y[k + 1:]) / (1.0 + down)[:, None]).T  # [F, K]
    miss = np.log([f.published for f in figures]) - y[0]
    noise = float(np.mean(miss ** 2))
    gain = jac.T @ np.linalg.inv(jac @ jac.T + noise * np.eye(len(figures)))  # [K, F]
    cov = np.eye(k) - gain @ jac
    return gain @ miss, cov, {"figures": [f.name for f in figures],
                              "figure_sd_pct": round(100 * math.sqrt(noise), 2)}


def draw_scores(mean: Array, cov: Array, params: tuple[Parameter, ...], n: int, seed: int) -> Array:
    """n normal-score vectors from N(mean, cov) restricted to every constant's sourced range (rejection,
    so a constant on a range edge is balanced by the others as the conditioning correlates them)."""
    root, kept = sqrt_psd(cov), []
    rng = np.random.default_rng(seed)
    for _ in range(200):
        z = mean + lhs_normal(4 * n, len(params), rng) @ root.T
        ok = np.all([p.admits(z[:, k]) for k, p in enumerate(params)], axis=0)
        kept.append(z[ok])
        if sum(len(x) for x in kept) >= n:
            return np.vstack(kept)[:n]
    raise UserError("the sourced ranges of the profile's constants leave no room for the draws "
                    "(fewer than 1 in 800 candidates inside every range).")


# ---------------------------------------------------------------------------------------------------
# the public entry: a sample for a profile, intervals of an array of draws
# ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class IntervalSpec:
    """What the user asked for: the interval's level, how many draws, the seed."""

    level: float = DEFAULT_LEVEL
    draws: int = DEFAULT_DRAWS
    seed: int = DEFAULT_SEED

    def __post_init__(self) -> None:
        if not 0.5 <= self.level <= 0.99:
            raise UserError(f"--interval = {self.level!r} must be a probability in [0.5, 0.99] (0.9: a 90 % interval).")
        if not 50 <= self.draws <= 20_000:
            raise UserError(f"--draws = {self.draws!r} must be an integer in [50, 20000].")
        if not 0 <= self.seed < 2**63:
            raise UserError(f"--seed = {self.seed!r} must be an integer in [0, 2^63 - 1].")


@dataclass(frozen=True)
class Uncertainty:
    """The draws a report prices under, their weights, and how they were made."""

    spec: IntervalSpec
    sample: Sample
    cov: Array
    conditioned: dict[str, Any] | None
    weights: Array  # [N], summing to 1: uniform, or the importance weights of the conditioning

    @property
    def makespan(self) -> Callable[[Plan, HardwareProfile], Array]:
        """A drop-in for `timeline.makespan_us` returning the N draws (`estimate_step(makespan=...)`)."""
        return makespan_with(self.sample)

    def price(self, price: Callable[[Callable[[Plan, HardwareProfile], Array]], Any]) -> Any:
        """`price(makespan)` under the draws, its plans scheduled together first (`priced`)."""
        return priced(self.sample, price)

    def interval(self, values: Array, digits: int = 4) -> list[float]:
        return self.intervals([values], [digits])[0]

    def intervals(self, values: list[Array], digits: list[int]) -> list[list[float]]:
        """`interval` of each array of draws [N], rounded to its digits: the quantiles of all taken at once
        (`weighted_quantile` on [K, N], the same numbers; a step report's seven in about half the time)."""
        probs = [(1 - self.spec.level) / 2, (1 + self.spec.level) / 2]
        bounds = weighted_quantile(np.stack(values), self.weights, probs).tolist()  # [K, 2]
        return [[round(lo, d), round(hi, d)] for (lo, hi), d in zip(bounds, digits)]

    @cached_property
    def _counts(self) -> tuple[float, tuple[str, ...], tuple[tuple[str, int], ...]]:
        """What `describe` says of the draws (~14 µs to count; a sweep reports it at every point)."""
        kinds = ("constant", "family", "structure")
        return (round(float(1.0 / np.sum(self.weights ** 2)), 1), tuple(p.label for p in self.sample.params),
                tuple((kind, sum(p.kind == kind for p in self.sample.params)) for kind in kinds))

    def describe(self) -> dict[str, Any]:
        effective, labels, counts = self._counts
        return {"level": self.spec.level, "draws": self.spec.draws, "seed": self.spec.seed,
                "effective_draws": effective, "parameters": list(labels), "parameter_counts": dict(counts),
                "conditioned_on_published": self.conditioned,
                "method": "seeded draws of the profile's ranged constants (shared by every kernel), one H200 "
                          "residual factor per kernel family and one structural factor per variant, each draw "
                          "re-priced and re-scheduled; interval = (weighted) quantiles of the draws "
                          "(docs/cost-model.md section 8)"}


def weighted_quantile(values: Array, weights: Array, probs: list[float]) -> Array:
    """Quantiles of weighted draws: each draw's weight centred on its place in the sorted order. `values` [N],
    or [K, N] for K sets of draws under the same weights (returns [K, len(probs)]): each row is sorted,
    summed and accumulated as alone (numpy runs the same kernels along the last axis), so the same bits."""
    values = np.asarray(values)
    order = np.argsort(values, axis=-1)
    v, w = np.take_along_axis(values, order, axis=-1), np.asarray(weights)[order]
    position = np.cumsum(w, axis=-1) - w / 2
    cdf = position / w.sum(axis=-1, keepdims=True)
    if values.ndim == 1:
        return np.interp(probs, cdf, v)
    return np.array([np.interp(probs, c, x) for c, x in zip(cdf, v)])


def importance_weights(cfg: Any, sample: Sample, proposal: tuple[Array, Array], k: int, figures: tuple,
                       noise: float) -> Array:
    """Exact conditioning on the figures: weight = prior x likelihood / proposal over the K kernel-level
    scores (the range truncation is the same in all three and cancels). The likelihood prices each draw's
    figures without the structural factor, which is the noise (sd^2 = `noise`)."""
    plain = replace(sample, structure=np.ones_like(sample.structure))
    miss = np.log([f.published for f in figures]) - np.log(figure_values(cfg, plain, figures))  # [N, F]
    z = sample.z[:, :k]
    d = z - proposal[0]
    log_w = (-0.5 * np.sum(miss ** 2, axis=1) / noise - 0.5 * np.sum(z ** 2, axis=1)
             + 0.5 * np.einsum("nk,nk->n", d, np.linalg.solve(proposal[1], d.T).T))
    w = np.exp(log_w - log_w.max())
    return w / w.sum()


def conditioned_sample(cfg: Any, hw: HardwareProfile, params: tuple[Parameter, ...], structure: tuple[Parameter, ...],
                       res: Residuals, spec: IntervalSpec, figures: tuple) -> tuple[Sample, Array, Array, dict]:
    """(sample, weights, proposal covariance, what it was conditioned on): N draws from the linear-Gaussian
    update (the proposal), weighted to the exact conditioning (`importance_weights`)."""
    mean, cov, info = posterior(cfg, hw, params, res, figures)
    k, m = len(params), len(structure)
    full_mean, full_cov = np.concatenate([mean, np.zeros(m)]), np.eye(k + m)
    full_cov[:k, :k] = cov
    z = draw_scores(full_mean, full_cov, params + structure, spec.draws, spec.seed)
    sample = realise(hw, params + structure, z, res)
    weights = importance_weights(cfg, sample, (mean, cov), k, figures, (info["figure_sd_pct"] / 100) ** 2)
    return sample, weights, full_cov, info


def uncertainty(hw: HardwareProfile, spec: IntervalSpec, res: Residuals | None = None) -> Uncertainty:
    """The sample every prediction on `hw` is priced under: the kernel-level parameters (conditioned on the
    published figures where the profile was fitted to them), then each variant's structural error."""
    from simulator.config import load_model
    from simulator.cost.calibrate import FITTED, fitted_names
    res = res or residuals_of(hw)
    kimi = load_model("kimi-k3")
    params = parameters(hw, res, fitted_names(hw))
    structure = structure_parameters(published_sd(kimi))
    if fitted_names(hw):
        sample, weights, cov, info = conditioned_sample(kimi, hw, params, structure, res, spec, FITTED)
        return Uncertainty(spec, sample, cov, info, weights)
    k = len(params) + len(structure)
    z = draw_scores(np.zeros(k), np.eye(k), params + structure, spec.draws, spec.seed)
    return Uncertainty(spec, realise(hw, params + structure, z, res), np.eye(k), None,
                       np.full(spec.draws, 1.0 / spec.draws))


@lru_cache(maxsize=16)
def uncertainty_for(hw: HardwareProfile, spec: IntervalSpec) -> Uncertainty:
    """`uncertainty`, made once per profile and spec in a process (sweeps price many points on one GPU)."""
    return uncertainty(hw, spec)


if __name__ == "__main__":  # python -m simulator.cost.uncertainty: rewrite the cached residuals, print coverage
    from simulator.hardware import load_hardware
    RESIDUALS_FILE.write_text(json.dumps(residuals_document("calibration/h200", load_hardware("h200")), indent=1)
                              + "\n", encoding="utf-8")
    load_residuals.cache_clear()
    print(f"wrote {RESIDUALS_FILE}")
    print(json.dumps(coverage(load_residuals()), indent=1))
