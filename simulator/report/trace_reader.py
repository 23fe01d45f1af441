"""Read GPU kernel events out of a Chrome-trace / Perfetto JSON file (plain or .gz), streaming.

What writes such files, and what a kernel event looks like in each:
- PyTorch's profiler (`export_chrome_trace`, what vLLM's profiler writes): ph "X", cat "kernel"
  ("Kernel" before Kineto 2.1), ts/dur in µs, args {"device", "stream", "correlation", ...}; kernels
  replayed from a CUDA graph are kernel events too (their args carry graph ids).
- Nsight Systems exports converted to the trace format: cat "cuda_kernel" / "gpu_kernel" are taken too.
- moe-sim's own `moe-sim trace`: cat is the kernel kind (gemm, moe, ...), args.key the plan key; its
  "prefetch" slices are not kernels.

The trace format's clock is µs; "displayTimeUnit" only changes how a viewer shows it (moe-sim writes
"ns" there with µs values). A trace whose metadata says its clock is ns, or whose median kernel lasts
over MAX_MEDIAN_KERNEL_US (no decode kernel does; the same kernel in ns does), is refused: ambiguous
units would make every error figure off by 1000x.

Streaming: `traceEvents` is decoded one event at a time with `json.JSONDecoder.raw_decode` over a
text buffer refilled in CHUNK_CHARS pieces, so memory holds one chunk plus the kept kernels (a small
tuple each), never the whole document. Napkin math: a 200 MB trace of ~0.8 M events at ~5 µs per
raw_decode call is ~4 s; a kept kernel is ~200 B, 0.5 M of them ~100 MB.
"""

from __future__ import annotations

import gzip
import io
import json
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from simulator.errors import UserError
from simulator.plans.kernel import KernelKind

CHUNK_CHARS = 1 << 20
MAX_VALUE_CHARS = 64 << 20  # a value still unparsed after this much text is malformed, not unfinished
KERNEL_CATS = frozenset({"kernel", "cuda_kernel", "gpu_kernel"})  # lower-cased `cat` of real GPU kernels
MOE_SIM_KINDS = frozenset(KernelKind.__args__)  # type: ignore[attr-defined]
MAX_MEDIAN_KERNEL_US = 1000.0
# A kernel may start before its predecessor on the same stream ends: with programmatic dependent launch
# (PDL, Hopper+) the dependent kernel's prologue runs early; cuBLASLt's split-K reduce does this on an H200
# (tests/data/traces: 64 ns). One kernel lying wholly inside another on one stream cannot happen.
OVERLAP_TOLERANCE_US = 0.01  # profilers round ts and dur to 1 ns each
NS_FLAGS = ("timeUnit", "time_unit", "ts_unit", "clock_unit")  # metadata keys that may declare the clock
_DECODER = json.JSONDecoder()


@dataclass(frozen=True, slots=True)
class KernelEvent:
    """One GPU kernel launch as the profiler recorded it (µs)."""

    name: str
    stream: tuple[Any, Any]  # (pid, tid): a process (GPU / variant) and a CUDA stream in it
    ts: float
    dur: float
    key: str | None  # moe-sim's plan key, when the trace is moe-sim's own

    @property
    def end(self) -> float:
        return self.ts + self.dur


@dataclass
class KernelTrace:
    """The kernels of a trace, in file order, plus its top-level metadata (traceEvents excluded)."""

    path: str
    kernels: list[KernelEvent] = field(default_factory=list)
    events_read: int = 0
    metadata: dict[str, Any] = field(default_factory=dict)
    stream_names: dict[tuple[Any, Any], str] = field(default_factory=dict)


def read_kernels(path: str | Path) -> KernelTrace:
    """Every GPU kernel event of the file; a file that cannot be one decode trace raises UserError."""
    p = Path(path)
    if p.is_dir():
        raise UserError(f"{p} is a directory, not a trace file.")
    if not p.exists():
        raise UserError(f"{p} does not exist.")
    if p.stat().st_size == 0:
        raise UserError(f"{p} is empty.")
    trace = KernelTrace(str(p))
    with _open_text(p) as f:
        _parse(_Stream(f, p), trace)
    _check(trace)
    return trace


def _open_text(p: Path) -> TextIO:
    with p.open("rb") as raw:
        gz = raw.read(2) == b"\x1f\x8b"
    return io.TextIOWrapper(gzip.open(p, "rb"), encoding="utf-8") if gz else p.open(encoding="utf-8")


class _Stream:
    """A text buffer over the file that yields one JSON value at a time (raw_decode), refilling as needed."""

    def __init__(self, f: TextIO, path: Path) -> None:
        self.f, self.path, self.buf, self.pos, self.eof = f, path, "", 0, False

    def _more(self) -> bool:
        if self.eof:
            return False
        try:
            chunk = self.f.read(CHUNK_CHARS)
        except (UnicodeDecodeError, OSError, EOFError) as exc:
            raise UserError(f"{self.path} is not a UTF-8 JSON text file ({type(exc).__name__}).") from None
        self.buf, self.pos = self.buf[self.pos:] + chunk, 0
        self.eof = not chunk
        return bool(chunk)

    def peek(self) -> str:
        """The next non-space character ('' at the end of the file)."""
        while True:
            while self.pos < len(self.buf) and self.buf[self.pos] in " \t\r\n":
                self.pos += 1
            if self.pos < len(self.buf) or not self._more():
                return self.buf[self.pos:self.pos + 1]

    def expect(self, char: str, where: str) -> None:
        if self.peek() != char:
            raise UserError(f"{self.path} is not valid trace JSON: expected '{char}' {where}.")
        self.pos += 1

    def value(self) -> Any:
        """Decode the next JSON value; a value cut by the buffer's end is retried with more text."""
        self.peek()
        while True:
            try:
                obj, end = _DECODER.raw_decode(self.buf, self.pos)
                if end < len(self.buf) or self.eof:  # a number at the very end might continue
                    self.pos = end
                    return obj
            except json.JSONDecodeError:
                if self.eof or len(self.buf) - self.pos > MAX_VALUE_CHARS:
                    raise UserError(f"{self.path} is not valid JSON (a value that does not parse, "
                                    f"{len(self.buf) - self.pos} characters from where it starts).") from None
            self._more()


def _parse(s: _Stream, trace: KernelTrace) -> None:
    """Top level: an object with a "traceEvents" array, or a bare array of events (both are the format)."""
    first = s.peek()
    if first == "[":
        _events(s, trace)
    elif first == "{":
        s.pos += 1
        seen = False
        while s.peek() != "}":
            key = s.value()
            s.expect(":", f"after the key {key!r}")
            if key == "traceEvents" and s.peek() == "[":
                _events(s, trace)
                seen = True
            else:
                trace.metadata[str(key)] = s.value()
            if s.peek() == ",":
                s.pos += 1
        if not seen:
            raise UserError(f"{s.path} has no traceEvents array, so it is not a Chrome trace.")
    else:
        raise UserError(f"{s.path} is not JSON (it starts with {first!r}).")


def _events(s: _Stream, trace: KernelTrace) -> None:
    """Decode the events array one event at a time, keeping kernels and stream names only."""
    s.expect("[", "to open traceEvents")
    keep, names, intern = trace.kernels.append, trace.stream_names, sys.intern
    n = 0
    while s.peek() != "]":
        e = s.value()
        n += 1
        if s.peek() == ",":
            s.pos += 1
        if not isinstance(e, dict):
            continue
        ph = e.get("ph")
        if ph == "X":
            k = _kernel(e, intern)
            if k is not None:
                keep(k)
        elif ph == "M" and e.get("name") == "thread_name":
            names[(e.get("pid"), e.get("tid"))] = str((e.get("args") or {}).get("name", ""))
    s.pos += 1
    trace.events_read = n


def _kernel(e: dict, intern: Any) -> KernelEvent | None:
    cat = str(e.get("cat", "")).lower()
    args = e.get("args") if isinstance(e.get("args"), dict) else {}
    key = args.get("key") if cat in MOE_SIM_KINDS else None
    if cat not in KERNEL_CATS and key is None:
        return None
    try:
        ts, dur = float(e["ts"]), float(e["dur"])
    except (KeyError, TypeError, ValueError):
        return None
    return KernelEvent(intern(str(e.get("name", ""))), (e.get("pid"), e.get("tid")), ts, dur,
                       intern(str(key)) if key is not None else None)


def _check(trace: KernelTrace) -> None:
    """Refuse what would make the comparison meaningless: no kernels, a ns clock, one kernel inside another."""
    if not trace.kernels:
        raise UserError(f"{trace.path} has {trace.events_read} trace events but no GPU kernel events "
                        "(ph 'X' with cat 'kernel'; profile with CUDA activity on).")
    flag = _declared_unit(trace.metadata)
    if flag and flag.lower() in ("ns", "nanoseconds"):
        raise UserError(f"{trace.path} declares its clock in ns; the trace format is µs, so convert ts and dur "
                        "(divide by 1000) first.")
    median = statistics.median(k.dur for k in trace.kernels)
    if median > MAX_MEDIAN_KERNEL_US:
        raise UserError(f"{trace.path}: the median kernel lasts {median:.0f} 'µs', which no decode kernel does; "
                        "its ts and dur look like ns, so convert them (divide by 1000) first.")
    for stream, kernels in by_stream(trace.kernels).items():
        for a, b in zip(kernels, kernels[1:]):
            if b.end < a.end - OVERLAP_TOLERANCE_US:
                raise UserError(f"{trace.path}: kernel {_short(b.name)!r} lies inside {_short(a.name)!r} on stream "
                                f"{stream} (at {b.ts:.3f} µs), which one CUDA stream cannot do; were two streams or "
                                "GPUs merged into one track?")


def _short(name: str, width: int = 60) -> str:
    return name if len(name) <= width else name[:width - 3] + "..."


def _declared_unit(meta: dict[str, Any]) -> str | None:
    places = [meta] + [v for v in meta.values() if isinstance(v, dict)]
    for place in places:
        for flag in NS_FLAGS:
            if isinstance(place.get(flag), str):
                return place[flag]
    return None


def by_stream(kernels: list[KernelEvent]) -> dict[tuple[Any, Any], list[KernelEvent]]:
    """Kernels per (pid, tid), each list in start order."""
    out: dict[tuple[Any, Any], list[KernelEvent]] = {}
    for k in kernels:
        out.setdefault(k.stream, []).append(k)
    for ks in out.values():
        ks.sort(key=lambda k: k.ts)
    return out


