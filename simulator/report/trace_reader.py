"""Read GPU kernel events out of a Chrome-trace / Perfetto JSON file (plain or .gz), streaming.

What writes such files, and what a kernel event looks like in each:
- PyTorch's profiler (`export_chrome_trace`, what vLLM's profiler writes): ph "X", cat "kernel"
  ("Kernel" before Kineto 2.1), ts/dur in µs, args {"device", "stream", "correlation", ...}; kernels
  replayed from a CUDA graph are kernel events too (their args carry graph ids). With record_shapes on,
  its CPU ops carry "Input Dims": the token count M of each GEMM is read from them (`gemm_tokens`).
- Nsight Systems exports converted to the trace format: cat "cuda_kernel" / "gpu_kernel" are taken too.
- moe-sim's own `moe-sim trace`: cat is the kernel kind (gemm, moe, ...), args.key the plan key; its
  "prefetch" slices are not kernels.

The trace format's clock is µs; "displayTimeUnit" only changes how a viewer shows it (moe-sim writes
"ns" there with µs values). A trace whose metadata says its clock is ns, or whose median kernel lasts
over MAX_MEDIAN_KERNEL_US (no decode kernel does; the same kernel in ns does), is refused: ambiguous
units would make every error figure off by 1000x.

Any file: what cannot be one decode trace is one sentence (UserError), found in bounded time and memory.
Below JSON (compression, encoding, size): trace_source.py. Here: the JSON's shape (root, traceEvents,
nesting deeper than Python's recursion limit, one value over MAX_VALUE_CHARS, text after the end), each
kernel event's numbers (ts and dur present, finite, dur >= 0), names (kept up to MAX_NAME_CHARS; shown
in messages cut to SHOW_CHARS, control characters escaped), ids (pid / tid a number or a string), and
the kernels together (over MAX_KERNELS or MAX_NAMES distinct names, duplicates, one inside another on one
stream, a ns clock).

Streaming: `traceEvents` is decoded one event at a time with `json.JSONDecoder.raw_decode` over a
text buffer refilled in CHUNK_CHARS pieces (doubling while one value is unfinished, so a long value is
parsed O(its length) times, not O(length^2 / chunk)), so memory holds one chunk plus the kept kernels
(a small tuple each), never the whole document. Napkin math: a 200 MB trace of ~0.8 M events at ~5 µs
per raw_decode call is ~4 s; a kept kernel is ~200 B, 0.5 M of them ~100 MB.
"""

from __future__ import annotations

import json
import math
import re
import statistics
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simulator.errors import UserError
from simulator.plans.kernel import KernelKind
from simulator.report.trace_source import TextSource

CHUNK_CHARS = 1 << 20
MAX_VALUE_CHARS = 16 << 20  # one event or metadata value longer than this is malformed, not unfinished
MAX_META_CHARS = 1 << 16  # top-level values longer than this are skipped, not kept (only small ones are read)
MAX_NAME_CHARS = 4096  # a C++ template kernel name runs to ~2,000 characters; longer ones are cut when kept
SHOW_CHARS = 60  # names in messages
MAX_KERNELS = 2_000_000  # ~500 MB of kept kernels; a decode comparison needs a few steps (~10^4 kernels)
MAX_NAMES = 20_000  # distinct kernel names; each is matched against every engine's patterns (a step: ~10^2)
KERNEL_CATS = frozenset({"kernel", "cuda_kernel", "gpu_kernel"})  # lower-cased `cat` of real GPU kernels
MOE_SIM_KINDS = frozenset(KernelKind.__args__)  # type: ignore[attr-defined]
GEMM_OPS = frozenset({"aten::mm", "aten::addmm", "aten::linear", "aten::matmul"})  # CPU ops whose M is tokens
MAX_MEDIAN_KERNEL_US = 1000.0
# A kernel may start before its predecessor on the same stream ends: with programmatic dependent launch
# (PDL, Hopper+) the dependent kernel's prologue runs early; cuBLASLt's split-K reduce does this on an H200
# (tests/data/traces: 64 ns). One kernel lying wholly inside another on one stream cannot happen.
OVERLAP_TOLERANCE_US = 0.01  # profilers round ts and dur to 1 ns each
NS_FLAGS = ("timeUnit", "time_unit", "ts_unit", "clock_unit")  # metadata keys that may declare the clock
_DECODER = json.JSONDecoder()
_SPACE = re.compile(r"[ \t\r\n]*")
_ROOTS = {"str": "a string", "bool": "a boolean", "NoneType": "null", "int": "a number", "float": "a number"}


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
    gemm_tokens: Counter[int] = field(default_factory=Counter)  # M of the CPU ops' GEMMs, when recorded


def read_kernels(path: str | Path, console: Any = None) -> KernelTrace:
    """Every GPU kernel event of the file; a file that cannot be one decode trace raises UserError.
    `console`: where the progress bar of a large file goes (default: stderr, drawn on a terminal only)."""
    p = Path(path)
    trace = KernelTrace(str(p))
    source = TextSource(p, console)
    try:
        _parse(_Stream(source, p), trace)
    finally:
        source.close()
    _check(trace)
    return trace


def short(name: Any, width: int = SHOW_CHARS) -> str:
    """A name as a message shows it: control characters escaped, cut to `width` characters."""
    text = (name if isinstance(name, str) else str(name))[:width * 4]
    if not text.isprintable():
        text = text.encode("unicode_escape").decode("ascii")
    return text if len(text) <= width else text[:width - 3] + "..."


class _Stream:
    """A text buffer over the file that yields one JSON value at a time (raw_decode), refilling as needed."""

    def __init__(self, source: TextSource, path: Path) -> None:
        self.source, self.path, self.buf, self.pos, self.eof = source, path, "", 0, False

    def _more(self, want: int | None = None) -> bool:
        if self.eof:
            return False
        chunk = self.source.read(want or CHUNK_CHARS)
        self.buf, self.pos = self.buf[self.pos:] + chunk, 0
        self.eof = not chunk
        return bool(chunk)

    def peek(self) -> str:
        """The next non-space character ('' at the end of the file)."""
        while True:
            self.pos = _SPACE.match(self.buf, self.pos).end()  # type: ignore[union-attr]
            if self.pos < len(self.buf) or not self._more():
                return self.buf[self.pos:self.pos + 1]

    def here(self) -> str:
        """The text at the read position, as a message quotes it."""
        return short(self.buf[self.pos:self.pos + 20], 20)

    def expect(self, char: str, where: str) -> None:
        if self.peek() == "":
            raise UserError(f"{self.path} ends where '{char}' {where} should be: the file is cut short.")
        if self.peek() != char:
            raise UserError(f"{self.path} is not valid trace JSON: expected '{char}' {where}, "
                            f"found '{self.here()}'.")
        self.pos += 1

    def value(self, what: str = "a value") -> Any:
        """Decode the next JSON value; a value cut by the buffer's end is retried with twice the text."""
        self.peek()
        while True:
            try:
                obj, end = _DECODER.raw_decode(self.buf, self.pos)
                if end < len(self.buf) or self.eof:  # a number at the very end might continue
                    self.pos = end
                    return obj
            except RecursionError:
                raise UserError(f"{self.path} nests {what} deeper than {sys.getrecursionlimit():,} levels, "
                                "which no trace does.") from None
            except json.JSONDecodeError as exc:
                at_end = exc.pos >= len(self.buf) - 16 or exc.msg.startswith("Unterminated string")
                if self.eof and at_end:
                    raise UserError(f"{self.path} ends in the middle of {what}: the file is cut short.") from None
                if self.eof or not at_end:
                    raise UserError(f"{self.path} is not valid JSON: {exc.msg.lower()} in {what} "
                                    f"(character {exc.pos - self.pos:,} of it).") from None
            except ValueError as exc:  # e.g. an integer over Python's 4,300-digit limit
                raise UserError(f"{self.path} is not a usable trace: {short(str(exc), 80)} in {what}.") from None
            unread = len(self.buf) - self.pos
            if unread > MAX_VALUE_CHARS:
                raise UserError(f"{self.path} has {what} over {MAX_VALUE_CHARS:,} characters long, which "
                                "no trace event is (a broken or hostile file).")
            self._more(max(CHUNK_CHARS, min(unread, MAX_VALUE_CHARS + 1 - unread)))


def _parse(s: _Stream, trace: KernelTrace) -> None:
    """Top level: an object with a "traceEvents" array, or a bare array of events (both are the format)."""
    first = s.peek()
    if first == "[":
        _events(s, trace)
    elif first == "{":
        _object(s, trace)
    elif first == "":
        raise UserError(f"{s.path} holds only whitespace, no JSON.")
    else:
        try:
            kind = _ROOTS[type(s.value("the top level")).__name__]
        except (UserError, KeyError):
            raise UserError(f"{s.path} is not JSON (it starts with '{s.here()}').") from None
        raise UserError(f"{s.path} is {kind} at its top level, not a trace (an object with traceEvents).")
    if s.peek() != "":
        raise UserError(f"{s.path} has more text after its JSON ends ('{s.here()}'...); "
                        "were two traces joined?")


def _object(s: _Stream, trace: KernelTrace) -> None:
    """The top-level object: traceEvents streamed, small metadata values kept, long ones skipped."""
    s.pos += 1
    seen = False
    while s.peek() != "}":
        if s.peek() == "":
            raise UserError(f"{s.path} ends inside its top-level object: the file is cut short.")
        if s.peek() != '"':
            raise UserError(f"{s.path} is not valid JSON: a top-level key is not a string "
                            f"('{s.here()}').")
        key = str(s.value("a top-level key"))
        s.expect(":", f"after the key '{short(key)}'")
        if key == "traceEvents":
            if seen:
                raise UserError(f"{s.path} has two traceEvents arrays; were two traces joined?")
            if s.peek() != "[":
                raise UserError(f"{s.path}'s traceEvents is not an array (it starts with '{short(s.peek())}').")
            _events(s, trace)
            seen = True
        else:
            start = s.pos
            value = s.value(f"the top-level value '{short(key)}'")
            if s.pos - start <= MAX_META_CHARS:
                trace.metadata[key] = value
        if s.peek() == ",":
            s.pos += 1
        elif s.peek() != "}":
            s.expect("}", "to close the top-level object")
    s.pos += 1
    if not seen:
        raise UserError(f"{s.path} has no traceEvents array, so it is not a Chrome trace.")


def _events(s: _Stream, trace: KernelTrace) -> None:
    """Decode the events array one event at a time, keeping kernels, stream names and GEMM token counts."""
    s.expect("[", "to open traceEvents")
    keep, names, tokens, seen = trace.kernels.append, trace.stream_names, trace.gemm_tokens, set()
    n = 0
    while s.peek() != "]":
        if s.peek() == "":
            raise UserError(f"{s.path} ends inside traceEvents (after {n:,} events): the file is cut short.")
        e = s.value(f"trace event #{n + 1:,}")
        n += 1
        if s.peek() == ",":
            s.pos += 1
        elif s.peek() != "]":
            s.expect("]", f"or ',' after trace event #{n:,}")
        if not isinstance(e, dict):
            continue
        ph = e.get("ph")
        if ph == "X":
            k = _kernel(e, n, s.path)
            if k is not None:
                keep(k)
                if k.name not in seen:
                    seen.add(k.name)
                    if len(seen) > MAX_NAMES:
                        raise UserError(f"{s.path} has over {MAX_NAMES:,} distinct kernel names; a decode step "
                                        "launches a few hundred, so it is not a profile of decode steps.")
                if len(trace.kernels) > MAX_KERNELS:
                    raise UserError(f"{s.path} has over {MAX_KERNELS:,} GPU kernel events; a decode comparison "
                                    "needs a few steps: profile fewer.")
            elif isinstance(e.get("name"), str) and e["name"] in GEMM_OPS:
                _gemm_tokens(e, tokens)
        elif ph == "M" and e.get("name") == "thread_name":
            args = e.get("args") if isinstance(e.get("args"), dict) else {}
            names[(_ident(e.get("pid"), n, "pid", s.path), _ident(e.get("tid"), n, "tid", s.path))] = \
                short(args.get("name", ""), MAX_NAME_CHARS)
    s.pos += 1
    trace.events_read = n


def _kernel(e: dict, n: int, path: Path) -> KernelEvent | None:
    """The kernel event `e` (the n-th event), None for events that are not kernels; bad fields refused."""
    cat = str(e.get("cat", ""))[:64].lower()
    args = e.get("args") if isinstance(e.get("args"), dict) else {}
    key = args.get("key") if cat in MOE_SIM_KINDS else None
    if cat not in KERNEL_CATS and key is None:
        return None
    raw = e.get("name", "")
    name = raw if isinstance(raw, str) else json.dumps(raw)[:MAX_NAME_CHARS]
    where = f"kernel event #{n:,} ('{short(name)}')"
    ts, dur = _number(e, "ts", where, path), _number(e, "dur", where, path)
    if dur < 0:
        raise UserError(f"{path}: {where} lasts {dur:g} µs; a duration cannot be negative.")
    if not math.isfinite(ts + dur):
        raise UserError(f"{path}: {where} ends at {ts + dur:g} µs, beyond any clock.")
    if len(name) > MAX_NAME_CHARS:
        name = name[:MAX_NAME_CHARS - 3] + "..."
    stream = (_ident(e.get("pid"), n, "pid", path), _ident(e.get("tid"), n, "tid", path))
    return KernelEvent(sys.intern(name), stream, ts, dur, sys.intern(short(key, MAX_NAME_CHARS)) if key is not None
                       else None)


def _number(e: dict, field_: str, where: str, path: Path) -> float:
    value = e.get(field_)
    if value is None:
        raise UserError(f"{path}: {where} has no {field_}; a kernel event needs ts and dur (ph 'X').")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UserError(f"{path}: {where} has {field_} {short(json.dumps(value), 30)}, not a number.")
    x = float(value)
    if not math.isfinite(x):
        raise UserError(f"{path}: {where} has {field_} {x}, not a finite number.")
    return x


def _ident(value: Any, n: int, field_: str, path: Path) -> Any:
    """A pid or tid: a number or a short string (they key dictionaries, so nothing unhashable or huge)."""
    if value is None or isinstance(value, (int, float)):
        return value
    if isinstance(value, str):
        return sys.intern(short(value, 200))
    raise UserError(f"{path}: trace event #{n:,} has a {field_} that is {type(value).__name__}, not a number "
                    "or a string.")


def _gemm_tokens(e: dict, tokens: Counter[int]) -> None:
    """M (tokens) of a CPU-side GEMM op from its recorded input shapes: the rows of its first input."""
    dims = (e.get("args") or {}).get("Input Dims") if isinstance(e.get("args"), dict) else None
    if isinstance(dims, list) and dims and isinstance(dims[0], list) and len(dims[0]) >= 2 and \
            all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in dims[0]):
        m = math.prod(dims[0][:-1])
        if len(tokens) < 1000 or m in tokens:
            tokens[m] += 1


def _check(trace: KernelTrace) -> None:
    """Refuse what would make the comparison meaningless: no kernels, a ns clock, one kernel inside another."""
    if not trace.kernels:
        raise UserError(f"{trace.path} has {trace.events_read:,} trace events but no GPU kernel events "
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
            if abs(b.ts - a.ts) <= OVERLAP_TOLERANCE_US and abs(b.end - a.end) <= OVERLAP_TOLERANCE_US:
                raise UserError(f"{trace.path}: kernel '{short(b.name)}' appears twice at {b.ts:.3f} µs on stream "
                                f"{short(stream)}; was the trace (or a part of it) written twice?")
            if b.end < a.end - OVERLAP_TOLERANCE_US:
                raise UserError(f"{trace.path}: kernel '{short(b.name)}' lies inside '{short(a.name)}' on stream "
                                f"{short(stream)} (at {b.ts:.3f} µs), which one CUDA stream cannot do; were two "
                                "streams or GPUs merged into one track?")


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


