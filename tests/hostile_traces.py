"""Hostile trace files for `moe-sim compare-trace`: each one a file a user's tool must refuse in one sentence.

CASES maps a name to (writer, words): `writer(path)` writes the file (and returns the path to pass, which may
differ: a folder, a missing file), `words` must appear in the one-line refusal. Shared by
tests/test_trace_hostile.py (small sizes) and benchmarks/bench_trace_parse.py --hostile (full sizes: the
1 GB gzip, the 50-million-character name), so `scale` sizes the big ones.
"""

from __future__ import annotations

import gzip
import json
import os
import zlib
from pathlib import Path
from typing import Callable

# The mini layer as torch + cuBLAS + Triton name it (tests/test_compare_trace.py MINI_LAYER, abridged).
LAYER = [("nvjet_tst_64x8_64x16_4x1_v_bz_TNT", 6.1), ("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0", 2.2),
         ("nvjet_tst_128x8_64x12_2x1_v_bz_TNN", 4.8), ("nvjet_tst_64x8_64x16_4x1_v_bz_TNT", 5.3),
         ("void at::native::vectorized_elementwise_kernel<4, at::native::silu_kernel_cuda>", 1.1),
         ("nvjet_tst_64x8_64x16_4x1_v_bz_TNT", 3.9),
         ("void at::native::sbtopk::gatherTopK<float, unsigned int, 2, false>", 4.4),
         ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>>", 1.2)]
ARGS = ["--hardware", "h200", "--tp", "8", "--batch", "8", "--tokens-per-seq", "1"]


def kernel(name: object, ts: object = 1000.0, dur: object = 2.0, **extra: object) -> dict:
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": dur,
            "args": {"stream": 7}, **extra}


def events(layers: int = 4, extra: tuple[tuple[str, float], ...] = (), start: float = 1000.0) -> list[dict]:
    """`layers` mini layers on one stream, each followed by the `extra` kernels."""
    out, ts = [], start
    for _ in range(layers):
        for name, dur in LAYER + list(extra):
            out.append(kernel(name, ts, dur))
            ts += dur + 2.0
    return out


def doc(evs: list[dict] | None = None, **top: object) -> dict:
    return {"traceEvents": events() if evs is None else evs, **top}


def _text(text: str | bytes) -> Callable[[Path], Path]:
    def write(path: Path) -> Path:
        path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
        return path
    return write


def _json(value: object) -> Callable[[Path], Path]:
    return lambda path: _text(json.dumps(value))(path)


def _gzip_of(writer: Callable[[Path], Path]) -> Callable[[Path], Path]:
    def write(path: Path) -> Path:
        plain = writer(path.with_suffix(".plain"))
        path.write_bytes(gzip.compress(plain.read_bytes()))
        plain.unlink()
        return path
    return write


def gzip_bomb(megabytes: int) -> Callable[[Path], Path]:
    """A valid trace start, then `megabytes` MB of spaces, compressed (~1 MB per GB)."""
    def write(path: Path) -> Path:
        z = zlib.compressobj(9, zlib.DEFLATED, 31)
        with path.open("wb") as f:
            f.write(z.compress(b'{"traceEvents": ['))
            block = b" " * (1 << 20)
            for _ in range(megabytes):
                f.write(z.compress(block))
            f.write(z.compress(b"]}") + z.flush())
        return path
    return write


def _hidden_bomb(megabytes: int) -> Callable[[Path], Path]:
    """The bomb, then a second small gzip member: the trailer read first states only the small one's size."""
    def write(path: Path) -> Path:
        gzip_bomb(megabytes)(path)
        with path.open("ab") as f:
            f.write(gzip.compress(b" "))
        return path
    return write


def _long_name(chars: int) -> Callable[[Path], Path]:
    def write(path: Path) -> Path:
        with path.open("w", encoding="utf-8") as f:
            f.write('{"traceEvents": [{"ph": "X", "cat": "kernel", "pid": 0, "tid": 7, "ts": 1, "dur": 1, "name": "')
            for _ in range(chars // (1 << 20)):
                f.write("k" * (1 << 20))
            f.write("k" * (chars % (1 << 20)) + '"}]}')
        return path
    return write


def _truncated_gzip(path: Path) -> Path:
    whole = gzip.compress(json.dumps(doc(events(40))).encode())
    path.write_bytes(whole[:len(whole) // 2])
    return path


def _corrupt_gzip(path: Path) -> Path:
    whole = bytearray(gzip.compress(json.dumps(doc(events(40))).encode()))
    whole[30:60] = b"\xff" * 30
    path.write_bytes(bytes(whole))
    return path


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def _folder(path: Path) -> Path:
    path.mkdir()
    return path


def _gemm_ops(m: int) -> list[dict]:
    return [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10.0 * i, "dur": 5.0,
             "args": {"Input Dims": [[m, 7168], [7168, 1024]]}} for i in range(8)]


def cases(scale: float = 1.0) -> dict[str, tuple[Callable[[Path], Path], str]]:
    """Every hostile case: name -> (writer, words of its refusal). `scale` < 1 shrinks the big files; the
    caller lowers the size limit to match (trace_source.MAX_TEXT_BYTES)."""
    deep = int(200_000 * max(scale, 0.05))
    ok = json.dumps(doc())
    return {
        # structure
        "deep-nesting": (_text('{"traceEvents": [' + "[" * deep + "]" * deep + "]}"), "deeper than"),
        "deep-nesting-object": (_text('{"traceEvents": [' + '{"a":' * deep + "1" + "}" * deep + "]}"), "deeper than"),
        "root-number": (_text("42"), "a number at its top level"),
        "root-string": (_text('"a trace"'), "a string at its top level"),
        "root-null": (_text("null"), "null at its top level"),
        "no-trace-events": (_json({"schemaVersion": 1}), "no traceEvents"),
        "trace-events-object": (_json({"traceEvents": {"ph": "X"}}), "not an array"),
        "two-trace-events": (_text('{"traceEvents": [], "traceEvents": []}'), "two traceEvents"),
        "joined-traces": (_text(ok + ok), "more text after"),
        "cut-short": (_text(ok[:len(ok) // 2]), "cut short"),
        "cut-after-events": (_text(ok[:ok.index("]") + 1] + ', "traceName": "x"'), "cut short"),
        "missing-comma": (_text('{"traceEvents": [{"ph": "M"} {"ph": "M"}]}'), "expected ']'"),
        "key-not-string": (_text('{1: 2, "traceEvents": []}'), "not a string"),
        "not-json": (_text("this is not json"), "not JSON"),
        "whitespace-only": (_text(" \n\t " * 100), "only whitespace"),
        # numbers
        "negative-dur": (_json(doc(events()[:5] + [kernel("nvjet_x", 9e5, -5.0)])), "negative"),
        "nan-dur": (_text(json.dumps(doc([kernel("k", 1.0, 2.0)])).replace("2.0", "NaN")), "not a finite"),
        "infinite-ts": (_text(json.dumps(doc([kernel("k", 1.5, 2.0)])).replace("1.5", "-Infinity")), "not a finite"),
        "overflow-ts": (_text(json.dumps(doc([kernel("k", 1.5, 2.0)])).replace("1.5", "1e999")), "not a finite"),
        "end-beyond-clock": (_json(doc([kernel("k", 1.7e308, 1.7e308)])), "beyond any clock"),
        "dur-string": (_json(doc([kernel("k", 1.0, "2.0")])), "not a number"),
        "dur-bool": (_json(doc([kernel("k", 1.0, True)])), "not a number"),
        "no-dur": (_json(doc([{k: v for k, v in kernel("k").items() if k != "dur"}])), "has no dur"),
        "no-ts": (_json(doc([{k: v for k, v in kernel("k").items() if k != "ts"}])), "has no ts"),
        "huge-integer": (_text('{"traceEvents": [{"ph": "X", "cat": "kernel", "ts": ' + "9" * 5000 + "}]}"),
                         "not a usable trace"),
        "ns-declared": (_json(doc(otherData={"timeUnit": "ns"})), "declares its clock in ns"),
        "ns-magnitudes": (_json(doc([{**e, "ts": e["ts"] * 1e3, "dur": e["dur"] * 1e3} for e in events()])),
                          "look like ns"),
        # names and ids
        "name-50M": (_long_name(int(50_000_000 * scale)), "characters long"),
        "name-100k-unmatched": (_json(doc([kernel("x" * 100_000, 1.0, 1.0)])), "no engine"),
        "name-control-chars": (_json(doc([kernel("evil\n\x1b[31m[/]\r", 1.0, 1.0)])), "no engine"),
        "name-object": (_json(doc([kernel({"nested": ["x"] * 1000}, 1.0, 1.0)])), "no engine"),
        "distinct-names": (_json(doc([kernel(f"kernel_{i}", 2.0 * i, 1.0) for i in range(int(100_000 * scale))])),
                           "distinct kernel names"),
        "pid-object": (_json(doc([{**kernel("k"), "pid": {"a": 1}}])), "pid that is dict"),
        # the kernels together
        "empty-trace": (_json(doc([])), "no GPU kernel events"),
        "no-kernels": (_json(doc([{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 1}])),
                       "no GPU kernel events"),
        "duplicate-events": (_json(doc(events() + events())), "appears twice"),
        "kernel-inside-kernel": (_json(doc([kernel("a", 0.0, 10.0), kernel("b", 2.0, 3.0)])), "lies inside"),
        "prefill-step": (_json(doc(events(extra=(("BatchPrefillWithRaggedKVCacheKernel<128>", 9.0),)))),
                         "a prefill step"),
        "mixed-batch": (_json(doc(events(extra=(("BatchPrefillWithRaggedKVCacheKernel<128>", 9.0),
                                                ("BatchDecodeWithPagedKVCacheKernel<8>", 3.0))))), "a mixed batch"),
        "prefill-tokens": (_json(doc(_gemm_ops(2048) + events())), "M = 2,048 tokens"),
        # size, compression, encoding
        "gzip-bomb": (gzip_bomb(int(1024 * scale)), "expands past"),
        "gzip-bomb-hidden": (_hidden_bomb(int(1024 * scale)), "expands past"),
        "gzip-truncated": (_truncated_gzip, "cut short"),
        "gzip-corrupt": (_corrupt_gzip, "corrupt gzip"),
        "gzip-then-garbage": (lambda p: _text(gzip.compress(ok.encode()) + b"garbage!")(p), "not gzip"),
        "gzip-of-garbage": (_gzip_of(_text(b"\x00\x01\x02\xff\xfe")), "not UTF-8"),
        "zstd": (_text(b"\x28\xb5\x2f\xfd" + os.urandom(64)), "zstd-compressed"),
        "zip": (_text(b"PK\x03\x04" + os.urandom(64)), "zip archive"),
        "utf16-bom": (_text(ok.encode("utf-16")), "UTF-16"),
        "latin1-name": (_text(json.dumps(doc([kernel("caf_", 1.0, 1.0)])).encode().replace(b"caf_", b"caf\xe9")),
                        "not UTF-8"),
        "binary-garbage": (_text(bytes(range(256)) * 64), "not"),
        "empty-file": (_text(b""), "is empty"),
        "directory": (_folder, "is a directory"),
        "missing-file": (lambda p: p, "does not exist"),
        "fifo": (_fifo, "not a regular file"),
    }
