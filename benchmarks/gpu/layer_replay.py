"""Whole-layer graph replays of the standard plan with vLLM 0.33.0's production kernels on one H200, traced.

    python benchmarks/gpu/predict_layers.py --out calibration/h200/production/layers/predictions.csv  # first
    python benchmarks/gpu/layer_replay.py --wheel-dir WHEEL_DIR --layer kda --out DIR               # GPU
    moe-sim compare-trace DIR/kda-b8t1.json.gz --engine vllm-h200 --hardware h200 --kernels vllm --tp 8 \
        --batch 8 --tokens-per-seq 1 --context 8192

For each configuration of predict_layers (the Kimi K3 KDA layer or the DeepSeek-V3 MLA layer at TP8, batch
1 / 8 / 64, 1 or 1 + 3 tokens per sequence, context 8,192) it walks the standard plan's kernels in order,
skips the collectives (one GPU: the two all-reduces are left out, as predict_layers prices them), and
launches for each plan kernel what vLLM launches on Hopper (LAUNCHES below; fam_production builds the
calls as vLLM makes them), on the plan kernel's stream (`latent_down` on a second stream, joined by the
kernels that depend on it). `--layers` layers run back to back, each with its own weights, state, cache and
activations, so each reads them from HBM. The whole thing is captured as one CUDA graph, replayed a few
times, timed with CUDA events over REPLAYS replays, and one replay is traced with torch.profiler and trimmed
to its kernel events (capture_traces.trim). Each configuration appends its row to DIR/replays.csv and its
trace to DIR/traces.tar as it finishes, so a hang loses no finished configuration.

plan key          launched (vllm 0.33.0 unless marked stand-in)
attn_res_*        K3 AttnRes: vLLM's Triton _attn_res_kernel (kimi_k3/nvidia/ops/attn_res.py, 4 blocks + prefix);
input_norm,       DeepSeek-V3's plain residual add + RMSNorm: the same kernel with no blocks (stand-in for _C's
post_attn_norm    fused_add_rms_norm, not carried)
GEMMs             cuBLAS through torch (fam_dense's calls; fp32 router logits); bmm for the MLA absorb and w_uv
kda_decode        Triton fused_recurrent_kda_packed_decode (stand-in for _C::fused_kda_decode)
kda_conv          vLLM's Triton causal_conv1d_update (mamba/ops/causal_conv1d.py)
kda_recurrent     Triton fused_recurrent_kda with a state slot per token (the verify)
kda_gated_norm    FLA's Triton rms_norm_gated (sigmoid gate), as vLLM's FusedRMSNormGated runs it
mla_norm          one torch rms_norm over the q and kv latents in 512-wide groups (stand-in: the fused q / kv norm)
mla_cache_insert  one torch copy to FP8 of the query rows and the new cache row (stand-in: the fused concat,
                  FP8 quantisation and cache insert)
mla_decode        FlashMLA fwd_kvcache_mla_fp8, split-KV + combine (metadata made once, outside the graph)
shared_act        the GPU suite's Triton SiTU-and-mul (stand-in for _C's activation, not carried)
topk              _moe_C grouped_topk, then moe_align_block_size where vLLM aligns (Marlin always; Triton when
                  M k 4 > E)
fc1 / fc2         K3: Marlin moe_wna16_marlin_gemm (MXFP4); DeepSeek-V3: Triton fused_moe_kernel (block FP8);
                  the activation between them: the suite's Triton SiTU-and-mul (stand-in). DeepSeek-V3's FP8
                  activation quantisation before fc1 and fc2 (per_token_group_quant_fp8) is not launched:
                  the experts read activations quantised once before the graph (left out, like the all-reduces)
finalize          _moe_C moe_sum
tail_concat       torch.cat;  latent_norm: torch rms_norm (stand-in);  tail_add: torch add

Routing: the experts see token -> expert ids with exactly the plan's U distinct experts (fam_moe.routing);
the grouped_topk launch scores its own logits (timing only). Without a GPU: one sentence, exit 0.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tarfile
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent.parent)]

from harness import replay_us, say_no_gpu  # noqa: E402
from rows import append_row  # noqa: E402
from predict_layers import BATCHES, CONTEXT, LAYERS, TOKENS, TP, replay_name  # noqa: E402

REPLAYS = 20
ROUTING = {"kimi-k3": dict(n_group=1, topk_group=1, top_k=16, scale=1.0),     # K3: one group, top-16 of 896
           "deepseek-v3": dict(n_group=8, topk_group=4, top_k=8, scale=2.5)}  # DeepSeek-V3 config.json
EXTRA_SOURCES = {"vllm/models/kimi_k3/nvidia/ops/attn_res.py": "attn_res.py",  # wheel member -> file name here
                 "vllm/model_executor/layers/mamba/ops/causal_conv1d.py": "causal_conv1d.py",
                 "vllm/third_party/flash_linear_attention/ops/kda.py": "fla_kda.py"}
GATED_NORM_FUNCTIONS = ("layer_norm_gated_fwd_kernel", "layer_norm_gated_fwd_kernel1", "layer_norm_gated_fwd",
                        "rms_norm_gated")
GATED_NORM_HEADER = """# generated at run time from FLA's kda.py (vLLM's copy): its gated RMSNorm only
import torch
import triton
import triton.language as tl
cdiv = triton.cdiv
next_power_of_2 = triton.next_power_of_2
exp, log, exp2 = tl.exp, tl.log, tl.exp2
RCP_LN2 = 1.4426950408889634
is_amd = False


"""
FIELDS = ["replay", "model", "layer", "tp", "batch", "tokens_per_seq", "context", "layers", "graph_us_per_layer",
          "graph_p10_us", "graph_p90_us", "kernels_per_layer", "stand_ins", "status", "gpu_s", "trace"]


# ===================================================================== vLLM sources beyond vllm_wheel's
def unpack_extra(wheel_path: Path, folder: Path) -> None:
    """Extract EXTRA_SOURCES from the wheel into folder (flat), next to what vllm_wheel.unpack wrote."""
    import zipfile
    with zipfile.ZipFile(wheel_path) as z:
        for member, name in EXTRA_SOURCES.items():
            (folder / name).write_bytes(z.read(member))


def load_extra(folder: Path, torch) -> dict[str, Any]:
    """attn_res, causal_conv1d_update and rms_norm_gated from the extra sources (None where one fails to load),
    their `vllm` imports answered by stand-in modules as vllm_wheel does."""
    import types
    import vllm_wheel
    platform = sys.modules["vllm.platforms"].current_platform
    platform.is_device_capability_family = lambda family: torch.cuda.get_device_capability()[0] * 10 == family
    platform.is_cpu = lambda: False
    sys.modules.setdefault("vllm._custom_ops", types.ModuleType("vllm._custom_ops"))
    sys.modules["vllm"].__dict__.setdefault("_custom_ops", sys.modules["vllm._custom_ops"])
    for name in ("vllm.v1", "vllm.v1.attention", "vllm.v1.attention.backends"):
        sys.modules.setdefault(name, types.ModuleType(name))
    utils = types.ModuleType("vllm.v1.attention.backends.utils")
    utils.PAD_SLOT_ID, utils.NULL_BLOCK_ID = -1, 0  # vLLM's values (v1/attention/backends/utils.py)
    sys.modules["vllm.v1.attention.backends.utils"] = utils
    out: dict[str, Any] = {}
    for key, file, attr in (("attn_res", "attn_res.py", "attn_res"),
                            ("conv", "causal_conv1d.py", "causal_conv1d_update")):
        try:
            out[key] = getattr(vllm_wheel._source(folder / file, f"vllm_extra_{key}"), attr)
        except Exception as exc:  # a stand-in takes its place; the row says which
            print(f"cannot load {file}: {type(exc).__name__}: {exc}"[:300], flush=True)
            out[key] = None
    try:
        out["gated_norm"] = vllm_wheel.cut(folder / "fla_kda.py", GATED_NORM_FUNCTIONS, GATED_NORM_HEADER,
                                 "vllm_gated_norm").rms_norm_gated
    except Exception as exc:
        print(f"cannot load rms_norm_gated: {type(exc).__name__}: {exc}"[:300], flush=True)
        out["gated_norm"] = None
    return out


# ===================================================================== one layer's launches
class Layer:
    """One layer's buffers and its launches per plan key: launches[key] = [zero-argument calls]."""

    def __init__(self, torch, wheel, extra: dict, plan, model: str, seed: int, keys=None) -> None:
        """keys: build only these plan kernels' launches (a kernel row: kernel_row below)."""
        self.torch, self.wheel, self.extra, self.plan, self.model = torch, wheel, extra, plan, model
        self.m = plan.shape.batch * plan.shape.tokens_per_seq
        self.b, self.t = plan.shape.batch, plan.shape.tokens_per_seq
        self.seed = seed
        self.gen = torch.Generator(device="cuda").manual_seed(seed)
        self.bufs: dict[str, Any] = {}
        self.stand_ins: set[str] = set()
        self.launches = {k.key: self.build(k) for k in plan
                         if k.kind != "collective" and (keys is None or k.key in keys)}

    # ---- buffers named after the plan's tensors, so a kernel reads what its predecessor wrote
    def buf(self, tensor, shape=None, dtype=None):
        torch = self.torch
        shape = tuple(shape or tensor.shape)
        key = (tensor.name, shape)
        if key not in self.bufs:
            dt = dtype or {"fp32": torch.float32, "int32": torch.int32}.get(tensor.dtype, torch.bfloat16)
            self.bufs[key] = (torch.randn(shape, device="cuda", generator=self.gen) / 4).to(dt)
        return self.bufs[key]

    def weight(self, rows: int, cols: int):
        t = self.torch
        return (t.randn(rows, cols, device="cuda", generator=self.gen) * rows ** -0.5).to(t.bfloat16)

    @staticmethod
    def launcher(k) -> str | None:
        """Name of the method that builds plan kernel k's launches, or None where the replay has none."""
        if k.key.startswith("attn_res") or k.key in ("input_norm", "post_attn_norm"):
            return "attn_res"
        if k.key in ("mla_absorb", "mla_w_uv"):
            return "bmm"
        if k.kind in ("gemm", "router") and k.key != "topk":
            return "gemm"
        return "k_" + k.key if hasattr(Layer, "k_" + k.key) else None

    def build(self, k) -> list[Callable[[], Any]]:
        name = self.launcher(k)
        if name is None:
            raise ValueError(f"layer replay: no launches for plan kernel {k.key!r}")
        return getattr(self, name)(k)

    # ---- the families
    def attn_res(self, k):
        torch, m = self.torch, self.m
        d = k.writes[-1].shape[-1]
        # a plain residual's add + norm (DeepSeek-V3's input_norm / post_attn_norm) reads no block snapshots
        n_blocks = k.reads[2].shape[0] if len(k.reads) > 2 else 0
        prefix, delta = self.buf(k.reads[0]), self.buf(k.reads[1])
        blocks = self.buf(k.reads[2], (m, max(n_blocks, 1), d)) if n_blocks else torch.zeros(
            (m, 1, d), device="cuda", dtype=torch.bfloat16)
        w = [torch.ones(d, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
        fn = self.extra.get("attn_res")
        if n_blocks == 0:
            self.stand_ins.add("attn_res: vLLM AttnRes kernel, no blocks, for fused_add_rms_norm")
        if fn is None:
            self.stand_ins.add("attn_res: torch add + rms_norm")
            return [lambda: torch.add(prefix, delta, out=prefix),
                    lambda: torch.nn.functional.rms_norm(prefix, (d,), w[2], 1e-6)]
        return [lambda: fn(prefix, delta, blocks, w[0], w[1], w[2], n_blocks, -1, 1e-6, 1e-6)]

    def gemm(self, k):
        torch = self.torch
        x = self.buf(k.reads[0])
        kk, n = k.weights[0].shape
        w = self.weight(kk, n)
        x = x.reshape(self.m, kk)
        if k.writes[0].dtype == "fp32":  # router: fp32 logits in one cuBLAS call (fam_dense's router)
            return [lambda: torch.mm(x, w, out_dtype=torch.float32)]
        y = torch.empty(self.m, n, device="cuda", dtype=torch.bfloat16)
        if len(k.writes) == 1 and k.writes[0].shape[-1] == n:
            y = self.buf(k.writes[0]).view(self.m, n)
        return [lambda: torch.matmul(x, w, out=y)]

    def bmm(self, k):
        """MLA's per-head products: absorb q_nope [H, M, 128] x W_UK [H, 128, 512]; w_uv [H, M, 512] x W_UV."""
        torch, m = self.torch, self.m
        h = 16 if self.model == "deepseek-v3" else k.reads[0].shape[1]
        d_in, d_out = (128, 512) if k.key == "mla_absorb" else (512, 128)
        a = torch.randn(h, m, d_in, device="cuda", dtype=torch.bfloat16, generator=self.gen)  # head-major: one launch
        w = self.weight(h * d_in, d_out).view(h, d_in, d_out)
        out = torch.empty(h, m, w.shape[-1], device="cuda", dtype=torch.bfloat16)
        return [lambda: torch.bmm(a, w, out=out)]

    # ---- KDA
    def _kda_point(self, impl: str, variant: str):
        from points import Point
        return Point("kda", impl, "kda_decode", "kimi-k3", "kda", TP, M=self.m, B=self.b, heads=96 // TP, T=self.t,
                     fmt="fp32", variant=variant)

    def k_kda_decode(self, k):
        import fam_production as fp
        self.stand_ins.add("kda_decode: Triton packed decode for _C::fused_kda_decode")
        calls, _ = fp.kda_calls(self.torch, self.wheel, self._kda_point("vllm_packed_decode", "final"), 1)
        return calls

    def k_kda_recurrent(self, k):
        import fam_production as fp
        calls, _ = fp.kda_calls(self.torch, self.wheel, self._kda_point("vllm_fused_recurrent", "per_token"), 1)
        return calls

    def k_kda_conv(self, k):
        torch, b, t, m = self.torch, self.b, self.t, self.m
        x = self.buf(k.reads[0])
        width = x.shape[-1]
        conv = self.extra.get("conv")
        if conv is None:
            self.stand_ins.add("kda_conv: torch silu")
            return [lambda: torch.nn.functional.silu(x)]
        state = self.buf(k.reads[1], (b + 1, width, 3 + t - 1))  # vLLM's spec-decode conv state: width - 1 + T - 1
        w = torch.randn(width, 4, device="cuda", dtype=torch.bfloat16, generator=self.gen) / 2
        idx = torch.arange(1, b + 1, device="cuda", dtype=torch.int32)
        accepted = torch.ones(b, device="cuda", dtype=torch.int32)
        qsl = torch.arange(0, m + 1, t, device="cuda", dtype=torch.int32)
        out = torch.empty_like(x)
        return [lambda: conv(x, state, w, None, activation="silu", conv_state_indices=idx,
                             num_accepted_tokens=accepted, query_start_loc=qsl, max_query_len=t,
                             validate_data=False, out=out)]

    def k_kda_gated_norm(self, k):
        torch, m = self.torch, self.m
        x, g = self.buf(k.reads[0]), self.buf(k.reads[1])
        w = torch.ones(128, device="cuda", dtype=torch.float32)
        fn = self.extra.get("gated_norm")
        if fn is None:
            self.stand_ins.add("kda_gated_norm: torch rms_norm")
            return [lambda: torch.nn.functional.rms_norm(x.view(-1, 128), (128,), w.bfloat16(), 1e-6)]
        return [lambda: fn(x.view(m, -1, 128), g.view(m, -1, 128), w, None, activation="sigmoid", eps=1e-6)]

    # ---- MLA
    def k_mla_norm(self, k):
        """One torch rms_norm over the q latent and the kv latent as 512-wide groups (1536 + 512 per token):
        the fused q / kv norm's bytes in one launch."""
        torch = self.torch
        qkv = torch.randn(self.m, 4, 512, device="cuda", dtype=torch.bfloat16, generator=self.gen)
        w = torch.ones(512, device="cuda", dtype=torch.bfloat16)
        self.stand_ins.add("mla_norm: one torch rms_norm")
        return [lambda: torch.nn.functional.rms_norm(qkv, (512,), w, 1e-6)]

    def k_mla_cache_insert(self, k):
        """One torch copy to FP8 of [M, H + 1, 576]: the H query rows (latent + rope) and the new cache row."""
        torch = self.torch
        heads = k.reads[0].shape[1]
        src = torch.randn(self.m, heads + 1, 576, device="cuda", dtype=torch.bfloat16, generator=self.gen)
        dst = torch.empty(self.m, heads + 1, 576, device="cuda", dtype=torch.float8_e4m3fn)
        self.stand_ins.add("mla_cache_insert: one torch copy to FP8")
        return [lambda: dst.copy_(src)]

    def k_mla_decode(self, k):
        import fam_production as fp
        from points import Point
        s = k.reads[1].shape[1]
        p = Point("mla", "flashmla_fp8", "mla_decode", self.model, "mla", TP, M=self.m, B=self.b,
                  heads=k.reads[0].shape[1], T=self.t, S=s, fmt="fp8")
        calls, _ = fp.mla_calls(self.torch, self.wheel, p, 1)
        return calls

    # ---- small kernels
    def k_shared_act(self, k):
        import fam_small
        x, out = self.buf(k.reads[0]), self.buf(k.writes[0])
        self.stand_ins.add("shared_act: suite Triton SiTU-and-mul")
        return [lambda: fam_small.situ_mul(x, out, 4.0, 25.0)]

    def k_topk(self, k):
        torch, r = self.torch, ROUTING[self.model]
        logits = self.buf(k.reads[0])
        bias = torch.randn(logits.shape[-1], device="cuda", dtype=torch.float32, generator=self.gen) / 8
        calls = [lambda: self.wheel.moe.grouped_topk(logits, r["n_group"], r["topk_group"], r["top_k"], True,
                                                     r["scale"], bias, 1)]
        return calls + self._align()[0]

    def k_fc1(self, k):
        return self._moe()["fc1"]

    def k_fc2(self, k):
        return self._moe()["fc2"]

    def k_moe_act(self, k):  # the routed rows' activation, its own launch on Hopper (plan kernel moe_act)
        return self._moe()["moe_act"]

    def k_finalize(self, k):
        y = self.buf(k.reads[0])
        out = self.buf(k.writes[0])
        return [lambda: self.wheel.moe.moe_sum(y, out, None, None)]

    def k_tail_concat(self, k):
        torch = self.torch
        a, b, out = self.buf(k.reads[0]), self.buf(k.reads[1]), self.buf(k.writes[0])
        return [lambda: torch.cat([a, b], dim=1, out=out)]

    def k_latent_norm(self, k):
        torch = self.torch
        x = self.buf(k.reads[0])
        w = torch.ones(x.shape[-1], device="cuda", dtype=torch.bfloat16)
        self.stand_ins.add("latent_norm: torch rms_norm")
        return [lambda: torch.nn.functional.rms_norm(x, (x.shape[-1],), w, 1e-6)]

    def k_tail_add(self, k):
        torch = self.torch
        a, b, out = self.buf(k.reads[0]), self.buf(k.reads[1]), self.buf(k.writes[0])
        if b.shape != a.shape:
            b = b[:, :a.shape[-1]]
        return [lambda: torch.add(a, b, out=out)]

    # ---- routed experts: the routing and vLLM's alignment launches built once, for topk, fc1 and fc2
    def _align(self) -> tuple[list, Any, Any, Any]:
        """(alignment launches, routed ids, router weights, aligned buffers per block size): Marlin aligns at
        the block fused_marlin_moe picks; the Triton path at its tile's BLOCK_SIZE_M when M k 4 > E."""
        if "aligned" in self.__dict__:
            return self.aligned
        import fam_production as fp
        torch, m, fc1 = self.torch, self.m, self.plan.kernel("fc1")
        if self.model == "kimi-k3":
            e, top_k = fp.EXPERTS, fp.TOP_K
            block = fp.marlin_block_m(m)
        else:
            from points import Point
            e, top_k = 256, ROUTING[self.model]["top_k"]
            _, big_l, two_f = fc1.weights[0].shape
            p = Point("moe", "vllm_triton_moe_fp8", "fc1", self.model, "mla", TP, M=m, K=big_l, N=two_f, fmt="fp8")
            block = fp._triton_moe_setup(torch, self.wheel, p)[2]["BLOCK_SIZE_M"] if m * top_k * 4 > e else 0
        ids, weights = self._routing(fc1, top_k, e)
        calls, bufs = [], None
        if block:
            bufs = fp._align(self.wheel, torch, ids, block, experts=e)
            calls = [lambda s=bufs[0], x=bufs[1], n=bufs[2]: self.wheel.moe.moe_align_block_size(
                ids, e, block, s, x, n, None, None)]
        self.aligned = (calls, ids, weights, (block, bufs))
        return self.aligned

    def _moe(self) -> dict[str, list]:
        if "moe" not in self.__dict__:
            self.moe = (self._marlin if self.model == "kimi-k3" else self._triton_fp8)()
        return self.moe

    def _routing(self, fc1, top_k: int, experts: int):
        import numpy as np
        import fam_production as fp
        u = fc1.weights[0].shape[0]
        window = np.random.default_rng(self.seed).permutation(experts)[:u]
        ids = fp._routing(self.torch, self.m, u, window, seed=self.seed, top_k=top_k)
        return ids, self.torch.rand(self.m, top_k, device="cuda", dtype=self.torch.float32)

    def _act(self, rows: int, f: int):
        import fam_small
        x = self.torch.randn(rows, 2 * f, device="cuda", dtype=self.torch.bfloat16, generator=self.gen)
        out = self.torch.empty(rows, f, device="cuda", dtype=self.torch.bfloat16)
        self.stand_ins.add("fc1 activation: suite Triton SiTU-and-mul")
        return lambda: fam_small.situ_mul(x, out, 4.0, 25.0)

    def _marlin(self) -> dict[str, list]:
        import fam_production as fp
        torch, m = self.torch, self.m
        fc1 = self.plan.kernel("fc1")
        _, big_l, two_f = fc1.weights[0].shape
        f = two_f // 2
        e, top_k = fp.EXPERTS, fp.TOP_K
        align, ids, weights, (block, (sorted_ids, expert_ids, n_post)) = self._align()
        routed = (sorted_ids, expert_ids, n_post, weights, block)
        ws = torch.zeros(torch.cuda.get_device_properties(0).multi_processor_count * fp.MARLIN_BLOCKS_PER_SM,
                         dtype=torch.int32, device="cuda")
        w1, s1 = fp._marlin_weights(torch, e, big_l, two_f)
        w2, s2 = fp._marlin_weights(torch, e, f, big_l)
        a1 = self.buf(fc1.reads[0])
        h = torch.empty(m * top_k, two_f, device="cuda", dtype=torch.bfloat16)
        a2 = torch.randn(m * top_k, f, device="cuda", dtype=torch.bfloat16, generator=self.gen)
        out = self.buf(self.plan.kernel("fc2").writes[0]).view(m * top_k, big_l)
        return {"align": align,
                "fc1": [fp._marlin_call(self.wheel, torch, "fc1", a1, h, w1, s1, routed, m, big_l, two_f, ws)],
                "moe_act": [self._act(m * top_k, f)],
                "fc2": [fp._marlin_call(self.wheel, torch, "fc2", a2, out, w2, s2, routed, m, f, big_l, ws)]}

    def _triton_fp8(self) -> dict[str, list]:
        import fam_production as fp
        from points import Point
        torch, m = self.torch, self.m
        fc1 = self.plan.kernel("fc1")
        _, big_l, two_f = fc1.weights[0].shape
        f = two_f // 2
        e, top_k = 256, ROUTING[self.model]["top_k"]
        align, ids, weights, _ = self._align()
        out: dict[str, list] = {"align": align, "fc1": [], "moe_act": [self._act(m * top_k, f)], "fc2": []}
        for key, kk, n in (("fc1", big_l, two_f), ("fc2", f, big_l)):
            p = Point("moe", "vllm_triton_moe_fp8", key, self.model, "mla", TP, M=m, K=kk, N=n, U=ids.unique().numel(),
                      fmt="fp8")
            _, _, cfg, _ = fp._triton_moe_setup(torch, self.wheel, p)
            w, w_scale = fp._triton_moe_weights(torch, p, e)
            call = fp._triton_moe_call(torch, self.wheel, p, w, w_scale, ids, weights, cfg, e, top_k)[0]
            out[key].append(call)
        return out


# ===================================================================== one plan kernel as a kernel row
def kernel_row(p: Any, torch: Any, wheel) -> dict:
    """A plan small kernel as the replay launches it, timed as a kernel row (points.REPLAY_SMALL, measured
    by production.py): Layer built for this one key at the point's plan (B sequences of T tokens), as many
    as rotate the kernel's bytes over >= 4 x L2, or two and an L2 flush before each launch where 64 fall
    short (harness.time_cold); one timed call = every launch the plan kernel stands for (the CSV's launches
    column)."""
    from harness import kernel_names, time_cold
    from points import _plan
    from simulator.cost.measured import ATTN_RES_STAND_IN, point_kernel
    plan = _plan(p.model, "standard", p.tp, p.M // p.T, p.T, 512, p.layer)
    key = next(k.key for k in plan if ATTN_RES_STAND_IN.get(k.key, k.key) == p.plan_key)  # DSV3's norms

    def make_calls(slots: int) -> list:
        layers = [Layer(torch, wheel, wheel.extra, plan, p.model, seed=1000 + i, keys=(key,)) for i in range(slots)]
        return [lambda seq=layer.launches[key]: [c() for c in seq] for layer in layers]

    res, calls = time_cold(torch, make_calls, point_kernel(p.row()).hbm_bytes, max_slots=64)
    res["kernel_names"] = kernel_names(torch, calls[0])
    return res


# ===================================================================== capture, time, trace
def run_layers(torch, layers: list[Layer], plan, aux) -> None:
    """Every layer's launches in plan order; a kernel on `aux` starts after the main-stream kernels it
    depends on, and a main-stream kernel that depends on an aux kernel waits for it."""
    main = torch.cuda.current_stream()
    streams = {"main": main, "aux": aux}
    for layer in layers:
        events = {}
        for k in plan:
            if k.kind == "collective":
                continue
            stream = streams[k.stream]
            for dep in k.deps:
                if dep in events:
                    stream.wait_event(events[dep])
            if k.stream != "main" and not k.deps:
                stream.wait_stream(main)
            with torch.cuda.stream(stream):
                for call in layer.launches[k.key]:
                    call()
                ev = torch.cuda.Event()
                ev.record(stream)
                events[k.key] = ev
        if any(k.stream != "main" for k in plan if k.kind != "collective"):
            main.wait_stream(aux)  # join the second stream (a capture must not fork without joining)


def replay_plan(torch, plan, layers: list, name: str, meta: dict, out: Path) -> dict:
    """Capture every layer's launches (run_layers) as one CUDA graph, time REPLAYS replays with CUDA events,
    trace one replay, trim it to its kernel events with `meta` beside them, and append it to out/traces.tar:
    the timing columns of a replay row."""
    import capture_traces
    aux = torch.cuda.Stream()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: Triton JIT, cuBLAS heuristics, before any capture
        run_layers(torch, layers, plan, aux)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run_layers(torch, layers, plan, aux)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    per_layer = replay_us(torch, graph, REPLAYS, len(layers))
    with tempfile.TemporaryDirectory() as tmp:
        raw, trimmed = Path(tmp) / "raw.json", Path(tmp) / f"{name}.json.gz"
        capture_traces.profile(torch, graph.replay, raw)
        names = capture_traces.trim(raw, trimmed, {"moeSimReplay": meta})
        with tarfile.open(out / "traces.tar", "a") as tar:
            tar.add(trimmed, arcname=trimmed.name)
    del graph
    xs = sorted(per_layer)
    return {"layers": len(layers), "graph_us_per_layer": round(statistics.median(xs), 3),
            "graph_p10_us": round(xs[len(xs) // 10], 3), "graph_p90_us": round(xs[(9 * len(xs)) // 10], 3),
            "kernels_per_layer": len(names) // len(layers), "trace": f"{name}.json.gz"}


def replay(torch, wheel, extra, model: str, batch: int, tokens: int, n_layers: int, out: Path) -> dict:
    from predict_layers import _plan
    t0 = time.time()
    plan = _plan(model, batch, tokens)
    layers = [Layer(torch, wheel, extra, plan, model, seed=100 * batch + 10 * tokens + i) for i in range(n_layers)]
    name = replay_name(model, batch, tokens)
    meta = {"model": model, "layer": plan.layer, "tp": TP, "batch": batch, "tokens_per_seq": tokens,
            "context": CONTEXT, "layers": n_layers, "stand_ins": sorted(layers[0].stand_ins), "package": wheel.version}
    timing = replay_plan(torch, plan, layers, name, meta, out)
    return {"replay": name, "model": model, "layer": plan.layer, "tp": TP, "batch": batch, "tokens_per_seq": tokens,
            "context": CONTEXT, **timing, "stand_ins": "; ".join(sorted(layers[0].stand_ins)), "status": "ok",
            "gpu_s": round(time.time() - t0, 1)}


def write_row(path: Path, row: dict) -> None:
    append_row(path, row, FIELDS)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wheel-dir", type=Path, required=True, help="what vllm_wheel.py (and --unpack-extra) unpacked")
    ap.add_argument("--layer", choices=[layer for _, layer in LAYERS], required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--layers", type=int, default=4, help="layers back to back in one graph")
    ap.add_argument("--batch", type=int, action="append", help="only these batches (repeatable)")
    ap.add_argument("--tokens", type=int, action="append", help="only these tokens per sequence (repeatable)")
    ap.add_argument("--unpack-extra", type=Path, help="instead: extract the extra sources from this wheel and exit")
    args = ap.parse_args()
    if args.unpack_extra:
        unpack_extra(args.unpack_extra, args.wheel_dir)
        print(f"unpacked {len(EXTRA_SOURCES)} extra sources into {args.wheel_dir}")
        return 0
    if say_no_gpu("layer_replay", "nothing replayed (run it on a machine with an NVIDIA GPU)"):
        return 0
    import torch
    from harness import environment, warm_up
    import vllm_wheel
    wheel = vllm_wheel.load(args.wheel_dir, torch)
    if wheel is None:
        return 2
    extra = load_extra(args.wheel_dir, torch)
    args.out.mkdir(parents=True, exist_ok=True)
    env = {**environment(torch), "package": wheel.version, "loaded": {k: v is not None for k, v in extra.items()}}
    (args.out / f"env_{args.layer}.json").write_text(json.dumps(env, indent=2))
    model = next(m for m, layer in LAYERS if layer == args.layer)
    warm_up(torch)
    with torch.inference_mode():
        for batch in args.batch or BATCHES:
            for tokens in args.tokens or TOKENS:
                t0 = time.time()
                try:
                    row = replay(torch, wheel, extra, model, batch, tokens, args.layers, args.out)
                except Exception as exc:  # one failed configuration must not cost the others
                    traceback.print_exc()
                    row = {"replay": replay_name(model, batch, tokens), "model": model, "batch": batch,
                           "tokens_per_seq": tokens, "status": f"error: {type(exc).__name__}: {exc}"[:300],
                           "gpu_s": round(time.time() - t0, 1)}
                torch.cuda.empty_cache()
                write_row(args.out / "replays.csv", row)
                print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
