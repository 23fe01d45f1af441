"""The `moe-sim` command line: thin typer commands over library functions.

Every command prints a human table by default and one JSON document with `--json`. Bad input
(unknown names, impossible layouts, malformed files) becomes one sentence on stderr and exit 2.
"""

from __future__ import annotations

import json
import os
import sys
from enum import Enum
from typing import Annotated, Any, Callable, Optional

import typer

from simulator.config import ATTENTION_KINDS
from simulator.dtypes import PRECISIONS
from simulator.errors import UserError
from simulator.limits import check_flags
from simulator.plans import VARIANTS
from simulator.report.files import output_dir, output_file

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  rich_markup_mode=None, help="Simulate one Kimi K3-class MoE decode step: numbers and microseconds.")


LAYER_TYPES = ATTENTION_KINDS + ("dense",)


def _choices(name: str, values: tuple[str, ...]) -> type[Enum]:
    """A str Enum for typer, built from the library's own tuple of names (one source of truth)."""
    return Enum(name, {v: v for v in values}, type=str)  # type: ignore[return-value]


LayerChoice = _choices("LayerChoice", LAYER_TYPES + ("all",))
PrecisionChoice = _choices("PrecisionChoice", PRECISIONS)
LayerType = _choices("LayerType", LAYER_TYPES)
VariantChoice = _choices("VariantChoice", VARIANTS + ("both",))


ModelOpt = Annotated[str, typer.Option("--model", help=(
    "Model name (see `moe-sim list models`) or path to a config.json."))]
# ranges are checked by simulator.limits.check_flags: one sentence in the flag's spelling, exit 2
WideOpt = Annotated[bool, typer.Option("--wide", help=(
    "Print every table in its full layout whatever the terminal's width (tables otherwise stack or wrap "
    "to fit it, never cutting a number)."))]
TpOpt = Annotated[int, typer.Option("--tp", help="Tensor-parallel degree P.")]
BatchOpt = Annotated[int, typer.Option("--batch", help="Sequences decoded together.")]
TokensOpt = Annotated[int, typer.Option("--tokens-per-seq", help=(
    "Tokens per sequence in this forward: 1 (the default of every command), or 1 + draft tokens being verified "
    "(8 for the published trace's 7 drafts)."))]
LayerOpt = Annotated[Optional[LayerType], typer.Option("--layer", case_sensitive=False, help=(
    "Layer type (default: the model's own, the type most of its layers have: kda for Kimi K3, mla for DeepSeek-V3)."))]
ContextOpt = Annotated[int, typer.Option("--context", help=(
    "Tokens already in the KV cache / folded into the KDA state."))]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document instead of a table.")]
SkewOpt = Annotated[float, typer.Option("--expert-skew", help=(
    "Zipf exponent s of expert popularity (0 = uniform routing; DeepSeek-V3 ~1.01, Qwen3-235B ~1.2): fewer "
    "experts touched, fewer expert bytes streamed."))]
CorrelationOpt = Annotated[float, typer.Option("--draft-correlation", help=(
    "Share of a draft token's routing that repeats its predecessor's (0 = independent tokens)."))]


def _guard(fn: Callable[[], Any]) -> Any:
    """Run a command body; a UserError becomes one sentence on stderr and exit code 2, Ctrl-C one line
    and exit code 130 (click alone would print 'Aborted!' and exit 1)."""
    try:
        return fn()
    except UserError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    except OSError as exc:  # an output path the checks let through (/proc, a full disk): one sentence, no traceback
        where = f"{exc.filename}: " if exc.filename else ""
        typer.echo(f"error: {where}{exc.strerror or exc}.", err=True)
        raise typer.Exit(2) from None
    except KeyboardInterrupt as exc:
        typer.echo(str(exc) or "interrupted", err=True)
        raise typer.Exit(130) from None


@app.command()
def check(
    model: ModelOpt = "tiny-k3",
    layer: Annotated[LayerChoice, typer.Option("--layer", case_sensitive=False, help=(
        "Layer type to check."))] = LayerChoice.all,
    tp: TpOpt = 4,
    batch: BatchOpt = 3,
    tokens_per_seq: TokensOpt = 1,
    context: ContextOpt = 64,
    precision: Annotated[PrecisionChoice, typer.Option("--precision", case_sensitive=False, help=(
        "fp64 proves the algebra; bf16 is GPU-faithful."))] = PrecisionChoice.fp64,
    seed: Annotated[int, typer.Option("--seed", help="Seed of weights, inputs and state.")] = 0,
    all_reduce: Annotated[str, typer.Option("--all-reduce", help=(
        "Reduction order: one_shot, two_shot or ring."))] = "one_shot",
    backend: Annotated[Optional[str], typer.Option("--backend", help=(
        "How the plans' ops run: numpy (their NumPy forms, the definitions) or fast (compiled replacements and "
        "packed weights); default: $MOE_SIM_KERNELS, else fast."))] = None,
    as_json: JsonOpt = False,
    wide: WideOpt = False,
) -> None:
    """Run the float64 reference and both plans over P ranks; report errors and routing flips.

    Example: moe-sim check --tp 2 --batch 4 --precision bf16

    Exit 0 when both variants are within the precision's tolerances, 1 when not.
    """
    from simulator.check import guard_memory, report_json, run_check
    from simulator.config import load_model, validate_tp
    from simulator.plans.kernel import DecodeShape

    def body() -> dict:
        check_flags(tp=tp, batch=batch, tokens_per_seq=tokens_per_seq, context=context, seed=seed)
        if all_reduce.lower() not in ("one_shot", "two_shot", "ring"):
            raise UserError(f"--all-reduce '{all_reduce}' is not one of one_shot, two_shot, ring.")
        runs_on = _backend(backend)
        cfg = load_model(model)
        shape = DecodeShape(batch, tokens_per_seq, context)
        validate_tp(cfg, tp)  # a layout that cannot shard is the first thing to say, before its memory
        need = guard_memory(cfg, layer.value, tp, shape)  # before any weight is generated
        checks = run_check(cfg, layer.value, tp, shape, precision.value, seed, all_reduce.lower(), runs_on)
        return report_json(checks, precision.value, cfg, tp, shape) | {"memory_estimate_gb": round(need / 1e9, 2)}

    doc = _guard(body)
    if as_json:
        typer.echo(json.dumps(doc, indent=2, allow_nan=False))
    else:
        from simulator.report.tables import print_check
        print_check(doc, wide)
    raise typer.Exit(0 if doc["passed"] else 1)


def _backend(flag: str | None) -> str:
    """--backend, else the MOE_SIM_KERNELS environment variable ("numba" is its old name for fast), else fast;
    an unknown name is one sentence (exit 2)."""
    from simulator.execute import BACKENDS
    env = os.environ.get("MOE_SIM_KERNELS")
    name = flag if flag is not None else {"numba": "fast"}.get(env, env) if env else "fast"
    if name not in BACKENDS:
        where = "--backend" if flag is not None else "MOE_SIM_KERNELS"
        raise UserError(f"{where} '{name}' is not a backend: choose one of {', '.join(BACKENDS)}.")
    return name


HardwareOpt = Annotated[str, typer.Option("--hardware", help=(
    "GPU profile name (see `moe-sim list hardware`) or path to a .toml profile."))]
KernelsOpt = Annotated[Optional[str], typer.Option("--kernels", help=(
    "Kernel implementation set to price with (its measured laws, simulator/hardware/laws/); default: the GPU's "
    "best-measured set, 'datasheet' where none is measured. 'datasheet' prices every kernel from the profile."))]
VariantOpt = Annotated[VariantChoice, typer.Option("--variant", case_sensitive=False, help="Which plan(s) to price.")]
IntervalOpt = Annotated[float, typer.Option("--interval", help=(
    "Probability of the interval printed beside each time (0.9: the 5th to 95th percentile of the draws; "
    "docs/cost-model.md section 8)."))]
DrawsOpt = Annotated[int, typer.Option("--draws", help=(
    "Seeded draws of the constants and kernel-family errors behind the interval."))]
IntervalSeedOpt = Annotated[int, typer.Option("--seed", help=(
    "Seed of the interval's draws (same seed, same interval)."))]
NoIntervalOpt = Annotated[bool, typer.Option("--no-interval", help="Central values only (skip the draws).")]


def _interval_spec(level: float, draws: int, seed: int, off: bool) -> Any:
    from simulator.cost.uncertainty import IntervalSpec
    spec = IntervalSpec(level, draws, seed)  # checked even when off: a bad option is an error either way
    return None if off else spec


DisableOpt = Annotated[Optional[list[str]], typer.Option("--disable-fusion", help=(
    "Turn one fusion of the specialized plan off (repeatable)."))]
EnableOpt = Annotated[Optional[list[str]], typer.Option("--enable-fusion", help=(
    "Turn a what-if fusion on (repeatable); the published path has none left (vLLM 0.33.0 settled the expert "
    "padding)."))]


def _fusions(variant: Enum, disable: list[str] | None, enable: list[str] | None) -> frozenset[str]:
    """The fusion flags, refused when they would change nothing (they act on the specialized plan only)."""
    from simulator.scenario import fusion_set
    if variant.value == "standard" and (disable or enable):
        flag = "--disable-fusion" if disable else "--enable-fusion"
        raise UserError(f"{flag} changes the specialized plan, and --variant standard prices only the standard one.")
    return fusion_set(disable, enable)


def _emit(doc: dict, as_json: bool, printer: Callable[..., None], wide: bool = False) -> None:
    if as_json:
        typer.echo(json.dumps(doc, indent=2, allow_nan=False))
    elif wide:
        printer(doc, wide=True)
    else:
        printer(doc)


def _layer_type(cfg: Any, layer_type: Enum | None) -> str:
    from simulator.report.summary import default_layer
    return layer_type.value if layer_type is not None else default_layer(cfg)


@app.command()
def layer(
    model: ModelOpt = "kimi-k3",
    hardware: HardwareOpt = "gb300",
    kernels: KernelsOpt = None,
    tp: TpOpt = 16,
    batch: BatchOpt = 1,
    tokens_per_seq: TokensOpt = 1,
    context: ContextOpt = 512,
    layer_type: LayerOpt = None,
    variant: VariantOpt = VariantChoice.both,
    disable_fusion: DisableOpt = None,
    enable_fusion: EnableOpt = None,
    expert_skew: SkewOpt = 0.0,
    draft_correlation: CorrelationOpt = 0.0,
    plot_dir: Annotated[Optional[str], typer.Option("--plot", help=(
        "Also write timeline, kernel-bar and roofline charts (PNG + SVG) to this folder."))] = None,
    interval: IntervalOpt = 0.9,
    draws: DrawsOpt = 400,
    seed: IntervalSeedOpt = 0,
    no_interval: NoIntervalOpt = False,
    as_json: JsonOpt = False,
    wide: WideOpt = False,
) -> None:
    """Per-kernel cost and timeline of one decoder layer, standard and specialized side by side.

    With no options: Kimi K3's KDA + MoE layer on GB300, TP16, batch 1, one token per sequence, context
    512. The configuration assumed for the published trace verifies 7 draft tokens: --tokens-per-seq 8.

    Example: moe-sim layer --tokens-per-seq 8

    """
    from simulator.config import load_model
    from simulator.hardware import load_hardware
    from simulator.plans.kernel import DecodeShape
    from simulator.report.summary import layer_report

    def body() -> dict:
        from simulator.routing import RoutingStats
        if plot_dir is not None:
            output_dir(plot_dir, "--plot")
        check_flags(tp=tp, batch=batch, tokens_per_seq=tokens_per_seq, context=context)
        cfg, hw = load_model(model), load_hardware(hardware, kernels)
        kind = _layer_type(cfg, layer_type)
        routing = RoutingStats(expert_skew, draft_correlation)
        shape = DecodeShape(batch, tokens_per_seq, context, routing)
        fusions = _fusions(variant, disable_fusion, enable_fusion)
        spec = _interval_spec(interval, draws, seed, no_interval)
        doc = layer_report(cfg, hw, tp, shape, kind, variant.value, fusions, spec)
        if plot_dir is not None:
            from simulator.report.scenario_plots import layer_plots
            doc["plots"] = [str(p) for p in layer_plots(doc, cfg, hw, tp, shape, kind, variant.value,
                                                       fusions, plot_dir)]
        return doc

    from simulator.report.tables import print_layer
    _emit(_guard(body), as_json, print_layer, wide)


@app.command()
def step(
    model: ModelOpt = "kimi-k3",
    hardware: HardwareOpt = "gb300",
    kernels: KernelsOpt = None,
    tp: TpOpt = 16,
    batch: BatchOpt = 1,
    context: ContextOpt = 512,
    draft_tokens: Annotated[int, typer.Option("--draft-tokens", help=(
        "Draft tokens verified per step (0 = no speculative decoding)."))] = 0,
    acceptance_length: Annotated[Optional[float], typer.Option("--acceptance-length", help=(
        "vLLM's mean acceptance length: tokens emitted per verify step per sequence, bonus token included "
        "(1 <= a <= draft tokens + 1). Default: each draft accepted with probability 0.85 given the one before "
        "(DeepSeek-V3's measured 85-90 %), a = (1 - 0.85^(d+1)) / 0.15: 3.19 at 3 drafts, 4.85 at 7."))] = None,
    drafter: Annotated[str, typer.Option("--drafter", help="Draft model config (name or path).")] = "dspark-k3",
    variant: VariantOpt = VariantChoice.both,
    disable_fusion: DisableOpt = None,
    enable_fusion: EnableOpt = None,
    expert_skew: SkewOpt = 0.0,
    draft_correlation: CorrelationOpt = 0.0,
    routing_bracket: Annotated[bool, typer.Option("--routing-bracket", help=(
        "Also price the step under uniform routing and under concentrated routing (your --expert-skew / "
        "--draft-correlation, or s = 1.2 with correlation 0.5): the bracket routing statistics span."))] = False,
    interval: IntervalOpt = 0.9,
    draws: DrawsOpt = 400,
    seed: IntervalSeedOpt = 0,
    no_interval: NoIntervalOpt = False,
    sensitivity: Annotated[bool, typer.Option("--sensitivity", help=(
        "Rank the uncertain constants and kernel-family errors by their share of the step time's variance "
        "(one at a time, each at its 5th and 95th percentile)."))] = False,
    plot_dir: Annotated[Optional[str], typer.Option("--plot", help=(
        "With --sensitivity: write the tornado chart (PNG + SVG) to this folder."))] = None,
    as_json: JsonOpt = False,
    wide: WideOpt = False,
) -> None:
    """Whole decode step: time, aggregate tokens/s, tokens/s per user and a breakdown.

    With no options: the published batch-1 configuration (Kimi K3, GB300, TP16, no speculation,
    context 512 = the middle of a 1,024-token generation).

    Example: moe-sim step --draft-tokens 7 --acceptance-length 6

    """
    from simulator.config import load_model
    from simulator.hardware import load_hardware
    from simulator.report.summary import step_report

    def body() -> dict:
        from simulator.routing import RoutingStats
        check_flags(tp=tp, batch=batch, context=context, draft_tokens=draft_tokens, acceptance_length=acceptance_length)
        spec = _interval_spec(interval, draws, seed, no_interval)
        if plot_dir is not None:
            if not sensitivity:
                raise UserError("--plot draws the tornado chart of --sensitivity: pass --sensitivity too.")
            output_dir(plot_dir, "--plot")
        if sensitivity and spec is None:
            raise UserError("--sensitivity ranks what widens the interval: drop --no-interval.")
        fusions = _fusions(variant, disable_fusion, enable_fusion)
        cfg, hw = load_model(model), load_hardware(hardware, kernels)
        routing = RoutingStats(expert_skew, draft_correlation)
        doc = step_report(cfg, hw, tp, batch, context, draft_tokens, acceptance_length, variant.value, drafter,
                          fusions, routing, routing_bracket, spec)
        if sensitivity:
            from simulator.cost.sensitivity import step_sensitivity
            doc["sensitivity"] = step_sensitivity(cfg, hw, spec, tp, batch, context, draft_tokens,
                                                  doc["acceptance_length"],
                                                  variant.value, drafter, fusions, routing)
            if plot_dir is not None:
                from simulator.report.uncertainty_plots import plot_tornado
                doc["plots"] = [str(p) for p in plot_tornado(doc, plot_dir)]
        return doc

    from simulator.report.tables import print_step
    _emit(_guard(body), as_json, print_step, wide)


@app.command()
def trace(
    out: Annotated[str, typer.Option("--out", help="Chrome trace JSON file to write (open it in ui.perfetto.dev).")],
    model: ModelOpt = "kimi-k3",
    hardware: HardwareOpt = "gb300",
    kernels: KernelsOpt = None,
    tp: TpOpt = 16,
    batch: BatchOpt = 1,
    tokens_per_seq: TokensOpt = 1,
    context: ContextOpt = 512,
    layer_type: LayerOpt = None,
    whole_step: Annotated[bool, typer.Option("--step", help=(
        "Trace every layer of the step end to end instead of one layer."))] = False,
    variant: VariantOpt = VariantChoice.both,
) -> None:
    """Write the layer (or step) timeline as a Chrome trace: one process per variant, one track per stream.

    Example: moe-sim trace --out layer.json

    """
    from simulator.config import load_model
    from simulator.hardware import load_hardware
    from simulator.plans.kernel import DecodeShape
    from simulator.report.summary import layer_timelines, step_timeline, variants_of
    from simulator.report.trace import write_trace

    def body() -> str:
        check_flags(tp=tp, batch=batch, tokens_per_seq=tokens_per_seq, context=context)
        output_file(out, "--out")
        cfg, hw = load_model(model), load_hardware(hardware, kernels)
        shape = DecodeShape(batch, tokens_per_seq, context)
        if whole_step:
            from simulator.plans.common import make_dims
            make_dims(cfg, tp, shape, None, cfg.layer_type(0))  # validate before the long build
            tls = [step_timeline(cfg, hw, v, tp, shape) for v in variants_of(variant.value)]
        else:
            tls = list(layer_timelines(cfg, hw, tp, shape, _layer_type(cfg, layer_type), variant.value).values())
        write_trace(out, tls)
        return f"wrote {out}: {sum(t.kernel_count for t in tls)} kernels on {len(tls)} timeline(s) " + \
            ", ".join(f"{t.label} {t.layer_us:.1f} us" for t in tls)

    typer.echo(_guard(body))


def _engines() -> str:
    """The engines of the bundled pattern table, for compare-trace's --help (read from the table itself)."""
    from simulator.report.trace_compare import engine_names
    return ", ".join(engine_names())


@app.command("compare-trace")
def compare_trace(
    profile: Annotated[str, typer.Argument(help=(
        "Chrome-trace / Perfetto JSON (or .json.gz): torch profiler, Nsight export or moe-sim trace."))],
    model: ModelOpt = "kimi-k3",
    hardware: HardwareOpt = "gb300",
    tp: TpOpt = 16,
    batch: BatchOpt = 1,
    tokens_per_seq: TokensOpt = 1,
    context: ContextOpt = 512,
    layer_type: LayerOpt = None,
    variant: Annotated[Optional[str], typer.Option("--variant", help=(
        "standard or specialized (default: the engine's, else standard)."))] = None,
    engine: Annotated[Optional[str], typer.Option("--engine", help=(
        f"Kernel-name table: {_engines()} (default: detected from the trace's kernel names)."))] = None,
    patterns: Annotated[Optional[str], typer.Option("--patterns",
                                                    help="A pattern table of your own (TOML, shaped like "
                                                         "simulator/report/kernel_patterns.toml).")] = None,
    plan_keys: Annotated[Optional[str], typer.Option("--plan-keys",
                                                     help="Compare a partial layer: comma-separated plan keys "
                                                          "(default: the engine's, else all).")] = None,
    plot_dir: Annotated[Optional[str], typer.Option("--plot",
                                                    help="Also draw the measured layer under the model's (PNG + SVG) "
                                                         "in this folder.")] = None,
    layer_index: Annotated[Optional[int], typer.Option("--layer-index", help=(
        "Compare with this layer's plan (a sliding-window or full-attention layer; default: the layer "
        "type's median layer)."))] = None,
    kernels: KernelsOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Compare a measured GPU profile of decode layers with the plan, kernel by kernel.

    Example: moe-sim trace --out layer.json --variant standard && moe-sim compare-trace layer.json
    """
    from simulator.config import load_model
    from simulator.hardware import load_hardware
    from simulator.plans.kernel import DecodeShape
    from simulator.report.trace_compare import compare_trace as run_compare
    from simulator.report.trace_compare_view import plot_compare, print_compare

    def body() -> dict:
        check_flags(tp=tp, batch=batch, tokens_per_seq=tokens_per_seq, context=context)
        if plot_dir is not None:
            output_dir(plot_dir, "--plot")
        cfg, hw = load_model(model), load_hardware(hardware, kernels)
        keys = tuple(k.strip() for k in plan_keys.split(",") if k.strip()) if plan_keys else None
        engine_set = None if kernels else (lambda name: load_hardware(hardware, name))  # the engine's kernel set
        doc, timeline = run_compare(profile, cfg, hw, tp, DecodeShape(batch, tokens_per_seq, context),
                                    _layer_type(cfg, layer_type), variant, engine, patterns, keys,
                                    layer=layer_index, with_kernels=engine_set)
        if plot_dir:
            doc["plots"] = [str(p) for p in plot_compare(doc, timeline, plot_dir)]
        return doc

    _emit(_guard(body), as_json, print_compare)


@app.command()
def ablation(
    model: ModelOpt = "kimi-k3",
    hardware: HardwareOpt = "gb300",
    kernels: KernelsOpt = None,
    tp: TpOpt = 16,
    batch: BatchOpt = 1,
    tokens_per_seq: TokensOpt = 1,
    context: ContextOpt = 512,
    layer_type: LayerOpt = None,
    acceptance_length: Annotated[Optional[float], typer.Option("--acceptance-length", help=(
        "For the step columns when tokens-per-seq > 1."))] = None,
    plot_dir: Annotated[Optional[str], typer.Option("--plot", help=(
        "Also write waterfall charts (PNG + SVG) to this folder."))] = None,
    as_json: JsonOpt = False,
    wide: WideOpt = False,
) -> None:
    """What each fusion of the specialized plan saves, per layer and per step (add one / remove one / waterfall).

    Example: moe-sim ablation --batch 32 --tp 8

    """
    from simulator.config import load_model
    from simulator.cost.ablation import ablate
    from simulator.hardware import load_hardware

    def body() -> dict:
        check_flags(tp=tp, batch=batch, tokens_per_seq=tokens_per_seq, context=context,
                    acceptance_length=acceptance_length)
        if plot_dir is not None:
            output_dir(plot_dir, "--plot")
        cfg, hw = load_model(model), load_hardware(hardware, kernels)
        from simulator.plans.common import make_dims
        from simulator.plans.kernel import DecodeShape
        from simulator.report.summary import acceptance, fit_keys
        kind, shape = _layer_type(cfg, layer_type), DecodeShape(batch, tokens_per_seq, context)
        make_dims(cfg, tp, shape, None, kind)
        if acceptance_length is not None and not 1 <= acceptance_length <= tokens_per_seq:
            raise UserError(f"--acceptance-length {acceptance_length:g} must lie in [1, --tokens-per-seq = "
                            f"{tokens_per_seq}]: "
                            f"a verify step of {tokens_per_seq} token(s) per sequence emits at most {tokens_per_seq}.")
        doc = ablate(cfg, hw, tp, batch, tokens_per_seq, context, kind, acceptance_length) | fit_keys(cfg, hw, tp,
                                                                                                      shape)
        a, assumption = acceptance(tokens_per_seq - 1, acceptance_length)
        doc["speculation"] = {"draft_tokens": tokens_per_seq - 1, "acceptance_length": a, "assumption": assumption,
                              "note": "the savings are times, which the acceptance length does not change"}
        if plot_dir is not None:
            from simulator.report.scenario_plots import ablation_plots
            doc["plots"] = [str(p) for p in ablation_plots(doc, plot_dir)]
        return doc

    from simulator.report.tables import print_ablation
    _emit(_guard(body), as_json, print_ablation, wide)


@app.command("run")
def run_cmd(
    scenario: Annotated[str,
                        typer.Argument(help="Scenario TOML file, or the name of a shipped one (see `moe-sim list "
                                            "scenarios`).")],
    out: Annotated[Optional[str], typer.Option("--out",
                                               help="Folder for points.csv, summary.json and the plots.")] = None,
    quick: Annotated[bool, typer.Option("--quick", help="Cut every sweep axis to its first and last value.")] = False,
    yes: Annotated[bool, typer.Option("--yes",
                                      help="Run a grid larger than 20,000 points (its estimated time is printed "
                                           "without it).")] = False,
    no_interval: Annotated[bool, typer.Option("--no-interval", help=(
        "Central values only: no 90 % bounds columns or bands, about 20x faster a point (large grids)."))] = False,
    as_json: JsonOpt = False,
    wide: WideOpt = False,
) -> None:
    """Evaluate a what-if scenario: the grid of its [sweep] axes over its [base] configuration.

    Example: moe-sim run batch-sweep --out out/batch

    Ctrl-C keeps the finished points (written atomically) and exits 130; rerunning the same command
    into the same --out folder resumes after them.
    """
    from simulator import sweep
    from simulator.scenario import load_scenario

    def body() -> dict:
        sc = load_scenario(scenario)
        sc = sc.reduced() if quick else sc
        sweep.check_size(sc, yes, not no_interval)  # before the progress bar starts
        return sweep.run(sc, out, progress=_progress_bar(sc.count), yes=yes, tell=lambda m: typer.echo(m, err=True),
                         interval=not no_interval)

    result = _guard(body)
    s = result["summary"]
    if s["kind"] == "step" and s["base"].get("acceptance_length") is None and "acceptance_length" not in s["sweep"]:
        from simulator.report.summary import ACCEPTANCE_SOURCE
        s["acceptance_assumption"] = ACCEPTANCE_SOURCE  # what each row's acceptance_length is, where drafts verify
    if as_json:
        typer.echo(json.dumps({"summary": result["summary"], "rows": result["rows"]}, indent=2, default=str,
                              allow_nan=False))
    else:
        from simulator.report.tables import print_run
        print_run(result, wide=wide)


def _progress_bar(total: int) -> Callable[[int, int], None] | None:
    """A rich progress bar on stderr for sweeps long enough to want one."""
    if total < 20 or not sys.stderr.isatty():
        return None
    from rich.progress import Progress
    bar = Progress(transient=True)
    task = bar.add_task("grid points", total=total)
    bar.start()

    def advance(done: int, n: int) -> None:
        bar.update(task, completed=done)
        if done == n:
            bar.stop()
    return advance


@app.command()
def validate(
    measurements: Annotated[Optional[str], typer.Option("--measurements", help=(
        "Folder of GPU measurement CSVs (benchmarks/gpu/suite.py), or the name of a shipped set (h200). "
        "Default: the H200 measurements shipped with the package (calibration/h200 in a clone)."))] = None,
    hardware: HardwareOpt = "h200",
    plot_dir: Annotated[Optional[str], typer.Option("--plot",
                                                    help="Also write predicted-vs-measured charts (PNG + SVG) to this "
                                                         "folder.")] = None,
    fit: Annotated[bool, typer.Option("--fit",
                                      help="Fit the kernel set these CSVs measure (their kernel_set.toml) and write "
                                           "it into the GPU's laws file (simulator/hardware/laws/).")] = False,
    kernels: KernelsOpt = None,
    as_json: JsonOpt = False,
    wide: WideOpt = False,
) -> None:
    """Hold the cost model to GPU measurements: error per kernel family, pre-registered, model and refit.

    The headline figures are the profile's kernel laws (what step, layer and run price with) on the held-back
    half of each grid; refit is the same law fitted afresh on these CSVs. --fit makes them one.

    Example: moe-sim validate --measurements calibration/h200
    """
    from simulator.cost.validate import (kernel_set_of, set_default, set_name, validate as run_validation,
        write_kernel_set)
    from simulator.hardware import load_hardware
    from simulator.paths import measurement_folder

    def body() -> dict:
        if plot_dir is not None:
            output_dir(plot_dir, "--plot")
        folder = measurement_folder(measurements)
        written = None
        if fit:
            base = load_hardware(hardware, "datasheet")
            kset = kernel_set_of(folder, base)
            written = {"set": kset.name, "path": str(write_kernel_set(kset, base, set_default(folder)))}
        # the measurements are held to the laws of the set they define (once fitted), unless --kernels names another
        own = set_name(folder)
        try:
            hw = load_hardware(hardware, kernels or own)
        except UserError:
            if kernels or not own:
                raise
            hw = load_hardware(hardware)
        doc = run_validation(folder, hw)
        doc["written"] = written
        doc["measurements"] = str(folder)
        from simulator.cost.uncertainty import coverage, derive_residuals, residuals_from
        doc["interval_coverage"] = coverage(residuals_from(derive_residuals(folder, hw)))
        if plot_dir:
            from simulator.report.validation import plot_validation
            doc["plots"] = [str(p) for p in plot_validation(doc, plot_dir)]
        return doc

    from simulator.report.validation import print_validation
    _emit(_guard(body), as_json, print_validation, wide)


@app.command()
def calibrate(
    hardware: Annotated[str, typer.Option("--hardware",
                                          help="The profile whose published-fitted constants to refit (a name or a "
                                               "TOML path).")] = "gb300",
    trace_batch: Annotated[int, typer.Option("--trace-batch", help="Sequences in the forward the published "
                                             "per-layer trace shows (not published; docs/kernels.md).")] = 1,
    trace_tokens: Annotated[int, typer.Option("--trace-tokens", help="Tokens per sequence in that forward: 8 "
                                              "(1 + 7 drafts, the assumed reading) or 1.")] = 8,
    as_json: JsonOpt = False,
    wide: WideOpt = False,
) -> None:
    """Refit the constants fitted to the published figures, inside their sourced ranges; report the rest.

    Prints each constant now and refitted (and whether it sits on a range edge), the four fitted figures,
    and the published figures the fit did not use. Writes nothing: copy a value into the TOML yourself.

    Example: moe-sim calibrate --hardware gb300   (the trace read as 8 requests of one token: --trace-batch 8
    --trace-tokens 1)
    """
    from simulator.config import load_model
    from simulator.cost import calibrate as cal
    from simulator.hardware import load_hardware

    def body() -> dict:
        hw = load_hardware(hardware)
        if not cal.fitted_names(hw):
            raise UserError(f"{hw.name} has no constant fitted to the published figures (they are GB300 TP16 "
                            "figures; its fitted_to entries name other data).")
        cfg = load_model("kimi-k3")
        figures = cal.trace_read_as(trace_batch, trace_tokens)
        return cal.report(cfg, hw, cal.fit(cfg, hw, figures=figures), figures)

    from simulator.report.validation import print_calibration
    _emit(_guard(body), as_json, print_calibration, wide)


@app.command("list")
def list_cmd(what: Annotated[str, typer.Argument(help="models, hardware or scenarios")] = "models") -> None:
    """List the bundled model configs, hardware profiles or scenarios (each usable by name)."""
    def body() -> list[str]:
        kind = what.lower()
        if kind == "models":
            from simulator.config import list_models
            return list_models()
        if kind == "hardware":
            from simulator.hardware import list_hardware
            return list_hardware()
        if kind == "scenarios":
            from simulator.scenario import list_scenarios
            return list_scenarios()
        raise UserError(f"cannot list '{what}': choose models, hardware or scenarios.")
    for name in _guard(body):
        typer.echo(name)


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)
