"""The `moe-sim` command line: thin typer commands over library functions.

Every command prints a human table by default and one JSON document with `--json`. Bad input
(unknown names, impossible layouts, malformed files) becomes one sentence on stderr and exit 2.
"""

from __future__ import annotations

import json
import sys
from enum import Enum
from typing import Annotated, Any, Callable

import typer

from simulator.errors import UserError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  rich_markup_mode=None, help="Simulate one Kimi K3-class MoE decode step: numbers and microseconds.")


class LayerChoice(str, Enum):
    kda = "kda"
    mla = "mla"
    dense = "dense"
    all = "all"


class PrecisionChoice(str, Enum):
    fp64 = "fp64"
    fp32 = "fp32"
    bf16 = "bf16"


ModelOpt = Annotated[str, typer.Option("--model", help="Model name (see `moe-sim list models`) or path to a config.json.")]
TpOpt = Annotated[int, typer.Option("--tp", help="Tensor-parallel degree P.")]
BatchOpt = Annotated[int, typer.Option("--batch", help="Sequences decoded together.")]
TokensOpt = Annotated[int, typer.Option("--tokens-per-seq", help="Tokens per sequence in this forward: 1, or 1 + draft tokens being verified.")]
ContextOpt = Annotated[int, typer.Option("--context", help="Tokens already in the KV cache / folded into the KDA state.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document instead of a table.")]


def _guard(fn: Callable[[], Any]) -> Any:
    """Run a command body; a UserError becomes one sentence on stderr and exit code 2."""
    try:
        return fn()
    except UserError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None


@app.command()
def check(
    model: ModelOpt = "tiny-k3",
    layer: Annotated[LayerChoice, typer.Option("--layer", help="Layer type to check.")] = LayerChoice.all,
    tp: TpOpt = 4,
    batch: BatchOpt = 3,
    tokens_per_seq: TokensOpt = 1,
    context: ContextOpt = 64,
    precision: Annotated[PrecisionChoice, typer.Option("--precision", help="fp64 proves the algebra; bf16 is GPU-faithful.")] = PrecisionChoice.fp64,
    seed: Annotated[int, typer.Option("--seed", help="Seed of weights, inputs and state.")] = 0,
    all_reduce: Annotated[str, typer.Option("--all-reduce", help="Reduction order: one_shot, two_shot or ring.")] = "one_shot",
    as_json: JsonOpt = False,
) -> None:
    """Run the float64 reference and both plans over P ranks; report errors and routing flips.

    Example: moe-sim check --model kimi-k3 --tp 16 --batch 1
    Exit 0 when both variants are within the precision's tolerances, 1 when not.
    """
    from simulator.check import report_json, run_check
    from simulator.config import load_model
    from simulator.plans.kernel import DecodeShape

    def body() -> dict:
        if all_reduce not in ("one_shot", "two_shot", "ring"):
            raise UserError(f"--all-reduce '{all_reduce}' is not one of one_shot, two_shot, ring.")
        cfg = load_model(model)
        shape = DecodeShape(batch, tokens_per_seq, context)
        checks = run_check(cfg, layer.value, tp, shape, precision.value, seed, all_reduce)
        return report_json(checks, precision.value, cfg, tp, shape)

    doc = _guard(body)
    if as_json:
        typer.echo(json.dumps(doc, indent=2))
    else:
        from simulator.report.tables import print_check
        print_check(doc)
    raise typer.Exit(0 if doc["passed"] else 1)


@app.command("list")
def list_cmd(what: Annotated[str, typer.Argument(help="models or hardware")] = "models") -> None:
    """List the bundled model configs or hardware profiles."""
    def body() -> list[str]:
        if what == "models":
            from simulator.config import list_models
            return list_models()
        if what == "hardware":
            from simulator.hardware import list_hardware
            return list_hardware()
        raise UserError(f"cannot list '{what}': choose models or hardware.")
    for name in _guard(body):
        typer.echo(name)


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)
