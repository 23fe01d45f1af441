"""gpt-oss-20b decode layers replayed on one H200 with the kernels vLLM 0.33.0 runs for it on Hopper, traced.

    python benchmarks/gpu/predict_gptoss.py --out calibration/h200/production/gptoss/predictions.csv  # first
    python benchmarks/gpu/gptoss_replay.py --unpack-from /path/to/vllm --carry DIR     # here: the sources
    python benchmarks/gpu/gptoss_replay.py --carry DIR --out OUT                        # GPU
    moe-sim compare-trace OUT/gptoss-tp1-b8-c8192-l1.json.gz --engine vllm-h200 --hardware h200 \
        --model gpt-oss-20b --tp 1 --batch 8 --tokens-per-seq 1 --context 8192 --layer-index 1

For each configuration of predict_gptoss (TP1 / TP2 one rank's shapes, batch 1 / 8 / 32 / 64, one token,
context 1,720 / 8,192, the sliding-window layer 0 and the full-attention layer 1) it builds gpt-oss-20b's
standard plan on Hopper and launches for each plan kernel what vLLM launches there (LAUNCHES below), through
layer_replay's machinery: `--layers` layers back to back with their own weights, KV cache and buffers, one
CUDA graph, timed over layer_replay.REPLAYS replays, one replay traced and trimmed (capture_traces.trim); each
configuration appends its row to OUT/replays.csv and its trace to OUT/traces.tar as it finishes. Then
(`--kernel-rows`) the two matmul_ogs launches alone across batch, as kernel rows (OUT/ogs_rows.csv): the
same calls, weights rotated over slots that hold >= 4 x L2, routing made once outside the graph. Or
(`--ogs-points`) the production rows of matmul_ogs (points.ogs_points: fc1, and fc2's matmul without its scatter,
at exactly U experts) into OUT/moe.csv, the production CSV's columns.

plan key           launched (vllm 0.33.0 sources, loaded from DIR at run time; stand-ins labelled)
input_norm,        vLLM's Triton _attn_res_kernel with no blocks = residual add + RMSNorm (stand-in for the
post_attn_norm       compiled graph's fused add + RMSNorm)
gqa_qkv_proj,      cuBLAS through torch.addmm with the bias (bf16), weights [N, K] as nn.Linear holds them
o_proj, router
gqa_rope_cache     a torch fp32 -> bf16 copy of the YaRN cos/sin table (stand-in for Inductor's fused cast)
gqa_rope           vLLM's Triton _packed_qk_rope_kernel over the q and k heads of the qkv output, in place
                   (stand-in for _C's rotary_embedding: the same bytes, interleaved pairs)
gqa_cache_insert   vLLM's Triton reshape_and_cache_kernel_flash (stand-in for _C's reshape_and_cache_flash)
gqa_decode         vLLM's Triton unified attention with sinks and the window (3D split-KV + reduce_segments
                   below 16 sequences, as TritonAttentionBackend picks): stand-in for FlashAttention 3
topk .. ogs_indices triton_kernels' routing(logits, 4): _topk_forward, _sum_bitmatrix_rows,
                   _combined_routing_memset, _combined_routing_compute (one call, launched under `topk`)
fc1                matmul_ogs, MXFP4 weights in the Hopper layouts, bias, gather, fused clamped SwiGLU; the
                   expert hidden rounded up to 64 as vLLM allocates it (TP2: 1440 -> 1472, `padded`)
fc2 (+ finalize)   matmul_ogs with the scatter and the routing weights: its matmul and its reduce launch
                   (one call, launched under `fc2`)

Without a GPU: one sentence, exit 0.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
import traceback
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent.parent)]

from layer_replay import Layer, replay_plan  # noqa: E402
from predict_gptoss import MODEL, configurations, plan_of, replay_name  # noqa: E402
from rows import append_row  # noqa: E402

VERSION = "0.33.0"
# wheel member -> file name in the carried folder; triton_kernels is carried whole
SOURCES = {"v1/attention/ops/triton_unified_attention.py": "triton_unified_attention.py",
           "v1/attention/ops/triton_attention_helpers.py": "triton_attention_helpers.py",
           "v1/attention/ops/triton_reshape_and_cache_flash.py": "triton_reshape_and_cache_flash.py",
           "model_executor/layers/rotary_embedding/packed_qk_rope.py": "packed_qk_rope.py",
           "models/kimi_k3/nvidia/ops/attn_res.py": "attn_res.py"}
TRITON_KERNELS = "third_party/triton_kernels"
SWIGLU_ALPHA, SWIGLU_LIMIT = 1.702, 7.0  # gpt_oss_triton_kernels_moe.triton_kernel_fused_experts defaults
BLOCK = 16  # KV-cache block size of the plan
SEQ_THRESHOLD_3D, SEGMENTS = 16, 16  # TritonAttentionBackend: 128 // kv heads -> capture size 16; 16 segments
OGS_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
OGS_SLOTS = 8  # expert sets rotated: at batch 1 the 4 touched experts' fc1 bytes x 8 >= 4 x L2 (265 MB)
FIELDS = ["replay", "model", "layer_index", "tp", "batch", "tokens_per_seq", "context", "layers",
          "graph_us_per_layer", "graph_p10_us", "graph_p90_us", "kernels_per_layer", "stand_ins", "status", "gpu_s",
          "trace"]
OGS_FIELDS = ["kernel", "tp", "batch", "rows", "K", "N", "experts_touched", "slots", "median_us", "p10_us", "p90_us",
              "launches", "kernel_names", "package", "status"]


# ===================================================================== the sources, unpacked here, loaded there
def unpack(vllm_dir: Path, carry: Path) -> None:
    """Copy SOURCES and triton_kernels from an unpacked vLLM (the wheel's `vllm/` folder) into carry."""
    carry.mkdir(parents=True, exist_ok=True)
    for member, name in SOURCES.items():
        shutil.copyfile(vllm_dir / member, carry / name)
    shutil.copytree(vllm_dir / TRITON_KERNELS, carry / "triton_kernels", dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__"))
    (carry / "VERSION").write_text(f"vllm=={VERSION} (sources of its wheel)\n")


RESHAPE_HEADER = """# generated at run time from vLLM's triton_reshape_and_cache_flash.py: the bf16 cache insert only
import torch
import triton
import triton.language as tl
from types import SimpleNamespace

current_platform = SimpleNamespace(is_rocm=lambda: False, is_xpu=lambda: False,
                                   has_device_capability=lambda c: True, fp8_dtype=lambda: torch.float8_e4m3fn)
_NATIVE_KV_CACHE_DTYPES = {"auto", "float16", "bfloat16", "float32", "half", "float"}


def is_quantized_kv_cache(kv_cache_dtype):
    return kv_cache_dtype not in _NATIVE_KV_CACHE_DTYPES


"""


class Kernels:
    """The loaded sources: `attention` (unified_attention), `insert` (triton_reshape_and_cache_flash), `rope`
    (the packed-qk RoPE Triton kernel), `attn_res`, and triton_kernels' `routing`, `matmul_ogs` and friends;
    `version`. Their `vllm` imports are answered by stand-in modules (vllm_wheel's, plus the few below)."""

    def __init__(self, carry: Path, torch) -> None:
        import enum
        import types
        import logging
        import vllm_wheel
        from layer_replay import load_extra
        missing = [n for n in list(SOURCES.values()) + ["triton_kernels"] if not (carry / n).exists()]
        if missing:
            raise FileNotFoundError(f"{carry}: missing {', '.join(missing)} (run gptoss_replay.py --unpack-from)")
        vllm_wheel._helper_modules(torch)
        platform = sys.modules["vllm.platforms"].current_platform
        cap = torch.cuda.get_device_capability()
        for name, fn in (("fp8_dtype", lambda: torch.float8_e4m3fn), ("is_cuda", lambda: True),
                         ("is_rocm", lambda: False), ("is_xpu", lambda: False),
                         ("is_device_capability", lambda c: (cap[0] * 10 + cap[1]) == (c if isinstance(c, int)
                                                                                      else c[0] * 10 + c[1])),
                         ("has_device_capability", lambda c: cap[0] * 10 + cap[1] >= c)):
            setattr(platform, name, fn)

        class KVQuantMode(enum.IntEnum):  # vllm/v1/kv_cache_interface.py's values
            NONE, FP8_PER_TENSOR, INT8_PER_TOKEN_HEAD, FP8_PER_TOKEN_HEAD, INT4_PER_TOKEN_HEAD = range(5)

        log = logging.getLogger("vllm")
        log.debug_once = log.info_once = log.warning_once = lambda *a, **k: None
        vllm_wheel._module("vllm.envs", VLLM_BATCH_INVARIANT=False)
        vllm_wheel._module("vllm.logger", init_logger=lambda name: log)
        for name in ("vllm.v1", "vllm.v1.attention", "vllm.v1.attention.ops"):
            sys.modules.setdefault(name, types.ModuleType(name))
        vllm_wheel._module("vllm.v1.kv_cache_interface", KVQuantMode=KVQuantMode)
        self.attn_res = load_extra(carry, torch)["attn_res"]  # also answers attn_res.py's vllm imports
        vllm_wheel._source(carry / "triton_attention_helpers.py", "vllm.v1.attention.ops.triton_attention_helpers")
        self.attention = vllm_wheel._source(carry / "triton_unified_attention.py",
                                            "vllm_unified_attention").unified_attention
        self.insert = vllm_wheel.cut(carry / "triton_reshape_and_cache_flash.py",
                                     ("_is_supported_kv_cache_dtype", "reshape_and_cache_kernel_flash",
                                      "triton_reshape_and_cache_flash"), RESHAPE_HEADER,
                                     "vllm_reshape_and_cache").triton_reshape_and_cache_flash
        self.rope = vllm_wheel._source(carry / "packed_qk_rope.py", "vllm_packed_qk_rope")._packed_qk_rope_kernel
        sys.path.insert(0, str(carry))  # triton_kernels as vLLM imports it (the alias of its third_party copy)
        import triton_kernels.swiglu as swiglu
        import triton_kernels.matmul_ogs as ogs
        import triton_kernels.matmul_ogs_details.opt_flags as opt_flags
        from triton_kernels.routing import routing
        from triton_kernels import tensor, numerics
        from triton_kernels.tensor_details import layout
        opt_flags.update_opt_flags_constraints({"split_k": 1})  # vLLM's _swizzle_mxfp4 on SM90
        self.routing, self.ogs, self.swiglu, self.tensor, self.numerics, self.layout = (
            routing, ogs, swiglu, tensor, numerics, layout)
        self.version = f"vllm=={VERSION}"
        self.fa3 = None  # FlashAttention 3's ops (fa3.load_fa3) when --fa3 names the carried library


# ================================================================ MXFP4 experts as vLLM's TRITON backend holds them
def mxfp4_experts(torch, kernels: Kernels, experts: int, k: int, n: int, gen) -> tuple[Any, Any]:
    """Random MXFP4 experts [E, N, K/2] with e8m0 scales [E, N, K/32], converted as vLLM's _swizzle_mxfp4 does
    on SM90 (scale groups padded to 0 mod 4, transposed so K is dim 1, Hopper value / scale layouts); the
    weight tensor and its PrecisionConfig."""
    tk, lay = kernels.tensor, kernels.layout
    w = torch.randint(0, 256, (experts, n, k // 2), device="cuda", dtype=torch.uint8, generator=gen)
    scale = torch.randint(118, 124, (experts, n, k // 32), device="cuda", dtype=torch.uint8, generator=gen)
    scale = torch.nn.functional.pad(scale, (0, -scale.shape[-1] % 4))
    value_layout, value_opts = lay.make_default_matmul_mxfp4_w_layout(mx_axis=1)
    scale_layout, scale_opts = lay.make_default_matmul_mxfp4_w_scale_layout(mx_axis=1, num_warps=8)
    w = tk.convert_layout(tk.wrap_torch_tensor(w.transpose(-2, -1), dtype=tk.FP4), value_layout, **value_opts)
    scale = tk.convert_layout(tk.wrap_torch_tensor(scale.transpose(-2, -1)), scale_layout, **scale_opts)
    pc = kernels.ogs.PrecisionConfig(weight_scale=scale,
                                     flex_ctx=kernels.ogs.FlexCtx(rhs_data=kernels.numerics.InFlexData()))
    return w, pc


def expert_dims(plan) -> tuple[int, int, int, int]:
    """(experts of the rank, hidden D, the plan's gate+up width 2F, top-k) of a gpt-oss plan's fc1: its bias holds
    every expert of the rank, its weight [U, D, 2F], its output [M, k, F]."""
    fc1 = plan.kernel("fc1")
    return fc1.weights[1].shape[0], fc1.weights[0].shape[1], fc1.weights[0].shape[2], fc1.writes[0].shape[1]


def padded(f: int) -> int:
    """The expert hidden vLLM allocates for the TRITON backend on CUDA: rounded up to 64
    (oracle/mxfp4.py mxfp4_round_up_hidden_size_and_intermediate_size): 2880 stays, 1440 (TP2) -> 1472."""
    return -(-f // 64) * 64


def swiglu(kernels: Kernels):
    """The fused activation triton_kernel_fused_experts passes on triton_kernels 3.5.1."""
    ogs = kernels.ogs
    return ogs.FusedActivation(ogs.FnSpecs("swiglu", kernels.swiglu.swiglu_fn, ("alpha", "limit")),
                               (SWIGLU_ALPHA, SWIGLU_LIMIT), 2)


class Experts:
    """One layer's experts: w13 / w2 in the Hopper layouts with fp32 biases; fc1 / fc2 as the backend calls
    matmul_ogs (fc1: gather + SwiGLU into [1, M k, F]; fc2: scatter with the routing weights into [1, M, D])."""

    def __init__(self, torch, kernels: Kernels, experts: int, d: int, f: int, gen) -> None:
        self.torch, self.kernels, self.d, self.f = torch, kernels, d, f
        self.w1, self.pc1 = mxfp4_experts(torch, kernels, experts, d, 2 * f, gen)
        self.w2, self.pc2 = mxfp4_experts(torch, kernels, experts, f, d, gen)
        self.b1 = torch.randn(experts, 2 * f, device="cuda", dtype=torch.float32, generator=gen) / 8
        self.b2 = torch.randn(experts, d, device="cuda", dtype=torch.float32, generator=gen) / 8
        self.act = swiglu(kernels)

    def fc1(self, x, route, h):
        rd, gather, _ = route
        self.kernels.ogs.matmul_ogs(x, self.w1, self.b1, rd, gather_indx=gather, precision_config=self.pc1,
                                    gammas=None, fused_activation=self.act, y=h)

    def fc2(self, h, route, out):
        rd, _, scatter = route
        self.kernels.ogs.matmul_ogs(h.view(-1, self.f), self.w2, self.b2, rd, scatter_indx=scatter,
                                    precision_config=self.pc2, gammas=rd.gate_scal, y=out)


# ===================================================================== one gpt-oss layer's launches
class GptOssLayer(Layer):
    """layer_replay.Layer with gpt-oss's launches (module docstring); the route made by `topk` in the graph is
    read by fc1 / fc2 through self.route, filled when the calls run (capture runs them in plan order).
    split_kv_all: the decode takes the split-KV (3D) path at every batch, not only below SEQ_THRESHOLD_3D
    sequences (a sensitivity run: nearer FlashAttention 3's split-KV decode than the 2D path)."""

    split_kv_all = False

    def build(self, k):
        method = getattr(self, "k_" + k.key, None)
        if method is not None:
            return method(k)
        if k.kind == "gemm":
            return self.linear(k)
        raise ValueError(f"gpt-oss replay: no launches for plan kernel {k.key!r}")

    @property
    def kt(self) -> Kernels:
        return self.wheel

    def act(self, name: str, *shape):
        key = (name, shape)
        if key not in self.bufs:
            self.bufs[key] = (self.torch.randn(shape, device="cuda", generator=self.gen) / 4).to(self.torch.bfloat16)
        return self.bufs[key]

    def _norm(self, reads_delta: str, writes: str):
        torch, m = self.torch, self.m
        d = self.plan.kernel("input_norm").reads[0].shape[-1]
        prefix, delta = self.act("prefix", m, d), self.act(reads_delta, m, d)
        blocks = torch.zeros(m, 1, d, device="cuda", dtype=torch.bfloat16)
        w = [torch.ones(d, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
        fn = self.kt.attn_res
        self.stand_ins.add("norms: vLLM Triton attn_res with no blocks for the fused add + RMSNorm")
        if fn is None:
            self.stand_ins.add("norms: torch add + rms_norm")
            return [lambda: torch.add(prefix, delta, out=prefix),
                    lambda: torch.nn.functional.rms_norm(prefix, (d,), w[2], 1e-5)]
        return [lambda: fn(prefix, delta, blocks, w[0], w[1], w[2], 0, -1, 1e-5, 1e-5)]

    def k_input_norm(self, k):
        return self._norm("delta", "x")

    def k_post_attn_norm(self, k):
        return self._norm("attn.out", "x2")

    def linear(self, k):
        """y = x W^T + b in one cuBLAS call (torch.addmm on nn.Linear's [N, K] weight, bf16 bias)."""
        torch, m = self.torch, self.m
        kk, n = k.weights[0].shape
        src, dst = {"gqa_qkv_proj": ("x", "qkv"), "o_proj": ("attn.core", "attn.out"),
                    "router": ("x2", "router.logits")}[k.key]
        x, y = self.act(src, m, kk), self.act(dst, m, n)
        w = self.weight(n, kk)
        bias = torch.randn(n, device="cuda", dtype=torch.bfloat16, generator=self.gen) / 8
        return [lambda: torch.addmm(bias, x, w.t(), out=y)]

    # ---- attention
    def _attn_shape(self):
        q = self.plan.kernel("gqa_rope").reads[0]
        kc = self.plan.kernel("gqa_cache_insert").reads[2]
        return q.shape[1], kc.shape[2], q.shape[2], kc.shape[0]  # heads, kv heads, head dim, cache blocks

    def _cache(self):
        """The paged KV cache (k, v [blocks, 16, kv heads, 64]), block table, sequence lengths (context + 1,
        the new token included) and each new token's slot."""
        if "cache" in self.__dict__:
            return self.cache
        torch, b = self.torch, self.b
        _, hk, dh, blocks = self._attn_shape()
        ctx = self.plan.shape.context
        per_seq = blocks // b
        kc = torch.randn(blocks, BLOCK, hk, dh, device="cuda", generator=self.gen).to(torch.bfloat16)
        vc = torch.randn(blocks, BLOCK, hk, dh, device="cuda", generator=self.gen).to(torch.bfloat16)
        table = torch.arange(blocks, device="cuda", dtype=torch.int32).view(b, per_seq)
        lens = torch.full((b,), ctx + 1, device="cuda", dtype=torch.int32)
        slots = table[:, ctx // BLOCK].long() * BLOCK + ctx % BLOCK
        self.cache = (kc, vc, table, lens, slots)
        return self.cache

    def k_gqa_rope_cache(self, k):
        torch = self.torch
        rows_x_h = k.traffic_bytes // 6
        table = torch.randn(rows_x_h, device="cuda", dtype=torch.float32, generator=self.gen)
        out = torch.empty(rows_x_h, device="cuda", dtype=torch.bfloat16)
        self.stand_ins.add("gqa_rope_cache: torch fp32 -> bf16 copy for Inductor's cast")
        return [lambda: out.copy_(table)]

    def k_gqa_rope(self, k):
        torch, m = self.torch, self.m
        h, hk, dh, _ = self._attn_shape()
        qkv = self.act("qkv", m, (h + 2 * hk) * dh)
        qk = qkv.as_strided((m, h + hk, dh), (qkv.stride(0), dh, 1))
        freqs = torch.randn(m, dh, device="cuda", dtype=torch.float32, generator=self.gen)
        rope = self.kt.rope
        self.stand_ins.add("gqa_rope: vLLM Triton packed-qk RoPE for _C rotary_embedding")
        return [lambda: rope[(-(-m // 4), h + hk)](qk, freqs, m, qk.stride(0), qk.stride(1), rotary_dim=dh,
                                                    BLOCK_M=4)]

    def k_gqa_cache_insert(self, k):
        torch, m = self.torch, self.m
        h, hk, dh, _ = self._attn_shape()
        qkv = self.act("qkv", m, (h + 2 * hk) * dh)
        key = qkv[:, h * dh:(h + hk) * dh].view(m, hk, dh)
        value = qkv[:, (h + hk) * dh:].view(m, hk, dh)
        kc, vc, _, _, slots = self._cache()
        one = torch.ones(1, device="cuda", dtype=torch.float32)
        self.stand_ins.add("gqa_cache_insert: vLLM Triton reshape_and_cache_flash for _C's")
        return [lambda: self.kt.insert(key, value, kc, vc, slots, "auto", one, one)]

    def k_gqa_decode(self, k):
        torch, m, b = self.torch, self.m, self.b
        h, hk, dh, _ = self._attn_shape()
        kc, vc, table, lens, _ = self._cache()
        q = self.act("q", m, h, dh)
        out = self.act("attn.core", m, h * dh).view(m, h, dh)
        if self.kt.fa3 is not None:  # what vLLM's FLASH_ATTN backend runs on Hopper (fa3.fa3_call)
            import fa3
            consts = dict(k.consts)
            x = {"q": q, "kc": kc, "vc": vc, "out": out, "cu": torch.arange(b + 1, device="cuda", dtype=torch.int32),
                 "lens": lens, "n": self.plan.shape.context + 1,
                 "sinks": torch.randn(h, device="cuda", generator=self.gen).to(torch.bfloat16)}
            g = {"window": consts.get("window") or 0, "scale": consts["scale"]}
            return [fa3.fa3_call(self.kt.fa3, x, g, table)]
        sinks = torch.randn(h, device="cuda", dtype=torch.float32, generator=self.gen)
        cu = torch.arange(b + 1, device="cuda", dtype=torch.int32)
        consts = dict(k.consts)
        window = (consts["window"] - 1, 0) if consts.get("window") else (-1, -1)
        rows = max(b, SEQ_THRESHOLD_3D) if self.split_kv_all else SEQ_THRESHOLD_3D
        segm = [torch.empty(rows, h, SEGMENTS, dh, device="cuda", dtype=torch.float32),
                torch.empty(rows, h, SEGMENTS, device="cuda", dtype=torch.float32),
                torch.empty(rows, h, SEGMENTS, device="cuda", dtype=torch.float32)]
        one = torch.ones(1, device="cuda", dtype=torch.float32)
        ctx = self.plan.shape.context
        self.stand_ins.add("gqa_decode: vLLM Triton unified attention for FlashAttention 3"
                           + (", split-KV (3D) at every batch" if self.split_kv_all else ""))
        return [lambda: self.kt.attention(q, kc, vc, out, cu, 1, lens, ctx + 1, consts["scale"], True, window, table,
                                          0, None, one, one, seq_threshold_3D=rows,
                                          num_par_softmax_segments=SEGMENTS, softmax_segm_output=segm[0],
                                          softmax_segm_max=segm[1], softmax_segm_expsum=segm[2], sinks=sinks)]

    # ---- the MoE: routing, then the two matmul_ogs calls
    def k_topk(self, k):
        logits = self.act("router.logits", self.m, self.plan.kernel("router").weights[0].shape[1])
        top_k = self.plan.kernel("topk").writes[0].shape[-1]

        def route():
            self.route = self.kt.routing(logits, top_k, sm_first=False)
        return [route]

    def k_ogs_hist(self, k):
        return []  # launched by routing() under topk

    k_ogs_memset = k_ogs_indices = k_finalize = k_ogs_hist

    def _experts(self) -> Experts:
        if "experts" not in self.__dict__:
            e, d, two_f, _ = expert_dims(self.plan)
            self.experts = Experts(self.torch, self.kt, e, d, padded(two_f // 2), self.gen)
        return self.experts

    def k_fc1(self, k):
        ex, m = self._experts(), self.m
        top_k = k.writes[0].shape[1]
        x = self.act("x2", m, ex.d)
        h = self.act("moe.h", 1, m * top_k, ex.f)
        return [lambda: ex.fc1(x, self.route, h)]

    def k_fc2(self, k):
        ex, m = self._experts(), self.m
        top_k = k.writes[0].shape[1]
        h = self.act("moe.h", 1, m * top_k, ex.f)
        out = self.act("moe_out", 1, m, ex.d)
        return [lambda: ex.fc2(h, self.route, out)]


# ===================================================================== the replays and the kernel rows
def replay(torch, kernels: Kernels, tp: int, batch: int, context: int, layer_index: int, n_layers: int,
           out: Path) -> dict:
    t0 = time.time()
    plan = plan_of(tp, batch, context, layer_index)
    layers = [GptOssLayer(torch, kernels, {}, plan, MODEL, seed=1000 * batch + 10 * layer_index + i)
              for i in range(n_layers)]
    name = replay_name(tp, batch, context, layer_index)
    meta = {"model": MODEL, "layer": plan.layer, "layer_index": layer_index, "tp": tp, "batch": batch,
            "tokens_per_seq": 1, "context": context, "layers": n_layers, "stand_ins": sorted(layers[0].stand_ins),
            "package": kernels.version}
    timing = replay_plan(torch, plan, layers, name, meta, out)
    return {"replay": name, "model": MODEL, "layer_index": layer_index, "tp": tp, "batch": batch,
            "tokens_per_seq": 1, "context": context, **timing, "stand_ins": "; ".join(sorted(layers[0].stand_ins)),
            "status": "ok", "gpu_s": round(time.time() - t0, 1)}


def ogs_rows(torch, kernels: Kernels, tp: int, out: Path) -> None:
    """matmul_ogs fc1 / fc2 alone per batch (OGS_BATCHES): rotated over slots of distinct experts that hold
    >= 4 x L2, routing from random logits made once; one row per kernel and batch, appended as it finishes."""
    from harness import kernel_names, time_graph
    e, d, two_f, top_k = expert_dims(plan_of(tp, 1, 1720, 0))
    f = padded(two_f // 2)
    gen = torch.Generator(device="cuda").manual_seed(7)
    slots = [Experts(torch, kernels, e, d, f, gen) for _ in range(OGS_SLOTS)]
    for batch in OGS_BATCHES:
        logits = torch.randn(batch, e, device="cuda", dtype=torch.bfloat16, generator=gen)
        route = kernels.routing(logits, top_k, sm_first=False)
        x = torch.randn(batch, d, device="cuda", dtype=torch.bfloat16, generator=gen)
        h = torch.randn(1, batch * top_k, f, device="cuda", dtype=torch.bfloat16, generator=gen)
        y = torch.empty(1, batch, d, device="cuda", dtype=torch.bfloat16)
        touched = int(route[0].expt_hist.gt(0).sum())
        for key, kk, n, calls in (("fc1", d, two_f, [lambda s=s: s.fc1(x, route, h) for s in slots]),
                                  ("fc2", f, d, [lambda s=s: s.fc2(h, route, y) for s in slots])):
            row = {"kernel": key, "tp": tp, "batch": batch, "rows": batch * top_k, "K": kk, "N": n,
                   "experts_touched": touched, "slots": len(slots), "package": kernels.version}
            try:
                res = time_graph(torch, calls, reps=max(48, len(calls)), replays=20)
                names = kernel_names(torch, calls[0])
                row |= {"median_us": round(res["median_us"], 3), "p10_us": round(res["p10_us"], 3),
                        "p90_us": round(res["p90_us"], 3), "launches": len(names),
                        "kernel_names": "; ".join(n[:80] for n in names), "status": "ok"}
            except Exception as exc:
                traceback.print_exc()
                row["status"] = f"error: {type(exc).__name__}: {exc}"[:300]
            append_row(out / "ogs_rows.csv", row, OGS_FIELDS)
            print(json.dumps(row), flush=True)


def exact_route(torch, kernels: Kernels, m: int, experts: int, top_k: int, u: int, seed: int):
    """triton_kernels' routing of M tokens onto exactly U of the rank's experts (every one used, fam_moe.routing's
    ids placed on a seeded choice of U): logits high on each token's chosen experts, low elsewhere."""
    import numpy as np
    from fam_moe import routing as chosen_ids
    ids = chosen_ids(m, top_k, u, seed)
    pick = np.random.default_rng(seed).permutation(experts)[:u]
    logits = torch.full((m, experts), -8.0, device="cuda", dtype=torch.float32)
    rows = torch.arange(m, device="cuda")[:, None]
    cols = torch.as_tensor(pick[ids], device="cuda")
    logits[rows, cols] = 8.0 + torch.rand(m, top_k, device="cuda")
    route = kernels.routing(logits.to(torch.bfloat16), top_k, sm_first=False)
    touched = int(route[0].expt_hist.gt(0).sum())
    if touched != u:
        raise RuntimeError(f"routing touched {touched} experts, not U={u}")
    return route


def ogs_point(p, torch, kernels: Kernels) -> dict:
    """A production point of matmul_ogs (points.ogs_points), timed cold: fc1 as vLLM calls it (gather, fused
    SwiGLU), or fc2's matmul alone (no scatter: its reduce is the plan's finalize), over expert sets rotated on
    slots holding >= 4 x L2, the route made once outside the graph."""
    from harness import kernel_names, time_cold
    from simulator.cost.measured import point_kernel
    from simulator.cost.validate import normalise
    e, d, two_f, top_k = expert_dims(plan_of(p.tp, 1, 1720, 0))
    f = padded(two_f // 2)
    gen = torch.Generator(device="cuda").manual_seed(11)
    route = exact_route(torch, kernels, p.M, e, top_k, p.U, seed=p.M)
    x = torch.randn(p.M, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    h = torch.randn(1, p.M * top_k, f, device="cuda", dtype=torch.bfloat16, generator=gen)
    y = torch.empty(1, p.M * top_k, d, device="cuda", dtype=torch.bfloat16)

    def make_calls(slots: int) -> list:
        sets = [Experts(torch, kernels, e, d, f, gen) for _ in range(slots)]
        if p.plan_key == "fc1":
            return [lambda s=s: s.fc1(x, route, h) for s in sets]
        rd = route[0]
        return [lambda s=s: kernels.ogs.matmul_ogs(h.view(-1, f), s.w2, s.b2, rd, precision_config=s.pc2, y=y)
                for s in sets]

    res, calls = time_cold(torch, make_calls, point_kernel(normalise(p.row())).hbm_bytes, max_slots=OGS_SLOTS)
    return {**res, "kernel_names": kernel_names(torch, calls[0])}


def ogs_production_rows(torch, kernels: Kernels, out: Path, budget_s: float) -> dict:
    """Every points.ogs_points row into OUT/moe.csv through rows.time_points (the production columns)."""
    import points as pts
    from harness import environment
    from rows import time_points
    env = environment(torch)
    t0 = time.time()
    todo = pts.ogs_points()
    done, failed = time_points(todo, lambda p: ogs_point(p, torch, kernels), torch, out / "moe.csv", env,
                               ("package", "kernel", "stands_in_for", "kernel_names", "point_s", "cold", "flush_us"),
                               t0, budget_s)
    return {"points_ok": done, "points_failed": failed, "points_planned": len(todo),
            "wall_s": round(time.time() - t0, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--carry", type=Path, required=True, help="the folder --unpack-from wrote")
    ap.add_argument("--unpack-from", type=Path, help="instead: copy the sources from this vLLM folder and exit")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--layers", type=int, default=4, help="layers back to back in one graph")
    ap.add_argument("--tp", type=int, action="append", help="only these TP degrees (repeatable)")
    ap.add_argument("--batch", type=int, action="append", help="only these batches (repeatable)")
    ap.add_argument("--layer-index", type=int, action="append", help="only these layer indexes (repeatable)")
    ap.add_argument("--split-kv-all", action="store_true", help="the decode's split-KV path at every batch")
    ap.add_argument("--fa3", type=Path, help="decode with FlashAttention 3 from this folder (fa3.py's carry) "
                                             "instead of the Triton stand-in")
    ap.add_argument("--kernel-rows", action="store_true", help="also time matmul_ogs fc1 / fc2 alone per batch")
    ap.add_argument("--no-replays", action="store_true", help="only the kernel rows")
    ap.add_argument("--ogs-points", action="store_true",
                    help="instead of the replays: matmul_ogs's production rows (points.ogs_points) into OUT/moe.csv")
    ap.add_argument("--budget-s", type=float, default=240.0, help="--ogs-points: stop starting new points after this")
    args = ap.parse_args()
    if args.unpack_from:
        if not (args.unpack_from / TRITON_KERNELS).is_dir():
            print(f"--unpack-from {args.unpack_from}: no {TRITON_KERNELS} (not vLLM {VERSION}'s package folder).",
                  file=sys.stderr)
            return 2
        unpack(args.unpack_from, args.carry)
        print(f"copied {len(SOURCES)} sources and triton_kernels into {args.carry}")
        return 0
    if args.out is None:
        print("--out is needed to replay.", file=sys.stderr)
        return 2
    from harness import environment, say_no_gpu, warm_up
    if say_no_gpu("gptoss_replay", "nothing replayed (run it on a machine with an NVIDIA GPU)"):
        return 0
    import torch
    try:
        kernels = Kernels(args.carry, torch)
    except (FileNotFoundError, ImportError, OSError, RuntimeError) as exc:
        print(f"--carry {args.carry}: cannot load vLLM's kernels ({exc}).", file=sys.stderr)
        return 2
    if args.fa3:
        import fa3
        kernels.fa3 = fa3.load_fa3(args.fa3, torch)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "env_gptoss.json").write_text(json.dumps({**environment(torch), "package": kernels.version,
                                                          "attn_res": kernels.attn_res is not None,
                                                          "decode": "fa3" if kernels.fa3 is not None else "triton"},
                                                         indent=2))
    GptOssLayer.split_kv_all = args.split_kv_all
    warm_up(torch)
    if args.ogs_points:
        with torch.inference_mode():
            doc = ogs_production_rows(torch, kernels, args.out, args.budget_s)
        (args.out / "runs.json").write_text(json.dumps({"moe_ogs": doc}, indent=2))
        print(json.dumps(doc), flush=True)
        return 0
    with torch.inference_mode():
        for tp, batch, context, layer_index in ([] if args.no_replays else configurations()):
            if ((args.tp and tp not in args.tp) or (args.batch and batch not in args.batch)
                    or (args.layer_index and layer_index not in args.layer_index)):
                continue
            t0 = time.time()
            try:
                row = replay(torch, kernels, tp, batch, context, layer_index, args.layers, args.out)
            except Exception as exc:  # one failed configuration must not cost the others
                traceback.print_exc()
                row = {"replay": replay_name(tp, batch, context, layer_index), "model": MODEL,
                       "layer_index": layer_index, "tp": tp, "batch": batch, "context": context,
                       "status": f"error: {type(exc).__name__}: {exc}"[:300], "gpu_s": round(time.time() - t0, 1)}
            torch.cuda.empty_cache()
            append_row(args.out / "replays.csv", row, FIELDS)
            print(json.dumps(row), flush=True)
        if args.kernel_rows:
            for tp in args.tp or [1]:
                ogs_rows(torch, kernels, tp, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
