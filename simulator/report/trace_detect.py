"""What a trace is, read from the trace itself: which engine's kernel names it carries, and whether its steps
are decode steps.

Engine: every engine of the pattern table is tried on the trace's first DETECT_SAMPLE kernels (the layers
repeat, so a sample holds many): its best layer is aligned with its plan exactly as the comparison does,
and the engine whose alignment FITS best wins. fit = matched / (plan kernels + layer kernels - matched),
the Jaccard index of the two kernel sets: 1 when every kernel of both sides has a partner, low when an
engine's generic patterns ("gemm") catch a few kernels of a long layer or leave most of its plan alone.
Ties (same fit, same matches) go to the engine listed first in the table (moe-sim's own, whose keys are
exact, before the engines its kernel names also fit). With no fit at all, the closest engine is the one
whose patterns name the most distinct kernel names.

Step: a decode step runs each sequence's next token (or its few draft tokens) against a KV cache; a prefill
step runs whole prompts, a mixed batch (chunked prefill) both at once. Two signs, both from the file:
- kernel names: the [step] table of kernel_patterns.toml lists kernels that only run for prompt tokens
  (prefill) and ones that only run in decode; a layer shape with a prefill kernel is left out of the
  comparison (mixed when it also has a decode kernel), and a trace with no other layer is refused;
- token counts: torch's CPU ops record their GEMM input shapes (record_shapes=True); the most common
  M is the tokens per forward. More than the compared step's batch x tokens per sequence, rounded up to
  a CUDA-graph capture size (vLLM pads a decode batch up to one: 1, 2, 4, then multiples of 8, and of
  16 past 256), means the trace's steps are not these decode steps, and it is refused.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable

from simulator.errors import UserError
from simulator.plans.kernel import DecodeShape, Plan
from simulator.report.trace_layers import Signature, best_layer
from simulator.report.trace_patterns import (Classifier, Engine, compile_pattern, engine_names, load_engine, load_table,
                                             string_list)
from simulator.report.trace_reader import KernelTrace, short

DETECT_SAMPLE = 20_000


def rank_engines(trace: KernelTrace, plans: Callable[[Engine], Plan], patterns: str | None) -> list[dict[str, Any]]:
    """Every engine of the table that applies to this layer, with its fit on the trace's first kernels, best
    first (an engine whose plan keys are not in this layer's plan, the GPU suite's on an MLA layer, is left out)."""
    sample = KernelTrace(trace.path, trace.kernels[:DETECT_SAMPLE], trace.events_read)
    ranked = []
    for order, name in enumerate(engine_names(patterns)):
        eng = load_engine(name, patterns)
        try:
            classify = Classifier(eng, plans(eng))
        except UserError:
            continue
        row = _fit(sample, classify)
        ranked.append(((-row["fit"], -row["matched"], order), {"engine": name, **row}))
    return [row for _, row in sorted(ranked, key=lambda kv: kv[0])]


def _fit(sample: KernelTrace, classify: Classifier) -> dict[str, Any]:
    """How one engine's best layer of the sample fits its plan (module docstring), and how many of the
    distinct kernel names its patterns name at all."""
    labels = {classify.label(k) for k in sample.kernels}
    try:
        shape, pairs = best_layer(sample, classify)
        size = sum(len(names) for _, names in shape.signature)
    except UserError:
        pairs, size = {}, 0
    plan_size, matched = len(classify.plan), len(pairs)
    return {"fit": round(matched / (plan_size + size - matched), 3) if matched else 0.0, "matched": matched,
            "plan_kernels": plan_size, "layer_kernels": size,
            "names_matched": sum(1 for label in labels if classify(label)), "names": len(labels)}


def detect_engine(trace: KernelTrace, plans: Callable[[Engine], Plan], patterns: str | None) -> dict[str, Any]:
    """The engine whose patterns fit the trace best; none fitting at all is one sentence naming the closest."""
    ranking = rank_engines(trace, plans, patterns)
    if not ranking or ranking[0]["matched"] == 0:
        example = short(trace.kernels[0].name)
        raise UserError(f"{trace.path}: no engine of the pattern table fits its kernel names (e.g. '{example}'); "
                        f"{_closest(ranking)}")
    return {"chosen": ranking[0]["engine"], "by": "kernel names (best fit of each engine's layer to its plan)",
            "ranking": ranking}


def closest_engine(trace: KernelTrace, plans: Callable[[Engine], Plan], patterns: str | None, tried: str) -> str:
    """A clause naming the engine that came closest, other than the one `tried`."""
    return _closest([r for r in rank_engines(trace, plans, patterns) if r["engine"] != tried])


def _closest(ranking: list[dict[str, Any]]) -> str:
    if not ranking:
        return "the table has no other engine for this layer type; pass --patterns with one of your own."
    r = ranking[0] if ranking[0]["matched"] else max(ranking, key=lambda r: r["names_matched"])
    if r["matched"]:
        return (f"the closest engine is '{r['engine']}' (its layer matches {r['matched']} of its {r['plan_kernels']} "
                f"plan kernels, fit {r['fit']:.2f}): try --engine {r['engine']}.")
    if not r["names_matched"]:
        return (f"no engine's patterns name any of its {r['names']:,} kernel names; "
                "pass --patterns with a table of your own.")
    return (f"the closest engine is '{r['engine']}', whose patterns name {r['names_matched']} of the "
            f"{r['names']} kernel names; choose --engine or pass --patterns with a table of your own.")


# ============================================================================ decode or not


def capture_size(tokens: int) -> int:
    """The CUDA-graph batch size vLLM pads `tokens` up to: 1, 2, 4, multiples of 8 to 256, then of 16."""
    if tokens <= 4:
        return 1 << (tokens - 1).bit_length()
    step = 8 if tokens <= 256 else 16
    return -(-tokens // step) * step


@dataclass
class StepCheck:
    """The trace's evidence about its steps, and the layer shapes it leaves out of the comparison."""

    prefill: tuple[re.Pattern[str], ...]
    decode: tuple[re.Pattern[str], ...]
    tokens: dict[str, int] | None = None
    left_out_shapes: list[str] = field(default_factory=list)

    def left_out(self, signature: Signature) -> str | None:
        """Why a layer shape is not a decode layer (None when nothing says so)."""
        labels = [label for _, labels in signature for label in labels]
        pre = next((x for x in labels if any(p.search(x) for p in self.prefill)), None)
        if pre is None:
            return None
        dec = next((x for x in labels if any(p.search(x) for p in self.decode)), None)
        reason = (f"its layers run a prefill kernel ('{short(pre)}') beside a decode one ('{short(dec)}'): a mixed "
                  "batch" if dec else f"its layers run a prefill kernel ('{short(pre)}'): a prefill step")
        self.left_out_shapes.append(reason)
        return reason

    def summary(self) -> dict[str, Any]:
        return {"tokens_per_forward": self.tokens, "left_out_layer_shapes": len(self.left_out_shapes),
                "left_out_because": self.left_out_shapes[:3]}


def step_check(trace: KernelTrace, shape: DecodeShape, patterns: str | None) -> StepCheck:
    """The step patterns, and a refusal when the trace's GEMMs run more tokens than the compared decode step."""
    source, table = load_table(patterns)
    if "step" not in table:
        source, table = load_table(None)
    step = table.get("step", {})
    compiled = [tuple(compile_pattern(p, source, "step") for p in string_list(step.get(kind, []), source))
                for kind in ("prefill", "decode")]
    check = StepCheck(*compiled)
    if trace.gemm_tokens:
        common, biggest = trace.gemm_tokens.most_common(1)[0][0], max(trace.gemm_tokens)
        expected = shape.batch * shape.tokens_per_seq
        check.tokens = {"most_common": common, "max": biggest, "expected": expected, "padded": capture_size(expected)}
        if common > capture_size(expected):
            raise UserError(f"{trace.path}: its GEMMs mostly run M = {common:,} tokens (recorded input shapes), more "
                            f"than the {expected:,} of the decode step compared (batch {shape.batch} x "
                            f"{shape.tokens_per_seq}): a prefill or mixed step, which is not compared as a decode "
                            "step, or a larger batch (then pass the trace's own --batch and --tokens-per-seq).")
    return check

