"""Benchmark: reading a 200 MB torch-profiler trace with compare-trace's streaming reader, time and peak RSS.

    python benchmarks/bench_trace_parse.py              # 200 MB, written to a temporary folder
    python benchmarks/bench_trace_parse.py --mb 50 --keep out/big.json

The synthetic trace is shaped like torch.profiler's export_chrome_trace of a long decode run: per GPU
kernel a CPU op, a cudaLaunchKernel runtime event and a flow event beside the kernel event (so kernels
are a quarter of the events, as in real exports), the GPU suite's mini layer repeated. It is written
event by event (little memory), then read in a child process so the peak RSS is the reader's alone;
the child also runs the whole comparison (layers, alignment) against the torch-mini engine.
Targets (issue 14): under 30 s and under 2 GB.
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
    doc, _ = compare_trace(path, load_model("kimi-k3"), load_hardware("h200"), 8, DecodeShape(8, 1, 512), "kda",
                           engine="torch-mini")
    t2 = time.perf_counter()
    print(json.dumps({"parse_s": round(t1 - t0, 2), "compare_s": round(t2 - t1, 2), "events": trace.events_read,
                      "kernels": len(trace.kernels), "layers_found": doc["layers_found"], "matched": doc["matched"]}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=200.0, help="size of the synthetic trace (MB)")
    ap.add_argument("--keep", help="write the trace here and keep it (default: a temporary folder)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args.child)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(args.keep) if args.keep else Path(tmp) / "synthetic.json"
        t0 = time.perf_counter()
        events = write_trace(path, args.mb)
        print(f"wrote {path.stat().st_size / 1e6:.0f} MB, {events:,} events in {time.perf_counter() - t0:.1f} s")
        out = subprocess.run([sys.executable, __file__, "--child", str(path)], capture_output=True, text=True, check=True)
        peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # Linux: kB
        res = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"read {res['kernels']:,} kernels of {res['events']:,} events in {res['parse_s']} s; "
              f"whole compare-trace (reading it again) {res['compare_s']} s ({res['layers_found']:,} layers, {res['matched']} kernels matched); "
              f"peak RSS {peak_mb:.0f} MB (targets: 30 s, 2,000 MB)")


if __name__ == "__main__":
    main()
