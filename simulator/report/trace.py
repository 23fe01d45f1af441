"""Timelines as Chrome trace event JSON, which Perfetto (ui.perfetto.dev) and chrome://tracing open.

One process (pid) per timeline, e.g. standard and specialized side by side; one thread (tid) per stream,
named by a `thread_name` metadata event. Each kernel is a complete event (ph "X") with ts and dur in µs,
the trace format's unit; its args carry bytes, FLOPs, bound, GB/s and fraction of peak. A kernel's early
weight loading (prefetch) is a "prefetch" slice on the same track, nested inside the predecessor it hides
behind. Format: Google's "Trace Event Format"
(docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from simulator.cost.timeline import Span, Timeline
from simulator.report.files import atomic_write

Event = dict[str, Any]


def chrome_trace(timelines: Timeline | Iterable[Timeline]) -> dict[str, Any]:
    """{"traceEvents": [...], "displayTimeUnit": "ns"} for one or several timelines."""
    many = (timelines,) if isinstance(timelines, Timeline) else tuple(timelines)
    events: list[Event] = []
    for pid, timeline in enumerate(many, start=1):
        events += _process(pid, timeline)
    return {"traceEvents": events, "displayTimeUnit": "ns", "otherData": {"generator": "moe-sim"}}


def _process(pid: int, timeline: Timeline) -> list[Event]:
    tids = {stream: i for i, stream in enumerate(timeline.streams, start=1)}
    name = f"{timeline.label} on {timeline.hardware}: {timeline.layer_us:.1f} us, floor {timeline.floor_us:.1f} us"
    events = [_meta("process_name", pid, 0, name)]
    events += [_meta("thread_name", pid, tid, stream) for stream, tid in tids.items()]
    events += [_meta("thread_sort_index", pid, tid, tid) for tid in tids.values()]
    for span in timeline.spans:
        events.append(_kernel(pid, tids[span.stream], span))
        if span.prefetch_start_us is not None and span.prefetch_end_us is not None:
            events.append(_prefetch(pid, tids[span.stream], span))
    return events


def _meta(kind: str, pid: int, tid: int, value: str | int) -> Event:
    key = "sort_index" if kind == "thread_sort_index" else "name"
    return {"name": kind, "ph": "M", "pid": pid, "tid": tid, "args": {key: value}}


def _kernel(pid: int, tid: int, span: Span) -> Event:
    cost = span.cost
    args = {
        "key": span.key, "bytes": span.bytes, "flops": span.flops, "bound": span.bound,
        "GB/s": round(span.bytes / span.duration_us * 1e-3, 1) if span.duration_us > 0 else 0.0,
        "fraction_of_peak": round(cost.fraction_of_peak, 3),
        "alone_us": round(cost.duration_us, 3), "launch_gap_us": round(span.launch_us, 3),
        "prefetched_bytes": int(span.prefetched_bytes),
    }
    if cost.algorithm:
        args |= {"algorithm": cost.algorithm, "comm_bytes": cost.comm_bytes}
    return {"name": span.name, "cat": span.kind, "ph": "X", "ts": span.start_us, "dur": span.duration_us,
            "pid": pid, "tid": tid, "args": args}


def _prefetch(pid: int, tid: int, span: Span) -> Event:
    assert span.prefetch_start_us is not None and span.prefetch_end_us is not None
    return {"name": f"prefetch {span.name}", "cat": "prefetch", "ph": "X", "ts": span.prefetch_start_us,
            "dur": span.prefetch_end_us - span.prefetch_start_us, "pid": pid, "tid": tid,
            "args": {"key": span.key, "bytes": int(span.prefetched_bytes)}}


def write_trace(path: str | Path, timelines: Timeline | Iterable[Timeline] | Mapping[str, Any]) -> Path:
    """Write the trace (or an already built trace dict) atomically: a temp file, then os.replace."""
    trace = timelines if isinstance(timelines, Mapping) else chrome_trace(timelines)
    return atomic_write(path, json.dumps(trace, allow_nan=False))
