"""Timing harness of the GPU suite: CUDA-graph replay, cold L2 by rotation, medians and percentiles.

Method (the same as benchmarks/h200_decode_gemms.py, so the older CSV stays comparable):
- `reps` launches of one kernel (or one small group of launches) are captured back to back in ONE
  CUDA graph on one stream, the way a layer's kernels run in a decode step under graph replay;
- launch i reads rotation slot i % n_slots, and the slots together are >= 4 x L2 (240 MB on H200),
  so every launch reads its weights / cache / state cold from HBM, as a decode step does;
- the graph is replayed `replays` times, each timed with CUDA events; time per launch = replay time /
  reps. We report the median and the 10th / 90th percentiles over replays.
- warm-up runs every distinct call once outside the graph first (Triton JIT, cuBLAS heuristics);
- a kernel whose inputs are too small for the slots to reach 4 x L2 (a few KB at batch 1 would need tens of
  thousands of slots) is timed with an L2 flush instead (`time_cold`): each launch follows a read of
  2 x L2 of other memory, and a second graph of the flushes alone is subtracted replay by replay.

`launches` (kernels per call) is counted with torch.profiler on one eager call, so a measurement of
"one plan kernel" that a library splits into several launches says so.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any, Callable

L2_BYTES_H200 = 60 * 2 ** 20
COLD_FACTOR = 4  # rotate over >= 4 x L2
FLUSH_FACTOR = 2  # an L2 flush reads this many L2s of memory no kernel touches (clean lines: no write-back)


def no_gpu_reason() -> str | None:
    """Why no GPU measurement can run here (None when one can)."""
    try:
        import torch
    except ImportError:
        return "PyTorch is not installed"
    if not torch.cuda.is_available():
        return "PyTorch sees no CUDA GPU"
    return None


def say_no_gpu(script: str, nothing: str) -> bool:
    """True, after one line saying why and what was not done, when no GPU measurement can run here: the
    scripts' common start (exit 0 then: CI has no GPU, and that is not an error)."""
    reason = no_gpu_reason()
    if reason:
        print(f"{script}: {reason}; {nothing}.")
    return reason is not None


def slots_for(bytes_per_call: int, l2_bytes: int = L2_BYTES_H200, max_slots: int = 64) -> int:
    """Rotation slots so that the slots together hold >= COLD_FACTOR x L2 (at least 2)."""
    if bytes_per_call <= 0:
        return 2
    return max(2, min(max_slots, math.ceil(COLD_FACTOR * l2_bytes / bytes_per_call)))


def percentile(values: list[float], q: float) -> float:
    xs = sorted(values)
    pos = (len(xs) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def cold_slots(bytes_per_call: int, max_slots: int, l2_bytes: int = L2_BYTES_H200) -> tuple[int, bool]:
    """(rotation slots, flush?) that keep a kernel's inputs out of L2: the slots that hold >= COLD_FACTOR x L2
    where at most max_slots do, else two slots and an L2 flush before every launch."""
    need = slots_for(bytes_per_call, l2_bytes, max_slots=1 << 30)
    return (need, False) if need <= max_slots else (2, True)


def time_cold(torch: Any, make_calls: Callable[[int], list], bytes_per_call: int, max_slots: int,
              reps: int = 64, replays: int = 20) -> tuple[dict, list]:
    """(time_graph's result with `cold` = "rotation" or "flush", the calls) of the calls make_calls(slots)
    builds, every input cold from HBM however small (cold_slots): rotated over >= 4 x L2, or flushed."""
    slots, flush = cold_slots(bytes_per_call, max_slots)
    calls = make_calls(slots)
    if not flush:
        return {**time_graph(torch, calls, reps=max(reps, len(calls)), replays=replays), "cold": "rotation"}, calls
    buf = torch.ones(FLUSH_FACTOR * L2_BYTES_H200 // 4, device="cuda", dtype=torch.float32)
    sink = torch.zeros((), device="cuda", dtype=torch.float32)

    def flush() -> None:
        torch.sum(buf, 0, out=sink)

    reps = max(reps, 256)
    both = _graph(torch, [flush] + calls, lambda i: (flush(), calls[i % len(calls)]()), reps)
    alone = _graph(torch, [flush], lambda i: flush(), reps)
    per_launch, flush_us = [], []
    for _ in range(replays):  # alternate, so a clock drift falls on both graphs alike
        t_both, t_alone = replay_us(torch, both, 1, reps)[0], replay_us(torch, alone, 1, reps)[0]
        per_launch.append(t_both - t_alone)
        flush_us.append(t_alone)
    del both, alone
    return {**_stats(per_launch), "reps": reps, "replays": replays, "cold": "flush",
            "flush_us": statistics.median(flush_us)}, calls


def _graph(torch: Any, warm: list[Callable[[], Any]], body: Callable[[int], Any], reps: int) -> Any:
    """A captured, uploaded CUDA graph of body(0) .. body(reps - 1), each of `warm` run once before capture."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for call in warm:  # warm-up outside the graph
            call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for i in range(reps):
            body(i)
    graph.replay()  # first replay uploads the graph
    torch.cuda.synchronize()
    return graph


def _stats(per_launch: list[float]) -> dict:
    return {"median_us": statistics.median(per_launch), "p10_us": percentile(per_launch, 0.1),
            "p90_us": percentile(per_launch, 0.9)}


def time_graph(torch: Any, calls: list[Callable[[], Any]], reps: int = 32, replays: int = 20) -> dict:
    """Capture calls[i % len(calls)] for i < reps in one graph; per-launch µs over `replays` replays."""
    graph = _graph(torch, calls, lambda i: calls[i % len(calls)](), reps)
    per_launch = replay_us(torch, graph, replays, reps)
    del graph
    return {**_stats(per_launch), "reps": reps, "replays": replays}


def replay_us(torch: Any, graph: Any, replays: int, per: int) -> list[float]:
    """µs per unit of each of `replays` timed replays of a captured, uploaded graph holding `per` units
    (launches, layers), timed between CUDA events on the replaying stream."""
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0 / per)  # ms -> µs
    return times


def count_launches(torch: Any, call: Callable[[], Any]) -> int:
    """GPU kernels one eager call launches (kernel_names)."""
    return len(kernel_names(torch, call))


def kernel_names(torch: Any, call: Callable[[], Any]) -> list[str]:
    """Names of the GPU kernels one eager call launches, in order (torch.profiler, CUDA activity),
    memcpy/memset excluded."""
    from torch.profiler import ProfilerActivity, profile
    call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type.name == "CUDA"]
    return [n for n in names if "memcpy" not in n.lower() and "memset" not in n.lower()]


def environment(torch: Any) -> dict:
    """GPU, driver, CUDA, torch and Triton versions, clocks: recorded with every CSV."""
    import platform
    import subprocess
    env = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda}
    try:
        import triton
        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = ""
    props = torch.cuda.get_device_properties(0)
    env.update({"gpu": props.name, "sm_count": props.multi_processor_count,
                "l2_bytes": getattr(props, "L2_cache_size", 0), "gpu_count": torch.cuda.device_count(),
                "memory_bytes": props.total_memory})
    try:
        q = "driver_version,clocks.max.sm,clocks.sm,clocks.mem,power.limit"
        out = subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20).stdout.strip().splitlines()
        env["nvidia_smi"] = out[0] if out else ""
        env["driver"] = out[0].split(",")[0].strip() if out else ""
    except (OSError, subprocess.SubprocessError):
        env["nvidia_smi"], env["driver"] = "", ""
    return env


def warm_up(torch, seconds: float = 3.0) -> None:
    """Bring the clocks up before the first timed point (an idle H200 sits at 345 MHz SM clock)."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    end = time.time() + seconds
    while time.time() < end:
        for _ in range(20):
            a @ a
        torch.cuda.synchronize()
