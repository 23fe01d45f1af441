"""The GPU suite's KDA / MLA Triton kernels against simulator/ops, on a CPU under Triton's interpreter
(a subprocess with TRITON_INTERPRET=1), and the collective runner's host-side logic (sizes, rows, skew,
unsupported impls) on two gloo ranks. Skipped where torch or triton is missing (CI).
"""

from __future__ import annotations

import csv
import importlib.util
import json
import multiprocessing
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if importlib.util.find_spec("triton") is None:  # not imported here: the interpreter must be on before it is
    pytest.skip("triton is not installed", allow_module_level=True)

GPU_DIR = Path(__file__).resolve().parent.parent / "benchmarks" / "gpu"
sys.path.insert(0, str(GPU_DIR))

import fam_attention as fa  # noqa: E402
import fam_collective as fc  # noqa: E402
import points  # noqa: E402


KDA_CASES = [(2, 1, 2, False), (1, 3, 1, False), (1, 3, 2, True)]  # B, T, N, per_token
KDA_SPLIT_CASES = [(2, 1, 2, False, 8), (1, 2, 1, False, 16), (1, 3, 2, True, 8), (2, 3, 1, True, 32)]  # + BV
MLA_CASES = [(2, 1, 3, 200, 2), (1, 2, 12, 150, 4)]  # B, T, heads, S, SMs (so that there are several splits)
def _compare_all(kda_cases: list, mla_cases: list) -> dict:
    """Every kernel comparison; runs in a process where TRITON_INTERPRET=1 was set before triton's import."""
    out = {"kda": [fa.kda_compare(torch, "cpu", B, T, N, pt, seed=B + T) for B, T, N, pt in kda_cases],
           "kda_split": [fa.kda_compare(torch, "cpu", B, T, N, pt, seed=B + T, impl="triton_split_v", bv=bv)
                         for B, T, N, pt, bv in KDA_SPLIT_CASES],
           "mla": [[fa.mla_compare(torch, "cpu", B, T, h, S, fmt, sms=sms) for fmt in ("bf16", "fp8")]
                   for B, T, h, S, sms in mla_cases]}
    real = fa.MlaWork.__call__
    fa.MlaWork.__call__ = lambda self, ql, qp, c, o, s, kv=1.0: real(self, ql, qp, c, o, s)  # drops the fp8 scale
    out["wrong_scale"] = fa.mla_compare(torch, "cpu", 1, 1, 2, 70, "fp8", sms=1)
    return out


def _child(conn, kda_cases: list, mla_cases: list) -> None:
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        conn.send(_compare_all(kda_cases, mla_cases))
    except BaseException as exc:  # noqa: BLE001 - reported by the parent
        import traceback
        conn.send({"error": f"{exc!r}\n{traceback.format_exc()}"})


_DRIVER = """
import json, sys
sys.path[:0] = [sys.argv[1], sys.argv[2]]
import test_gpu_kernels_attention as t
print("RESULT " + json.dumps(t._compare_all(json.loads(sys.argv[3]), json.loads(sys.argv[4]))))
"""


@pytest.fixture(scope="module")
def interpreted():
    """All kernel comparisons in a process whose triton is imported with TRITON_INTERPRET=1 (triton.language's
    own jit helpers are built at import, so the variable cannot be flipped in a process that has triton):
    a fork of this one when triton is not imported yet (cheap), else a fresh interpreter. Not a fork once
    a parallel Numba kernel has run here: GNU OpenMP's thread pool does not survive a fork, and the child
    hangs in its first parallel kernel (the simulator's ops run them)."""
    from numba.np.ufunc import parallel
    forkable = "triton" not in sys.modules and not getattr(parallel, "_is_initialized", True)
    if forkable and "fork" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("fork")
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_child, args=(child, KDA_CASES, MLA_CASES))
        proc.start()
        assert parent.poll(300), "interpreter run timed out"
        res = parent.recv()
        proc.join(30)
        assert "error" not in res, res.get("error")
        return res
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    args = [sys.executable, "-c", _DRIVER, str(Path(__file__).resolve().parent), str(GPU_DIR),
            json.dumps(KDA_CASES), json.dumps(MLA_CASES)]
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    return json.loads(lines[-1].removeprefix("RESULT "))


@pytest.mark.parametrize("case", range(len(KDA_CASES)))
def test_kda_kernel_matches_simulator(interpreted, case):
    """Conv + SiLU, L2 norm, decay, delta rule, gated RMSNorm, state and history: fp32 vs float64 simulator."""
    assert interpreted["kda"][case] < 2e-4, (KDA_CASES[case], interpreted["kda"][case])


@pytest.mark.parametrize("case", range(len(KDA_SPLIT_CASES)))
def test_kda_split_v_kernels_match_simulator(interpreted, case):
    """The split-V kernel + gated-norm kernel pair (T = 2 exercises the history shift that mixes old history
    and new inputs) against the same float64 simulator, per_token and final, BV 8 / 16 / 32."""
    assert interpreted["kda_split"][case] < 2e-4, (KDA_SPLIT_CASES[case], interpreted["kda_split"][case])


def test_kda_split_v_points_mirror_the_one_program_points():
    """Every one-program point has its split-V twin; the split-V kernel alone also runs the batches around
    the L2 size (KDA_B_L2, KDA_B_ABSORB, KDA_B_DRAIN), appended after the twins so the measured grid's halves
    stay as they were."""
    kda = points.kda_points()
    one = [p for p in kda if p.impl == "triton"]
    split = [p for p in kda if p.impl == "triton_split_v"]
    twins, extra = split[:len(one)], split[len(one):]
    assert kda == one + split and len(one) > 0
    assert [p.id.replace("/triton_split_v/", "/triton/") for p in twins] == [p.id for p in one]
    extra_b = set(points.KDA_B_L2) | {b for grid in (points.KDA_B_ABSORB, points.KDA_B_DRAIN)
                                      for bs in grid.values() for b in bs}
    assert {p.B for p in extra} == extra_b and not extra_b & set(points.KDA_B)
    assert len({p.id for p in kda}) == len(kda)


@pytest.mark.parametrize("fmt", [0, 1])
@pytest.mark.parametrize("case", range(len(MLA_CASES)))
def test_mla_kernels_match_simulator(interpreted, case, fmt):
    B, T, heads, S, sms = MLA_CASES[case]
    splits, chunk = fa.mla_splits(B, S, sms)
    assert splits > 1 and (splits - 1) * chunk < S <= splits * chunk  # the combine kernel has work to do
    assert interpreted["mla"][case][fmt] < 1e-4, (MLA_CASES[case], ("bf16", "fp8")[fmt], interpreted["mla"][case])


def test_mla_comparison_can_fail(interpreted):
    """A kernel call that drops the FP8 cache scale is caught by the same comparison."""
    assert interpreted["wrong_scale"] > 1e-2


def test_mla_splits_fill_the_gpu():
    for B in (1, 8, 32, 64):
        for S in (512, 2048, 8192, 32768, 131072):
            splits, chunk = fa.mla_splits(B, S, 132)
            assert chunk % fa.MLA_BLOCK_N == 0 and (splits - 1) * chunk < S <= splits * chunk
            assert B * splits >= 240 or chunk == fa.MLA_BLOCK_N  # ~2 x 132 SMs


def test_collective_shapes():
    assert fc.shapes("nccl_all_reduce", 4096, 2) == (2048, 2048)
    assert fc.shapes("nccl_reduce_scatter", 4096, 2) == (2048, 1024)
    assert fc.shapes("nccl_all_gather", 4096, 2) == (2048, 4096)
    assert fc.shapes("symm_two_shot", 4096, 2) == (2048, 2048)
    with pytest.raises(ValueError):
        fc.shapes("nccl_broadcast", 4096, 2)
    s = fc.summarise([[2.0, 1.0, 3.0], [5.0, 4.0, 6.0]])
    assert (s["median_us"], s["p10_us"], s["p90_us"], s["skew_us"]) == (5.0, 4.0, 6.0, 3.0)
    assert os.environ["NCCL_NVLS_ENABLE"] == "0" and os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"


def _gloo_rank(rank: int, out: str, port: int, pts: list) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    sys.path.insert(0, str(GPU_DIR))
    import fam_collective
    assert fam_collective.run_distributed(pts, Path(out), 120, backend="gloo", reps=2, replays=3) == 0


def test_collective_rows_on_two_gloo_ranks(tmp_path):
    import torch.distributed as dist
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("no gloo backend")
    wanted = {("nccl_all_reduce", 1024), ("symm_one_shot", 1024), ("symm_one_shot", 2048),
              ("nccl_reduce_scatter", 1024), ("nccl_all_gather", 2048)}
    pts = [p for p in points.points_of(family="collective") if (p.impl, p.n_bytes) in wanted]
    assert len(pts) == len(wanted)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    procs = [ctx.Process(target=_gloo_rank, args=(rank, str(tmp_path), port, pts)) for rank in range(2)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(120)
    assert [proc.exitcode for proc in procs] == [0, 0]
    rows = list(csv.DictReader((tmp_path / "collective.csv").open()))
    assert [r["id"] for r in rows] == [p.id for p in pts]
    by = {(r["impl"], int(r["n_bytes"])): r for r in rows}
    for impl in ("nccl_all_reduce", "nccl_reduce_scatter", "nccl_all_gather"):
        r = next(v for k, v in by.items() if k[0] == impl)
        assert r["status"] == "ok" and float(r["median_us"]) > 0 and r["replays"] == "3"
        assert float(r["p10_us"]) <= float(r["p90_us"]) and r["P"] == "2"
    assert all(by[("symm_one_shot", n)]["status"].startswith("unsupported:") for n in (1024, 2048))
    skew = list(csv.DictReader((tmp_path / "collective_skew.csv").open()))
    assert len(skew) == 3 and all(len(r["rank_medians_us"].split()) == 2 and float(r["skew_us"]) >= 0 for r in skew)
    assert (tmp_path / "env_B.json").exists()
    assert np.isfinite([float(r["median_us"]) for r in rows if r["status"] == "ok"]).all()
