"""Benchmark: how fast can this CPU turn MXFP4 bytes into a product? A roofline for the routed experts.

    python benchmarks/mxfp4_roofline.py [--threads T] [--json]

One full-size Kimi K3 expert part (W^T [3072, 3584]: 5.5 MB packed) and x [1, 3584] float64 (the fp64
check's batch 1), each figure the median of 7, in GB/s of packed bytes (codes + scales) read:
- copy: the STREAM copy of benchmarks/fullsize.py (bytes read + written, all threads), and read: a read
  alone (its `read_gbps`, bytes read), the memory roof of a kernel that only reads;
- decode: every block decoded and scaled into L1 scratch, no arithmetic with x (`decode_block`, all
  threads): the most a decode-then-dot kernel can reach, whatever its dot costs;
- decode (pair table): the same with the former 8-byte table load per code byte;
- matmul: `fast.mxfp4_matmul` on the whole part (all threads), and on one TP16 rank's shards (192
  rows for gate/up, a 192-row K slice of the down part: what the plans called before the grouped kernel,
  on one thread);
- grouped (what the routed experts run now, `fast.mxfp4_grouped` with the AVX-512 `mxfp4_dot`): the whole
  part with x in float64, float32 and bfloat16 values (the W4A16 path: `vdpbf16ps` where the host has AVX-512
  BF16), all threads and one thread, and the 16 TP16 row shards of a down part in one call (96-byte rows,
  each rank's own x, read row by row as one run), all threads; each through `grouped_matmul` (the Python
  that builds the tables and work items included) and as `_kernel_gbps`, the compiled call alone on the
  arguments it built: on one 5.5 MB part the Python is 0.1-0.4 ms beside a ~0.4 ms kernel (Xeon VM,
  2026-12-02, bf16 on 2 threads: 7-11 GB/s through grouped_matmul, 14.6 the call alone).

Half the copy bandwidth needs decode >= copy / 2 before any multiply; the gap between decode and matmul is
the dot product and the per-row overhead. The grouped kernel's roof is its own arithmetic (kernels.py's
napkin math): the part is 5.5 MB, so after the first pass it is read from the 48 MB L3, and these figures
are the compute roof, above what the layer's streaming from memory reaches.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numba
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fullsize import call_seconds, copy_gbps, grouped_calls, read_gbps  # noqa: E402

from simulator.fast import kernels as fast  # noqa: E402

GB = 1e9


@numba.njit(parallel=True, fastmath=fast.FAST)
def _decode_only(packed, scale_bits, half_scale, sink):  # type: ignore[no-untyped-def]
    N, H = packed.shape
    for c in numba.prange(numba.get_num_threads()):
        even, odd = np.empty(H, np.float32), np.empty(H, np.float32)
        keep = np.float32(0)  # what the decode made, kept in a register so that it is not optimised away
        for n in range(c * N // numba.get_num_threads(), (c + 1) * N // numba.get_num_threads()):
            for b in range(H // 16):
                fast.decode_block(packed[n], 16 * b, half_scale[scale_bits[n, b]], even, odd)
            keep += even[n % H] + odd[0]
        sink[16 * c] = keep  # one write per thread, a cache line apart


PAIRS = np.stack([fast.E2M1[np.arange(256) & 15], fast.E2M1[np.arange(256) >> 4]], axis=1).astype(np.float32)
PAIRS = PAIRS.view(np.uint64)[:, 0].copy()  # byte -> both nibbles' values, the former decode


@numba.njit(parallel=True, fastmath=fast.FAST)
def _decode_pairs(packed, pairs, sink):  # type: ignore[no-untyped-def]
    N, H = packed.shape
    for c in numba.prange(numba.get_num_threads()):
        w = np.empty(H, np.uint64)
        keep = np.uint64(0)
        for n in range(c * N // numba.get_num_threads(), (c + 1) * N // numba.get_num_threads()):
            row = packed[n]
            for j in range(H):
                w[j] = pairs[row[j]]
            keep += w[n % H]
        sink[16 * c] = np.float32(keep & np.uint64(1))


def grouped_figures(rng, codes, bits, down_codes, down_bits, part, threads):  # type: ignore[no-untyped-def]
    """GB/s of `fast.mxfp4_grouped` (packed bytes read): the whole part, and a down part's 16 row shards."""
    from simulator.dtypes import round_bf16
    from simulator.fast.packed import MXFP4Weight, grouped_matmul
    if not fast.has_avx512():  # grouped_matmul declines (returns None): timing it would time nothing
        return {"grouped": "skipped: no AVX-512 on this host (the plans run shard by shard)"}
    whole, down = MXFP4Weight(codes, bits), MXFP4Weight(down_codes, down_bits)
    doc = {}
    for name, dtype, values in (("fp64", np.float64, None), ("fp32", np.float32, None),
                                ("bf16", np.float32, round_bf16)):
        if name == "bf16" and not fast.has_bf16_dot():
            doc["grouped_bf16"] = "skipped: no AVX-512 BF16 on this host (bfloat16 x runs the float32 kernel)"
            continue
        x = rng.standard_normal((1, codes.shape[1] * 2)).astype(dtype)
        hs = [h[None] for h in rng.standard_normal((16, down_codes.shape[1] * 2 // 16)).astype(dtype)]
        x, hs = (x, hs) if values is None else (values(x), [values(h) for h in hs])
        for label, t in (("", threads), ("_one_thread", 1)):
            numba.set_num_threads(t)
            doc[f"grouped_part_{name}{label}_gbps"] = part / median_s(
                lambda: grouped_matmul([x], [(np.arange(1), (whole,))])) / GB
            args = kernel_args(lambda: grouped_matmul([x], [(np.arange(1), (whole,))]))
            doc[f"grouped_part_{name}{label}_kernel_gbps"] = part / median_s(lambda: fast.mxfp4_grouped(*args)) / GB
        numba.set_num_threads(threads)
        doc[f"grouped_down_shards_{name}_gbps"] = part / median_s(
            lambda: grouped_matmul(hs, [(np.arange(1), (down,))], ("row",))) / GB
        args = kernel_args(lambda: grouped_matmul(hs, [(np.arange(1), (down,))], ("row",)))
        doc[f"grouped_down_shards_{name}_kernel_gbps"] = part / median_s(lambda: fast.mxfp4_grouped(*args)) / GB
    return doc


def kernel_args(call):  # type: ignore[no-untyped-def]
    """The arguments `grouped_matmul` hands `fast.mxfp4_grouped` (permuted x, weight table, work items) in
    call(), captured: timing the compiled call on them leaves out the Python that builds them, which on one
    5.5 MB part is a quarter to half of the time."""
    seen = []
    with grouped_calls(lambda args, seconds: seen.append(args)):
        call()
    return seen[0]


def median_s(f, repeats: int = 7) -> float:  # type: ignore[no-untyped-def]
    return float(np.median(call_seconds(f, repeats)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=numba.get_num_threads())
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    numba.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    k, n, tp = 3584, 3072, 16
    codes, bits = fast.mxfp4_quantize_t(rng.standard_normal((k, n), dtype=np.float32) * np.float32(k ** -0.5))
    x = rng.standard_normal((1, k))
    part = codes.nbytes + bits.nbytes
    sink = np.zeros(16 * numba.get_num_threads(), np.float32)
    down_codes, down_bits = fast.mxfp4_quantize_t(rng.standard_normal((n, k), dtype=np.float32) * np.float32(n ** -0.5))
    f = n // tp  # one rank's intermediate rows
    gate = (codes[:f], bits[:f])  # a column shard: rows of W^T
    down = (down_codes[:, :f // 2], down_bits[:, :f // 32])  # a row shard: a K slice of W_down^T
    shard_bytes = gate[0].nbytes + gate[1].nbytes
    doc = {"threads": numba.get_num_threads(), "copy_gbps": copy_gbps(), "read_gbps": read_gbps(),
           "decode_gbps": part / median_s(lambda: _decode_only(codes, bits, fast.E8M0_HALF_F32, sink)) / GB,
           "decode_pair_table_gbps": part / median_s(lambda: _decode_pairs(codes, PAIRS, sink)) / GB,
           "matmul_part_gbps": part / median_s(lambda: fast.mxfp4_matmul(x, codes, bits)) / GB,
           "matmul_gate_shard_gbps": shard_bytes / median_s(lambda: fast.mxfp4_matmul(x, *gate)) / GB,
           "matmul_down_shard_gbps": shard_bytes / median_s(lambda: fast.mxfp4_matmul(x[:, :f], *down)) / GB}
    doc |= grouped_figures(rng, codes, bits, down_codes, down_bits, part, args.threads)
    doc = {k: round(v, 2) if isinstance(v, float) else v for k, v in doc.items()}
    doc["decode_vs_copy"] = round(doc["decode_gbps"] / doc["copy_gbps"], 3)
    print(json.dumps(doc, indent=2) if args.json else "\n".join(f"{k:26s} {v}" for k, v in doc.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
