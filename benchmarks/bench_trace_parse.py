"""Benchmark: reading a 200 MB torch-profiler trace with compare-trace's streaming reader, time and peak RSS;
and with --hostile, every hostile file of tests/hostile_traces.py at full size (the 1 GB gzip, the
50-million-character name, 200,000 levels of nesting), each refused in its own process: time and peak RSS.

    python benchmarks/bench_trace_parse.py              # 200 MB, written to a temporary folder
    python benchmarks/bench_trace_parse.py --mb 50 --keep out/big.json
    python benchmarks/bench_trace_parse.py --hostile    # the sweep at full size (largest file: the 50 MB name)

The synthetic trace is shaped like torch.profiler's export_chrome_trace of a long decode run: per GPU
kernel a CPU op, a cudaLaunchKernel runtime event and a flow event beside the kernel event (so kernels
are a quarter of the events, as in real exports), the GPU suite's mini layer repeated. It is written
event by event (little memory), then read in a child process so the peak RSS is the reader's alone;
the child also runs the whole comparison (layers, alignment) against the torch-mini engine.
The child reads the trace once alone (parse_s), then runs the whole comparison with the engine detected
from the kernel names, as `moe-sim compare-trace` without --engine does (compare_s, reading it again).
Targets (issues 14 and 33): under 30 s and under 2 GB, on the 2-core VM.

Measured there (2 cores shared with other work): 200 MB, 845,760 events, 211,440 kernels read in ~12 s
at a load of ~1.7 (~16 s at ~4); the whole comparison with the engine detected ~13 s (~23 s); peak RSS
~170 MB. --hostile: all 55 cases refused in one line with exit 2, the slowest the 1 GB gzips (refused at
512 MiB of text) in ~4 s, the largest RSS the 50-million-character name, ~95 MB.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

NAMES = [  # the mini layer as torch names it (tests/test_compare_trace.py MINI_LAYER), with durations
    ("nvjet_tst_64x8_64x16_4x1_v_bz_TNT", 6.1), ("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0", 2.2),
    ("nvjet_tst_128x8_64x12_2x1_v_bz_TNN", 4.8), ("nvjet_tst_64x8_64x16_4x1_v_bz_TNT", 5.3),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::silu_kernel_cuda>", 1.1),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::mul_kernel_cuda>", 1.0),
    ("nvjet_tst_64x8_64x16_4x1_v_bz_TNT", 3.9),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::sigmoid_kernel_cuda>", 1.0),
    ("void at::native::sbtopk::gatherTopK<float, unsigned int, 2, false>", 4.4),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>>", 1.2),
]


def write_trace(path: Path, megabytes: float) -> int:
    """Write kernel groups until the file passes `megabytes`; returns the number of events."""
    target, n, ts, corr = megabytes * 1e6, 0, 1000.0, 0
    with path.open("w", encoding="utf-8") as f:
        f.write('{"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H200"}], "traceEvents": [\n')
        while f.tell() < target:
            for name, dur in NAMES:
                corr += 1
                cpu = {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 4242, "tid": 4242, "ts": ts - 20,
                       "dur": 8.5, "args": {"External id": corr, "Sequence number": corr, "Fwd thread id": 0,
                                            "Record function id": 0, "Ev Idx": corr}}
                rt = {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 4242, "tid": 4242,
                      "ts": ts - 10, "dur": 4.1, "args": {"External id": corr, "cbid": 211, "correlation": corr}}
                flow = {"ph": "f", "id": corr, "pid": 0, "tid": 7, "ts": ts, "cat": "ac2g", "name": "ac2g", "bp": "e"}
                kernel = {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": round(ts, 3), "dur": dur,
                          "args": {"External id": corr, "queued": 0, "device": 0, "context": 1, "stream": 7,
                                   "correlation": corr, "registers per thread": 32, "shared memory": 0,
                                   "blocks per SM": 1.0, "warps per SM": 4.0, "grid": [132, 1, 1], "block": [128, 1, 1],
                                   "est. achieved occupancy %": 6}}
                for e in (cpu, rt, flow, kernel):
                    f.write(("," if n else "") + json.dumps(e) + "\n")
                    n += 1
                ts += dur + 2.0
        f.write('], "traceName": "synthetic", "displayTimeUnit": "ms"}\n')
    return n


def child(path: str) -> None:
    """Read (and compare) the trace, print one JSON line with the times; RSS is read by the parent."""
    from simulator.config import load_model
    from simulator.hardware import load_hardware
    from simulator.plans.kernel import DecodeShape
    from simulator.report.trace_compare import compare_trace
    from simulator.report.trace_reader import read_kernels
    t0 = time.perf_counter()
    trace = read_kernels(path)
    t1 = time.perf_counter()
    doc, _ = compare_trace(path, load_model("kimi-k3"), load_hardware("h200"), 8, DecodeShape(8, 1, 512), "kda")
    t2 = time.perf_counter()
    print(json.dumps({"parse_s": round(t1 - t0, 2), "compare_s": round(t2 - t1, 2), "events": trace.events_read,
                      "kernels": len(trace.kernels), "layers_found": doc["layers_found"], "matched": doc["matched"],
                      "engine": doc["engine"]}))


def hostile_child(path: str) -> None:
    """Run `moe-sim compare-trace` on one hostile file; print its exit code, refusal, time and own peak RSS."""
    import contextlib
    import io
    from typer.testing import CliRunner
    from simulator.cli import app
    t0 = time.perf_counter()
    with contextlib.redirect_stderr(io.StringIO()):
        r = CliRunner().invoke(app, ["compare-trace", path, "--hardware", "h200", "--tp", "8", "--batch", "8",
                                     "--tokens-per-seq", "1"])
    print(json.dumps({"rc": r.exit_code, "s": round(time.perf_counter() - t0, 2), "lines": len(r.output.splitlines()),
                      "line": r.output.strip()[:400],
                      "rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}))


def hostile() -> None:
    """Every case of tests/hostile_traces.py at full size, each refused in a fresh process."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    import hostile_traces
    worst_s = worst_mb = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for name, (writer, words) in hostile_traces.cases(1.0).items():
            path = writer(Path(tmp) / f"{name}.json")
            size = path.stat().st_size if path.is_file() else 0
            out = subprocess.run([sys.executable, __file__, "--hostile-child", str(path)], capture_output=True,
                                 text=True, check=True)
            res = json.loads(out.stdout.strip().splitlines()[-1])
            ok = res["rc"] == 2 and res["lines"] == 1 and words in res["line"]
            worst_s, worst_mb = max(worst_s, res["s"]), max(worst_mb, res["rss_mb"])
            print(f"{name:22s} {size / 1e6:8.1f} MB  exit {res['rc']}  {res['s']:6.2f} s  {res['rss_mb']:5d} MB RSS  "
                  f"{'ok' if ok else 'UNEXPECTED'}: {res['line'][:110]}")
            if path.is_file():
                path.unlink()
    print(f"worst: {worst_s:.2f} s, {worst_mb:.0f} MB peak RSS (a process's own, the CLI imports included)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=200.0, help="size of the synthetic trace (MB)")
    ap.add_argument("--keep", help="write the trace here and keep it (default: a temporary folder)")
    ap.add_argument("--hostile", action="store_true", help="run the hostile-file sweep at full size instead")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--hostile-child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args.child)
    if args.hostile_child:
        return hostile_child(args.hostile_child)
    if args.hostile:
        return hostile()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(args.keep) if args.keep else Path(tmp) / "synthetic.json"
        t0 = time.perf_counter()
        events = write_trace(path, args.mb)
        print(f"wrote {path.stat().st_size / 1e6:.0f} MB, {events:,} events in {time.perf_counter() - t0:.1f} s")
        out = subprocess.run([sys.executable, __file__, "--child", str(path)], capture_output=True, text=True,
                             check=True)
        peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # Linux: kB
        res = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"read {res['kernels']:,} kernels of {res['events']:,} events in {res['parse_s']} s; "
              f"whole compare-trace (reading it again, engine {res['engine']} detected) {res['compare_s']} s "
              f"({res['layers_found']:,} layers, {res['matched']} kernels matched); "
              f"peak RSS {peak_mb:.0f} MB (targets: 30 s, 2,000 MB)")


if __name__ == "__main__":
    main()
