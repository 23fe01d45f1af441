"""Benchmark: one full-size Kimi K3 layer at TP16 on this CPU: the reference, standard and specialized paths.

    python benchmarks/fullsize.py                         # KDA + MoE layer, batch 1, fp64 (as `moe-sim check`)
    python benchmarks/fullsize.py --batch 64 --json       # one JSON document on stdout
    python benchmarks/fullsize.py --layer dense           # layer 0: KDA + the 33,792-wide dense FFN

What it measures, in one process:
- compile: a tiny-k3 check of the same layer type first, then the parallel forms its small weights do not
  reach (`warm_parallel_forms`), so every Numba kernel is compiled or loaded from its on-disk cache
  (`cache_hits` / `cache_misses` say which): the first run after an install pays
  the compile, later runs the cache load;
- drawing (`draw_s`): the layer's dense weights drawn once on all cores (one stream per tensor), then per
  path the routed experts it draws. Experts stream expert-major: a chunk of touched experts (256 MB
  packed, `--stream-chunk-gb`) is drawn on all cores, every simulated rank runs its share of it, and the
  next chunk follows; what the bounded cache kept (`--expert-cache-gb`) a later path does not draw again.
  `draw_rate_mparams_s` is expert parameters drawn and packed per second (both cores);
- wall_s per path (reference, standard, specialized): the path's compute, drawing taken out;
  `wall_incl_draw_s` is the first run's with it in. Peak RSS after each path (`PeakRss`: the copy's own
  buffers left out). The standard and specialized paths run `--repeats` times, interleaved (default 5 up
  to batch 16, else 1): wall_s is the median, `wall_s_runs` every run. This VM's neighbours move one run's
  figures by up to 2x;
- expert_gbps: the specialized plan's routed-expert kernels (FC1, FC2 + finalize, all 16 ranks) timed
  in place (their ops, called once per streamed chunk over all ranks; the drawing of the chunk happens
  between the calls and is not in the time), bytes = the packed MXFP4 bytes of the touched experts (every
  rank reads its 1/P of each); at `--precision bf16` the kernel takes bfloat16 x and sums in float32
  (W4A16, what the GPU runs), at fp64 in float64;
- copy_gbps: STREAM copy (dst[:] = src[:], bytes read + written) of 2 x 256 MB on all threads, best of 5,
  measured just before each specialized run (`copy_gbps_runs`). The headline figures take the same
  statistic on both sides, STREAM's: expert_gbps is the best run's, copy_gbps the best copy's, and
  expert_vs_copy their ratio. Each run's own ratio to the copy just before it is in `expert_vs_copy_runs`
  and their median in `expert_vs_copy_median`: a neighbour that takes a core for a few ms costs one ~15 ms
  kernel run far more than it costs a best-of-5 copy, so those single-run ratios spread (0.28-0.85 in one
  run of this benchmark on a loaded VM);
- read_gbps: a read alone (every byte of 256 MB summed once, all threads, best of 5), measured just after
  each copy (`read_gbps_runs`), and expert_vs_read, the best kernel run over the best read (its median over
  the runs: `expert_vs_read_median`). A kernel that only reads its bytes cannot beat it, whatever it
  computes. STREAM's copy counts the bytes written too, and how that compares with a read depends on the
  machine: on Zen 4 half the copy was about half a read, on the Xeon of 2026-12-01 it is 0.8-0.9 of one
  (a C loop of 512-bit loads read 22-24 GB/s on 2 threads while a memcpy counted 35-37, this copy 39-46),
  and on two pinned cores of a lent GPU host with the same CPU model half of one again (a copy of 22 GB/s
  against a read of 22, 2026-12-02): `copy_vs_read`, the best copy over the best read, says which a run had;
- expert_op_s, the best run's time per routed-expert op (FC1 with its activation; FC2 with the finalize), and
  expert_calls_s, the same run's grouped products inside them (`fast.mxfp4_grouped`: the compiled kernel and
  its few microseconds of Python) with their GB/s and ratios to the best copy and read (`expert_calls_gbps`,
  `_vs_copy`, `_vs_read`); the rest of the ops' time is the work around them (permutes, weight tables and
  work items, the GLU, the outputs: mostly Python, some small compiled helpers);
- max_rel_rms_error of both plans against the reference, so that a fast wrong answer cannot pass;
- `cpu`, the CPU's model name: the development VM has changed under this benchmark three times (Ice Lake,
  Zen 4, a Xeon of the Sapphire / Emerald Rapids class: family 6 model 207), and its figures with it.

Napkin math, batch 1: 16 experts x 17.5 MB = 280 MB packed, 14 ms at 20 GB/s; drawing them is 16 x 3 x
11 M normal floats, ~3 s on 2 cores at ~180 M parameters/s: the drawing, not the arithmetic, is the floor
of a fresh layer. Batch 64: 442 experts x 33 M = 14.6 G parameters, ~80 s of drawing per full pass.
"""

from __future__ import annotations

import os

# One BLAS thread: the Numba kernels own the cores. OpenBLAS's threads spin for a while after each call, and
# on this 2-core machine they took the cores from the standard plan's parallel bf16 GEMMs after the
# reference's BLAS products: batch 1, standard 3.1 s with them, 0.7 s without (the reference 1.35 / 1.27 s).
# Set before NumPy loads OpenBLAS; an explicit setting in the environment wins.
for _var in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse
import json
import resource
import sys
import tempfile
import time
from contextlib import contextmanager, nullcontext
from dataclasses import replace
from typing import Any, Callable, ContextManager, Iterator

import numba
import numpy as np
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from simulator.check import _output_errors, _state_errors, check_layer, make_inputs
from simulator.config import load_model
from simulator.dtypes import Precision
from simulator.execute import run_plan
from simulator.fast import kernels as fast
from simulator.fast.replacements import REPLACEMENTS
from simulator.plans import specialized, standard
from simulator.plans.common import make_dims
from simulator.plans.kernel import DecodeShape, Plan
from simulator.reference import reference_layer
from simulator.weights import LayerWeights, weight_table

GB = 1e9
SMALL_BATCH, SMALL_BATCH_REPEATS = 16, 5  # paths of up to ~1 s: five paired runs cost a few seconds
PHASES = ("compile", "dense weights", "reference", "standard", "specialized")


class PeakRss:
    """The simulation's peak resident memory, the copy benchmark's own buffers (512 MB) left out: the kernel's
    high-water mark (/proc/self/status VmHWM) is kept before each copy and reset after it (clear_refs 5,
    Linux 4.0+). Where that cannot be done, ru_maxrss, which then counts them."""

    def __init__(self) -> None:
        self.before = 0.0

    def gb(self) -> float:
        return max(self.before, _high_water_gb())

    def leave_out(self, fn: Callable[[], float]) -> float:
        """fn() (the copy), its allocation not in the peak where the high-water mark can be reset."""
        self.before = self.gb()
        out = fn()
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            pass
        return out


def _high_water_gb() -> float:
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) * 1024 / GB  # kB
    except (OSError, StopIteration, ValueError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GB  # Linux: kilobytes


PEAK = PeakRss()
peak_rss_gb = PEAK.gb


@numba.njit(parallel=True, cache=True)
def _copy(dst: np.ndarray, src: np.ndarray) -> None:
    for i in numba.prange(src.shape[0]):
        dst[i] = src[i]


def call_seconds(fn: Callable[[], object], repeats: int) -> list[float]:
    """Wall seconds of `repeats` timed calls of fn, after one untimed warm-up call (compiles, faults pages in)."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def cpu_model() -> str:
    """The CPU's model name as the kernel reports it (/proc/cpuinfo), else the platform's word for it."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform
    return platform.processor() or platform.machine() or "unknown"


def copy_gbps(n_bytes: int = 256 << 20, repeats: int = 5) -> float:
    """STREAM copy on all threads: 2 x bytes per pass (read + write), best of `repeats`."""
    src = np.ones(n_bytes // 8)
    dst = np.zeros_like(src)
    return 2 * src.nbytes / min(call_seconds(lambda: _copy(dst, src), repeats)) / GB


@numba.njit(parallel=True, cache=True, fastmath=True)
def _read(src: np.ndarray, sums: np.ndarray) -> None:
    n, parts = src.shape[0], sums.shape[0]
    for p in numba.prange(parts):  # each thread sums its own part, reassociated into vector lanes (fastmath):
        # in order, the adds' latency bound it (13-15 GB/s on 2 threads here against 22-29)
        sums[p] = np.sum(src[p * n // parts:(p + 1) * n // parts])


def read_gbps(n_bytes: int = 256 << 20, repeats: int = 5) -> float:
    """A read alone on all threads: every byte of 256 MB summed once (bytes read per pass), best of `repeats`.
    What a kernel that only reads its bytes can reach at most, the roof for the routed experts; on the Xeon
    of 2026-12-01 22-24 GB/s, as a C loop of 512-bit loads, while the copy above counted 35-45."""
    src = np.ones(n_bytes // 8)
    sums = np.zeros(numba.get_num_threads())
    return src.nbytes / min(call_seconds(lambda: _read(src, sums), repeats)) / GB


def compile_kernels(layer: str, precision: str) -> dict[str, Any]:
    """The tiny model's check of this layer type at this precision: every kernel compiled for the dtypes
    the timed run uses (or loaded from the disk cache), so no compile lands in a timed path."""
    t0 = time.perf_counter()
    check_layer(load_model("tiny-k3"), layer, 4, DecodeShape(2, 1, 4), precision, backend="fast")
    warm_parallel_forms(precision)
    seconds = time.perf_counter() - t0
    dispatchers = [v for v in vars(fast).values() if isinstance(v, numba.core.registry.CPUDispatcher)]
    hits = sum(sum(d.stats.cache_hits.values()) for d in dispatchers)
    misses = sum(sum(d.stats.cache_misses.values()) for d in dispatchers)
    return {"seconds": round(seconds, 2), "cache_hits": hits, "cache_misses": misses}


def warm_parallel_forms(precision: str) -> None:
    """The two kernels whose parallel form only large weights reach (the tiny model's bf16 weights are below
    `fast.BF16_PARALLEL_BYTES`, and it has no expert shard of whole 32-blocks), called once on small arrays of
    the types and layouts the full size passes, with the size thresholds at 0, so that their compile or cache
    load lands here and not in a timed path (it took 3-9 s of the standard path's first run): the bf16 GEMM
    on a whole and on a column-sliced weight, and the grouped MXFP4 product at the precision's activations
    (bf16: bfloat16 values)."""
    from simulator.dtypes import round_bf16
    from simulator.fast.packed import MXFP4Weight, grouped_matmul
    dtype = np.float64 if precision == "fp64" else np.float32
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 64)).astype(dtype)
    x = round_bf16(x) if precision == "bf16" else x
    bits = rng.integers(0, 1 << 14, (64, 3 * fast.BF16_TILE), dtype=np.uint16)
    w = MXFP4Weight(*fast.mxfp4_quantize_t(rng.standard_normal((64, 64), dtype=np.float32)))
    thresholds = fast.PARALLEL_BYTES, fast.BF16_PARALLEL_BYTES
    fast.PARALLEL_BYTES = fast.BF16_PARALLEL_BYTES = 0
    try:
        fast.bf16_matmul(x, bits)
        fast.bf16_matmul(x, bits[:, :2 * fast.BF16_TILE])
        grouped_matmul([x], [(np.arange(2), (w,))])
    finally:
        fast.PARALLEL_BYTES, fast.BF16_PARALLEL_BYTES = thresholds


def layer_weight_names(cfg: Any, layer_type: str) -> list[str]:
    attn = cfg.attn_kinds[cfg.first_layer_of(layer_type)]
    ffn = ("dense.",) if layer_type == "dense" else ("router.", "shared.", "latent.")
    return [n for n in weight_table(cfg) if "." not in n or n.startswith((f"{attn}.",) + ffn)]


def timed_experts(plan: Plan, clock: dict[str, float], weights: LayerWeights) -> Plan:
    """The plan with its routed-expert kernels' ops, the fast backend's replacements, timed: the per-rank op and
    its all-ranks form (the one the executor calls, fast/experts.py), into clock["s"] and clock[kernel name];
    the expert drawing the streaming does between calls is outside them, and any drawing inside them is taken out."""
    def wrap(op: Callable[..., Any], name: str) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            g0, t0 = weights.generate_s, time.perf_counter()
            out = op(*args, **kwargs)
            spent = time.perf_counter() - t0 - (weights.generate_s - g0)
            clock["s"] += spent
            clock[name] = clock.get(name, 0.0) + spent
            return out
        if hasattr(op, "over_ranks"):
            run.over_ranks = wrap(op.over_ranks, name)  # type: ignore[attr-defined]
        return run
    return replace(plan, kernels=tuple(replace(k, op=wrap(REPLACEMENTS.get(k.op, k.op), k.name))
                                       if k.kind == "moe" else k for k in plan.kernels))


@contextmanager
def grouped_calls(on_call: Callable[[tuple[Any, ...], float], None]) -> Iterator[None]:
    """`fast.mxfp4_grouped` (the grouped products the expert ops call through fast/packed.grouped_matmul, which
    looks it up on the module at each call) replaced while inside by a wrapper that hands on_call each call's
    arguments and seconds; put back after, also on an error."""
    grouped = fast.mxfp4_grouped

    def seen(*args: Any) -> Any:
        t0 = time.perf_counter()
        out = grouped(*args)
        on_call(args, time.perf_counter() - t0)
        return out
    fast.mxfp4_grouped = seen
    try:
        yield
    finally:
        fast.mxfp4_grouped = grouped


def timed_grouped_calls(clock: dict[str, float]) -> ContextManager[None]:
    """`grouped_calls` adding each call's seconds into clock["calls"]."""
    def add(args: tuple[Any, ...], seconds: float) -> None:
        clock["calls"] = clock.get("calls", 0.0) + seconds
    return grouped_calls(add)


def run(batch: int, layer: str, tp: int, precision: str, seed: int, cache_gb: float, chunk_gb: float,
        step: Callable[..., None], spill_dir: str | None = None, repeats: int = 1,
        model: str = "kimi-k3") -> dict[str, Any]:
    cfg = load_model(model)
    shape = DecodeShape(batch, 1, 64)
    d = make_dims(cfg, tp, shape, None, layer)
    prec = Precision(precision)
    doc: dict[str, Any] = {"batch": batch, "layer": layer, "layer_index": d.layer, "tp": tp, "precision": precision,
                           "model": cfg.name, "threads": numba.get_num_threads(), "repeats": repeats,
                           "cpu": cpu_model()}
    step("compile")
    doc["compile"] = compile_kernels(layer, precision)
    weights = LayerWeights(cfg, d.layer, seed, expert_cache_bytes=int(cache_gb * GB),
                           stream_chunk_bytes=int(chunk_gb * GB), spill_dir=spill_dir)
    step("dense weights")
    t0 = time.perf_counter()
    weights.materialize(layer_weight_names(cfg, layer))
    draw = {"dense": time.perf_counter() - t0}
    io, state = make_inputs(cfg, d, np.random.default_rng(seed))
    step("reference")
    g0, t0 = weights.generate_s, time.perf_counter()
    ref_io, ref_state, ref_diag = reference_layer(cfg, d.layer, shape, weights, io, state)
    wall, rss, errors = {"reference": [time.perf_counter() - t0 - (weights.generate_s - g0)]}, {}, {}
    draw["reference"] = weights.generate_s - g0
    rss["reference"] = peak_rss_gb()
    copies, reads, clocks = [], [], []  # clocks: each specialized run's expert times (`timed_experts`)
    for rep in range(repeats):  # the paths interleaved, and a copy measured just before each timed kernel
        for name, build in (("standard", standard.build), ("specialized", specialized.build)):
            step(name, f"{rep + 1}/{repeats}")
            clock = {"s": 0.0}
            plan = build(cfg, tp, shape, layer, d.layer)
            if name == "specialized":
                plan = timed_experts(plan, clock, weights)
                copies.append(PEAK.leave_out(copy_gbps))
                reads.append(PEAK.leave_out(read_gbps))
            g0, t0 = weights.generate_s, time.perf_counter()
            with timed_grouped_calls(clock) if name == "specialized" else nullcontext():
                out, new_state, _ = run_plan(plan, d, weights, io, state, prec, backend="fast")
            wall.setdefault(name, []).append(time.perf_counter() - t0 - (weights.generate_s - g0))
            draw[name] = draw.get(name, 0.0) + weights.generate_s - g0
            rss[name] = peak_rss_gb()
            if name == "specialized":
                clocks.append(clock)
            if rep == 0:  # every repeat computes the same bits
                found = (_output_errors(out, ref_io, np.ones(d.M, bool), precision)
                         + _state_errors(new_state, ref_state, d, precision))
                errors[name] = max(e.rel_rms_error for e in found)
            del out, new_state  # not held through the next path: at batch 64 the KDA state alone is 0.5 GB
    experts = np.unique(ref_diag["topk_idx"]) if "topk_idx" in ref_diag else np.empty(0, int)
    part_bytes = cfg.expert_in_dim * cfg.moe_intermediate * 17 // 32  # codes (1/2 B) + scales (1/32 B)
    expert_draw_s = sum(v for k, v in draw.items() if k != "dense")
    median = {k: float(np.median(v)) for k, v in wall.items()}
    doc |= {"wall_s": {k: round(v, 3) for k, v in median.items()},
            "wall_s_runs": {k: [round(x, 3) for x in v] for k, v in wall.items()},
            "wall_incl_draw_s": {k: round(wall[k][0] + draw[k], 3) for k in wall},
            "draw_s": {k: round(v, 3) for k, v in draw.items()} | {"total": round(sum(draw.values()), 3)},
            "peak_rss_gb": round(peak_rss_gb(), 3), "peak_rss_gb_after": {k: round(v, 3) for k, v in rss.items()},
            "experts_touched": len(experts), "expert_part_draws": weights.expert_generations,
            "expert_part_spill_reads": weights.spill_reads,
            "draw_rate_mparams_s": round(weights.expert_generations * cfg.expert_in_dim * cfg.moe_intermediate
                                         / max(expert_draw_s, 1e-9) / 1e6, 1),
            "expert_cache_gb": cache_gb, "stream_chunk_gb": chunk_gb,
            "max_rel_rms_error": {k: float(f"{v:.3g}") for k, v in errors.items()},
            "copy_gbps": _sig(max(copies)), "copy_gbps_runs": [_sig(c) for c in copies],
            "read_gbps": _sig(max(reads)), "read_gbps_runs": [_sig(r) for r in reads],
            "copy_vs_read": _sig(max(copies) / max(reads))}
    doc["specialized_vs_standard"] = round(median["standard"] / median["specialized"], 2)
    if len(experts):
        nbytes = 3 * part_bytes * len(experts)
        kernel_s = [c["s"] for c in clocks]
        gbps = [nbytes / s / GB for s in kernel_s]
        ratios = [g / c for g, c in zip(gbps, copies)]
        doc |= {"expert_kernel_s": _sig(min(kernel_s)), "expert_bytes_gb": _sig(nbytes / GB),
                "expert_gbps": _sig(max(gbps)), "expert_gbps_runs": [_sig(g) for g in gbps],
                "expert_vs_copy": _sig(max(gbps) / max(copies)), "expert_vs_copy_runs": [_sig(r) for r in ratios],
                "expert_vs_copy_median": _sig(float(np.median(ratios))),
                "expert_vs_read": _sig(max(gbps) / max(reads)),
                "expert_vs_read_median": _sig(float(np.median([g / r for g, r in zip(gbps, reads)])))}
        doc |= expert_split(clocks, nbytes, max(copies), max(reads))
    return doc


def expert_split(clocks: list[dict[str, float]], nbytes: int, copy: float, read: float) -> dict[str, Any]:
    """Where the best specialized run's routed-expert time went (`timed_experts` and `timed_grouped_calls`'
    clocks, one per run): each op's seconds and the compiled grouped products' inside them, all from the run
    with the least expert time (the one `expert_kernel_s` is), and the products' GB/s and ratios to the best
    copy and read. {} where no grouped product ran (grouped_matmul declines: no AVX-512, or shards not on
    whole 32-blocks, as in the tiny model)."""
    calls = [c.get("calls", 0.0) for c in clocks]
    if not clocks or min(calls) <= 0:
        return {}
    best = min(clocks, key=lambda c: c["s"])
    gbps = nbytes / best["calls"] / GB
    return {"expert_op_s": {k: _sig(v) for k, v in best.items() if k not in ("s", "calls")},
            "expert_calls_s": _sig(best["calls"]), "expert_calls_s_runs": [_sig(c) for c in calls],
            "expert_calls_gbps": _sig(gbps), "expert_calls_vs_copy": _sig(gbps / copy),
            "expert_calls_vs_read": _sig(gbps / read)}


def _sig(x: float) -> float:
    """x to 3 significant digits (the tiny model's figures are thousandths of a GB)."""
    return float(f"{x:.3g}")


def report(doc: dict[str, Any]) -> str:
    lines = [f"Kimi K3 layer {doc['layer_index']} ({doc['layer']}), TP{doc['tp']}, batch {doc['batch']}, "
             f"{doc['precision']}, {doc['threads']} threads",
             f"  CPU: {doc['cpu']}",
             f"  compile (tiny run): {doc['compile']['seconds']} s, cache hits {doc['compile']['cache_hits']}, "
             f"misses {doc['compile']['cache_misses']}",
             f"  dense weights drawn in {doc['draw_s']['dense']} s; {doc['expert_part_draws']} expert parts drawn at "
             f"{doc['draw_rate_mparams_s']} M params/s"]
    runs = f"median of {doc['repeats']} runs" if doc["repeats"] > 1 else "one run"
    lines.append(f"  wall per path, drawing taken out ({runs} of standard and specialized):")
    for k, v in doc["wall_s"].items():
        lines.append(f"  {k:12s} {v:8.2f} s  (+{doc['draw_s'][k]:.2f} s drawing experts)  peak RSS so far "
                     f"{doc['peak_rss_gb_after'][k]:.2f} GB  rel RMS error {doc['max_rel_rms_error'].get(k, 0):.1e}")
    if "expert_gbps" in doc:
        lines.append(f"  routed experts (specialized, {doc['precision']}, {doc['experts_touched']} touched): "
                     f"{doc['expert_bytes_gb']} GB "
                     f"packed in {doc['expert_kernel_s']} s = {doc['expert_gbps']} GB/s; copy {doc['copy_gbps']} GB/s; "
                     f"ratio {doc['expert_vs_copy']} (best of {doc['repeats']} of each; each run's ratio to the copy "
                     f"just before it: {', '.join(f'{r:.2f}' for r in doc['expert_vs_copy_runs'])})")
        lines.append(f"  a read alone {doc['read_gbps']} GB/s (best of {doc['repeats']}, each just after the copy): "
                     f"the routed experts at {doc['expert_vs_read']} of it (median of the runs "
                     f"{doc['expert_vs_read_median']}); the copy counts {doc['copy_vs_read']}x a read alone, so half "
                     f"the copy is {_sig(doc['copy_vs_read'] / 2)} of what a kernel that only reads can reach")
    if "expert_calls_s" in doc:
        ops = ", ".join(f"{k} {v} s" for k, v in doc["expert_op_s"].items())
        lines.append(f"  the best run by op: {ops}; of its {doc['expert_kernel_s']} s the grouped products "
                     f"(fast.mxfp4_grouped) took {doc['expert_calls_s']} s = {doc['expert_calls_gbps']} GB/s, "
                     f"{doc['expert_calls_vs_copy']} of the copy, {doc['expert_calls_vs_read']} of a read alone; "
                     f"the rest is the work around them (permutes, tables, the GLU, the outputs)")
    lines.append(f"  peak RSS {doc['peak_rss_gb']} GB; "
                 f"specialized {doc['specialized_vs_standard']}x as fast as standard")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--layer", choices=("kda", "mla", "dense"), default="kda")
    ap.add_argument("--tp", type=int, default=16)
    ap.add_argument("--precision", choices=("fp64", "fp32", "bf16"), default="fp64")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--expert-cache-gb", type=float, default=0.5, help="bound of the packed expert cache")
    ap.add_argument("--stream-chunk-gb", type=float, default=0.25, help="packed experts drawn per streamed chunk")
    ap.add_argument("--spill-dir", help="draw each expert part once: later paths read it back from a temporary "
                    "folder made here (~8 GB at batch 64; the folder is made if missing) instead of drawing it again")
    ap.add_argument("--repeats", type=int, help="runs of the standard and specialized paths, interleaved, each "
                    "specialized run paired with a copy measured just before it; medians reported "
                    f"(default {SMALL_BATCH_REPEATS} up to batch {SMALL_BATCH}, else 1)")
    ap.add_argument("--model", default="kimi-k3", help=argparse.SUPPRESS)  # tests run the tiny model
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.batch < 1:
        print("--batch must be a positive integer.", file=sys.stderr)
        return 2
    if args.repeats is not None and args.repeats < 1:
        print("--repeats must be a positive integer.", file=sys.stderr)
        return 2
    repeats = args.repeats or (SMALL_BATCH_REPEATS if args.batch <= SMALL_BATCH else 1)
    if args.spill_dir:  # a scratch folder the user names: made if missing, as `mkdir -p` would
        try:
            os.makedirs(args.spill_dir, exist_ok=True)
        except OSError as e:
            print(f"--spill-dir {args.spill_dir}: cannot make that folder ({e.strerror}).", file=sys.stderr)
            return 2
    columns = (TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(), TextColumn("{task.fields[rss]}"))
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("starting", total=len(PHASES), rss="")

        def step(phase: str, note: str = "") -> None:
            bar.update(task, description=f"{phase} {note}", completed=PHASES.index(phase),
                       rss=f"peak RSS {peak_rss_gb():.2f} GB")

        with tempfile.TemporaryDirectory(dir=args.spill_dir) if args.spill_dir else nullcontext() as spill:
            doc = run(args.batch, args.layer, args.tp, args.precision, args.seed, args.expert_cache_gb,
                      args.stream_chunk_gb, step, spill, repeats, args.model)
    print(json.dumps(doc, indent=2) if args.json else report(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
