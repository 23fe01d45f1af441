"""The GPU suite's MoE and small-kernel families (benchmarks/gpu/fam_moe.py, fam_small.py).

Host-side logic (routing over exactly U experts, moe_align-style blocks, cold-weight rotation) runs
everywhere. The Triton kernels run on the CPU through Triton's interpreter (TRITON_INTERPRET=1, set
before the kernels are defined) against the simulator's numpy references; without torch or Triton
(CI) those tests skip.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

GPU_DIR = Path(__file__).resolve().parent.parent / "benchmarks" / "gpu"
if str(GPU_DIR) not in sys.path:
    sys.path.insert(0, str(GPU_DIR))

import fam_moe  # noqa: E402  (host side only needs numpy)
import points  # noqa: E402
from harness import COLD_FACTOR, L2_BYTES_H200  # noqa: E402


# ===================================================================== host side (no torch needed)
@pytest.mark.parametrize("m,top_k,u", [(1, 16, 16), (4, 16, 62), (64, 16, 896), (8, 16, 128), (3, 4, 7)])
def test_routing_touches_exactly_u_experts(m, top_k, u):
    idx = fam_moe.routing(m, top_k, u)
    assert idx.shape == (m, top_k)
    assert set(idx.ravel()) == set(range(u))
    assert all(len(set(row)) == top_k for row in idx)  # a token never picks an expert twice
    assert np.array_equal(idx, fam_moe.routing(m, top_k, u))  # fixed seed


def test_routing_refuses_impossible_u():
    with pytest.raises(ValueError):
        fam_moe.routing(1, 16, 17)


@pytest.mark.parametrize("block_m", [16, 64])
def test_align_blocks_is_a_padded_sort_by_expert(block_m):
    flat = fam_moe.routing(20, 4, 9).ravel()
    ids, experts = fam_moe.align_blocks(flat, 9, block_m)
    assert len(ids) == len(experts) * block_m
    real = ids[ids < len(flat)]
    assert sorted(real) == list(range(len(flat)))  # every routed row exactly once
    assert set(ids[ids >= len(flat)]) <= {len(flat)}  # pad id = R
    for b, e in enumerate(experts):
        rows = ids[b * block_m:(b + 1) * block_m]
        assert all(flat[r] == e for r in rows if r < len(flat))


def test_every_moe_point_reads_its_weights_cold():
    """U experts x slots windows fit in E, and either the rotation spans >= 4 x L2 or one window alone does."""
    for p in points.points_of(family="moe"):
        hp = fam_moe.plan(p)
        per_call = p.U * fam_moe.bytes_per_expert(p.impl, p.K, p.N)
        assert hp["slots"] * p.U <= hp["E"], p.id
        assert hp["slots"] * per_call >= 0.9 * COLD_FACTOR * L2_BYTES_H200, p.id
        assert len(set(hp["idx"].ravel())) == p.U, p.id


# ===================================================================== Triton kernels under the interpreter
# In a subprocess: TRITON_INTERPRET must be set before triton.language is first imported, which another
# test module of the session may already have done. One subprocess runs every kernel check and the two
# deliberately broken variants (a nibble-swapped weight read, SiTU with b1 / b2 swapped) and prints JSON.
_SCRIPT = r"""
import json, sys
sys.path[:0] = [sys.argv[1], sys.argv[2]]
import numpy as np, torch
import fam_moe, fam_small
from simulator.config import load_model
from simulator.ops import experts
out = {"moe": fam_moe.check("cpu"), "small": fam_small.check("cpu")}
launch = fam_moe.w4a16_launch
fam_moe.w4a16_launch = lambda a, w, *r, **k: launch(a, (w >> 4) | (w << 4), *r, **k)
out["moe_swapped"] = fam_moe.check("cpu")
cfg = load_model("kimi-k3")
x = torch.randn(2, 128, generator=torch.Generator().manual_seed(0)).mul(8).to(torch.bfloat16)
y = torch.empty(2, 64, dtype=torch.bfloat16)
fam_small.situ_mul(x, y, cfg.situ_linear_beta, cfg.situ_beta)
xn = x.float().numpy().astype(np.float64)
ref = experts.glu(xn[:, :64], xn[:, 64:], cfg)
out["situ_swapped_err"] = float(np.abs(y.float().numpy() - ref).max() / np.abs(ref).max())
print("RESULT" + json.dumps(out))
"""


@pytest.fixture(scope="module")
def interp():
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    import os
    import subprocess
    root = GPU_DIR.parent.parent
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, str(GPU_DIR), str(root)], capture_output=True, text=True,
                          env=env, cwd=root, timeout=300)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")), None)
    assert line is not None, f"kernel checks crashed (rc {proc.returncode}):\n{proc.stderr[-3000:]}"
    return json.loads(line[len("RESULT"):])


def _failures(results):
    return [f"{label}: {detail}" for label, ok, detail in results if not ok]


def test_w4a16_grouped_gemm_matches_mxfp4_reference(interp):
    assert len(interp["moe"]) == 3 and not _failures(interp["moe"]), _failures(interp["moe"])


def test_w4a16_check_catches_a_wrong_nibble_order(interp):
    """A kernel reading the high nibble as the even element must fail the same check."""
    assert all(not ok for _, ok, _ in interp["moe_swapped"]), interp["moe_swapped"]


def test_small_kernels_match_simulator_ops(interp):
    assert len(interp["small"]) == 8 and not _failures(interp["small"]), _failures(interp["small"])


def test_small_reference_catches_a_wrong_activation(interp):
    """SiTU with b1 and b2 swapped is far from experts.glu: the comparison used by the check can fail."""
    assert interp["situ_swapped_err"] > 0.05
