"""The measured law of each kernel family: one set of term functions, read by pricing and fitted by validate.

A GPU whose kernels the project has measured (calibration/h200) carries, beside its profile, a table of
kernel *laws* per implementation set (`simulator/hardware/laws/<gpu>.toml`, written by
`moe-sim validate --fit`). A law is linear in a few physical constants apart from one max of two roofs:

    t = t0 + max(sum of one roof's terms, sum of the other's) + every other term     (per launch, in µs)

where each term is a constant times a regressor that `features` computes from the `Kernel` alone: its
declared tensors, grid, FLOPs and collective. Pricing a plan kernel and fitting a measured point therefore
read the same function: `moe-sim validate` rebuilds the kernel a CSV row measured (cost/measured.py) and
calls `features` on it, exactly as pricing calls it on a plan's kernel. Family by family:

  gemm        t0 + max(W + X bytes c_b, tiled flops c_f) + out bytes c_o + c_split [split K]
                 + K c_narrow [N <= 1024, unsplit]      (a GEMM with a bias, gpt-oss's, its own law and split rule)
              (tiled: 64 x 128 output tiles in waves over the SMs, tiled_gemm_flops; a deep K with a small
              output is split and its partial sums reduced by a second launch, `splits_k`; a narrow output
              left unsplit runs K in series on few CTAs). Short K (<= 1024) and long K fit apart.
  moe         t0 + max(bytes c_b, padded flops c_f) + U c_U           (padded: whole BLOCK_M-row tiles)
  moe Triton  t0 + max(bytes c_b, rounds c_L)     (vLLM's fused_moe: its programs' memory round trips, at the tile
              vLLM picks and the programs an SM holds of it, triton_moe_rounds and engine_tiles)
  moe W4A16   t0 + bytes c_b + tiles K N c_dq + rows K ceil(N / BLOCK_N) c_a + U c_U   (a tile dequantises its
              slab; each N-program re-reads the routed rows). fc1 and fc2 fit apart (fc2's K is short).
  moe ogs     t0 + max(bytes c_b, waves x (K x 256 x (1/2 + 1/32) bytes c_p + BLOCK_M x K x 256 c_m))
              (triton_kernels' matmul_ogs: one program per SM at a time, each streaming its expert's K x 256
              MXFP4 slab and multiplying its BLOCK_M rows by it, ogs_grid)
  small       t0[kernel] + bytes c_b + (launches - 1) c_launch + sources c_src + steps c_step
                 + experts c_E + aligned rows c_row          (a floor per kernel: a top-k is not a copy)
              (what the engine launches around the plan kernel, from the kernel and the implementation set:
              vLLM's top-k is one launch, then moe_align_block_size's two where the set's experts sort the
              routed rows, `routing`; its grouped top-k sweeps the E experts of a token, the alignment sorts
              the M k rows; AttnRes reads its sources one after another, `attn_res_sources`; the causal conv
              walks each sequence's T tokens in order, `sequence_steps`)
  kda         t0 + max(waves T c_T + state bytes c_s + per-token state bytes c_L2,
                       bytes beyond L2 c_d + state bytes c_r)   (waves of the declared grid; the states a
              verify stores per token land in L2 and what it cannot hold drains to HBM meanwhile)
  mla         t0 + max(waves x tiles per split c_tile, cache bytes c_b) + splits c_combine   (split-KV flash
              decoding: the grid's serial tile steps, or streaming the cache where the kernel keeps HBM busy;
              a program holds 16 query rows (the suite's kernel) or 64 (FlashMLA, which streams the cache
              once per 64-row block of tokens x heads))
  gqa         t0 + max(waves x tiles per program c_tile, cache bytes c_b) + segments c_combine   (a paged GQA
              decode: one program per sequence x key/value head x KV segment, each walking its segment's tiles
              of 16 positions in order; the bytes are the window's on a sliding layer). Where no GPU measured
              the implementation, the datasheet prices the tile chain as `gqa_chain_us` (each program streams at
              the profile's cta_bandwidth) against the bytes at eta BW, and the combine as its own launch.
  gqa FA3     t0 + local + waves c_w + max(waves x key blocks per program x block bytes c_tb, cache bytes c_b)
              (FlashAttention 3: a program per sequence x key/value head x split, fa3_grid; each streams its
              128-position blocks one after another, so the chain is in bytes, fa3_block_bytes, and carries from
              gpt-oss's head dim 64 to Qwen3-MoE's and Mixtral's 128; `local`: the windowed kernel instance)
  collective  t0 + wire bytes c_w, per algorithm; NCCL's two protocols are two lines, the cheaper wins

t0 holds the launch gap of back-to-back CUDA-graph replay (how the suite measures); pricing takes
`hw.launch_gap_us` back out and lets the timeline charge the gap (PDL shortens it).

An implementation set maps each kernel *role* to the measured implementations that stand for it (a W4A16
MoE to the suite's Triton kernel or to vLLM's Marlin, an all-reduce to NCCL or the symmetric-memory
one- and two-shot kernels, an engine picking the fastest). A kernel with no law in the set (a fused
kernel nobody measured, a small kernel of its own) is priced by the datasheet law in pricing.py, and
a law is never extrapolated to rank counts it was not measured at.

Dimension legend: M tokens, K x N a weight, U touched experts, B sequences, T tokens per sequence, S cached
tokens, P ranks, n collective payload per rank.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Mapping

import numpy as np

import simulator.cost.engine_tiles as engine_tiles
from simulator.hardware.kernel_sets import ROLES, KernelSet
from simulator.plans.kernel import DTYPE_BYTES, Kernel

MLA_TILE = 64  # cache slots per tile of a split-KV decode kernel
# query rows (tokens x heads of a sequence) one program of an MLA decode kernel holds: the suite's Triton
# kernel 16; FlashMLA 64 (its BLOCK_M over h_q x s_q, FlashMLA README / csrc; the H200 rows of
# calibration/h200/production/mla.csv step at 64 rows: 48 -> 96 rows doubles the time, 24 -> 48 does not)
MLA_ROWS = {"flashmla_fp8": 64, "flashmla_bf16": 64}
GQA_TILE = 16  # cache positions per tile of a GQA decode program (vLLM / aiter unified attention: the block size)
FA3_BLOCK_N = 128  # key positions per block of FlashAttention 3's Hopper decode at head dim 64 (causal / local)
FA3_MAX_SPLITS = 32  # vLLM's flash_attn_max_num_splits_for_cuda_graph (config/attention.py)
SHORT_K = 1024  # reduction depth at or below which a GEMM tile runs <= 8 K-steps of 128
W4A16_BLOCK_N = {16: 32, 64: 64}  # the suite's W4A16 tile config: BLOCK_M -> BLOCK_N (fam_moe.TILE_CONFIG)
NARROW_N = 1024  # output width at or below which few CTAs share the N dimension: each runs K in series
SPLIT_K_DEPTH = 3584  # cuBLAS on H200 splits K (a second, reducing launch) only at K >= this ...
SPLIT_K_OUTPUT = 400_000  # ... and an output of at most this many elements (M x N): the launch counts of
#                           calibration/h200/gemm.csv, 60 of 62 shapes (tests/test_laws.py)
# cuBLASLt with a bias epilogue (torch.addmm, vLLM's F.linear with a bias) decides otherwise: it splits K from
# 2,560 on, wherever its output tiles (64 columns x 32 rows) number fewer than 64, at any output size
# (calibration/h200/production/gemm.csv, the 50 torch_addmm rows of round 7: every launch count)
BIAS_SPLIT_K_DEPTH = 2560
BIAS_SPLIT_TILES = 64
GEMM_TILE = (64, 128)  # output rows x columns of one CTA's tile, as assumed for cuBLAS on Hopper
SPLIT_K = (1, 2, 3, 4, 6, 8)  # K splits a library may choose; each split keeps >= MIN_SPLIT_DEPTH of K
MIN_SPLIT_DEPTH = 512
# vLLM's MoE implementations that sort the routed rows by expert after the router's top-k
# (moe_align_block_size: its align kernel, then count_and_sort_expert_tokens; fused_moe.py
# _prepare_expert_assignment, fused_marlin_moe.py): Marlin always, Triton fused_moe unless the rows are so sparse
# that M k SPARSITY <= E (then each row reads its expert's weights on its own, no sorting)
ALIGNS = {"vllm_marlin_moe": "always", "vllm_triton_moe_bf16": "dense", "vllm_triton_moe_fp8": "dense"}
ALIGN_LAUNCHES = 2
SPARSITY = engine_tiles.SPARSITY
TRITON_MOE = {"vllm_triton_moe_bf16": False, "vllm_triton_moe_fp8": True}  # vLLM's Triton fused_moe -> block FP8
# a routing launched from triton_kernels (gpt-oss's matmul_ogs path) sorts with launches of its own, which its
# plans declare as kernels (moe/ogs.py): no alignment is added to it
OWN_SORT = "vllm/third_party/triton_kernels/"
# small-kernel implementations (a set's "small" role) whose AttnRes programs' chain of source reads hides their
# streaming until the bytes outrun it: vLLM's _attn_res_kernel, flat from M = 1 to 64 while its bytes grow 47-fold
# (calibration/h200/production/small.csv); the GPU suite's kernel runs in waves of one 16-warp program per SM
# instead (8.4 -> 17.9 µs from M = 64 to 256, calibration/h200/small.csv), its chain and its stream adding up
CHAIN_HIDES_STREAM = {"vllm"}
SEQUENCE_BLOCK = 256  # features per program of vLLM's causal_conv1d_update (its BLOCK_N; grid batch x dim / 256)
# triton_kernels' matmul_ogs on Hopper (gpt-oss's MXFP4 experts, vLLM's TRITON backend; opt_flags.py): one program
# per BLOCK_M routed rows of an expert x 256 output columns (compute_block_n for N > 128 with the 8-warp Hopper
# scale layout), BLOCK_M the next power of two of the rows per expert of the rank, clamped to [16, 128]; each
# program streams its expert's K x 256 slab of 4-bit values and their 32-wide E8M0 scales
OGS_BLOCK_N = 256
OGS_WEIGHT_BYTES = 0.5 + 1 / 32  # per weight: a nibble and a 32nd of a one-byte scale
DECLARED_ONLY = {"triton_matmul_ogs"}  # a measured law only the kernels that declare it take (Kernel.impl)
# small plan kernels that launch what another plan kernel's measured rows launch: the routed experts' activation on
# Hopper is the same _C activation kernel as the shared expert's (the replays' SiTU-and-mul stand-in for both)
SAME_LAUNCH = {"moe_act": "shared_act"}
COLLECTIVE_ALGORITHM = {"nccl_all_reduce": "ring", "symm_one_shot": "one_shot", "symm_two_shot": "two_shot",
                        "nccl_reduce_scatter": "reduce_scatter", "nccl_all_gather": "all_gather"}


# ---------------------------------------------------------------------------------------------------
# the terms
# ---------------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=4096)
def tiled_gemm_flops(m: int, k: int, n: int, sms: int) -> float:
    """FLOPs of a dense [m, k] x [k, n] GEMM as the SMs spend them: whole 64 x 128 output tiles, in waves
    of one tile per SM, with the split of K that makes the fewest waves of work.

        tiles = ceil(m / 64) ceil(n / 128);  waves(s) = ceil(tiles s / SMs)
        F_tiled = min over s of  waves(s) x SMs x 2 x 64 x 128 x k / s

    Every SM runs as long as the busiest one: a grid smaller than the GPU leaves SMs idle and a partial tile
    computes its padding. At decode m the 64-row tile is mostly padding, so a narrow GEMM costs about as
    much at n = 256 as at n = 896 (the H200 router at m <= 64 takes 8.6-10.5 µs across that range). The
    tile and the cheapest split are assumptions: cuBLAS chooses otherwise (calibration/h200/gemm_kernels.csv;
    the n = 560 router at m = 2048 runs 128 x 80 tiles unsplit, one wave, and this law misses it by ~20 %).
    Large GEMMs approach the useful FLOPs."""
    bm, bn = GEMM_TILE
    tiles = -(-m // bm) * -(-n // bn)
    best = math.inf
    for s in SPLIT_K:
        if s > 1 and k / s < MIN_SPLIT_DEPTH:
            break
        best = min(best, -(-tiles * s // sms) * sms * 2.0 * bm * bn * k / s)
    return best


def mla_splits(batch: int, cached: int, sms: int, tile: int = MLA_TILE) -> tuple[int, int]:
    """(splits, chunk) of a flash-decoding grid: B x splits >= 2 x SMs where the cache has enough tiles."""
    want = max(1, min(-(-2 * sms // batch), -(-cached // tile)))
    chunk = -(-(-(-cached // want)) // tile) * tile
    return -(-cached // chunk), chunk


def gqa_positions(kernel: Kernel) -> int:
    """Positions each sequence of a paged GQA decode reads, S (its window on a sliding layer), from its FLOPs,
    4 M Nq S H over its query [M, Nq, H] (read 0)."""
    m, nq, h = kernel.reads[0].shape
    return kernel.flops // (4 * m * nq * h)


def gqa_grid(kernel: Kernel) -> tuple[int, int, int, int]:
    """(programs, tiles per program, segments, bytes of one tile) of a paged GQA decode: its query [M, Nq, H], its
    pools [NB, BS, Nkv, H] and table [B, blocks] are reads 0, 1 and 3; `ctas` its programs, B x Nkv x segments;
    the positions each sequence reads, `gqa_positions`."""
    pool, table = kernel.reads[1], kernel.reads[3]
    h = kernel.reads[0].shape[2]
    nkv, b = pool.shape[2], table.shape[0]
    programs = kernel.ctas or b * nkv
    segments = max(1, programs // (b * nkv))
    tiles = -(-(-(-gqa_positions(kernel) // GQA_TILE)) // segments)
    return programs, tiles, segments, GQA_TILE * 2 * h * pool.nbytes // pool.numel


def fa3_splits(mblocks: int, n_blocks: int, sms: int, max_splits: int = FA3_MAX_SPLITS) -> int:
    """KV splits FlashAttention 3 runs a decode in (its num_splits heuristic, hopper/heuristics.h in
    Dao-AILab/flash-attention, under vLLM's cap): none when the (sequence, key/value head) blocks nearly fill the
    SMs or the sequence has at most 4 key blocks; else the fewest splits whose last wave is at least 85 % as full
    as the best count's."""
    if mblocks >= 0.8 * sms or n_blocks <= 4:
        return 1
    cap = min(max_splits, sms, n_blocks)
    eff = [(mblocks * s / sms) / math.ceil(mblocks * s / sms) for s in range(1, cap + 1)]
    return next(s for s, e in enumerate(eff, 1) if e >= 0.85 * max(eff))


def fa3_grid(kernel: Kernel, sms: int) -> tuple[int, int, int]:
    """(programs, key blocks per program, splits) of FlashAttention 3's paged decode of one token per sequence:
    a program per sequence x key/value head x split (the group's query heads packed into one block of rows),
    walking its split's FA3_BLOCK_N-position key blocks (a sliding window spans at most W / N + 1 of them)."""
    pool, table = kernel.reads[1], kernel.reads[3]
    nkv, b = pool.shape[2], table.shape[0]
    window = dict(kernel.consts).get("window") or 0
    if window:  # a window not aligned to the key blocks straddles one more, where the sequence is that long
        n_blocks = min(-(-table.shape[1] * pool.shape[1] // FA3_BLOCK_N), -(-window // FA3_BLOCK_N) + 1)
    else:
        n_blocks = -(-gqa_positions(kernel) // FA3_BLOCK_N)
    splits = fa3_splits(b * nkv, n_blocks, sms)
    return b * nkv * splits, -(-n_blocks // splits), splits


def fa3_block_bytes(kernel: Kernel) -> int:
    """Bytes of one FA3_BLOCK_N-position key block a program streams: its key/value head's K and V rows. A
    program walks its blocks one after another, so its time is its blocks' bytes at what one CTA streams: the
    law's term is in bytes, not steps, and a head dim of 128 (Qwen3-MoE, Mixtral) costs twice gpt-oss's 64
    (calibration/h200/production/others: 1.9 µs a block against 1.0)."""
    pool = kernel.reads[1]
    return int(2 * FA3_BLOCK_N * pool.shape[-1] * DTYPE_BYTES[pool.dtype])


def gqa_chain_us(kernel: Kernel, sms: int, cta_bandwidth: float) -> float:
    """µs of a GQA decode's tile chain: its programs in waves of SMs x ctas_per_sm, each wave as long as one
    program's tiles take at one CTA's bandwidth (the loads of a program's tiles are in series)."""
    programs, tiles, _, tile_bytes = gqa_grid(kernel)
    waves = -(-programs // (sms * kernel.ctas_per_sm))
    return waves * tiles * tile_bytes / cta_bandwidth * 1e6


def wire_bytes(nbytes: int, ranks: int, algorithm: str) -> float:
    """Bytes each rank sends over NVLink for the collective's algorithm (collectives.py)."""
    n, p = nbytes, max(ranks, 1)
    return {"one_shot": (p - 1) * n, "all_gather": (p - 1) * n, "reduce_scatter": (p - 1) / p * n}.get(
        algorithm, 2 * (p - 1) / p * n)


def splits_k(m: int, k: int, n: int, impl: str = "torch_matmul") -> bool:
    """Whether the library splits K and launches a reduce after the GEMM: a deep K and an output too small
    to fill the SMs with tiles (cuBLAS's choice on H200, read from the measured launch counts; with a bias
    epilogue, `torch_addmm`, its own rule in output tiles)."""
    if impl == "torch_addmm":
        return k >= BIAS_SPLIT_K_DEPTH and -(-n // 64) * -(-m // 32) < BIAS_SPLIT_TILES
    return k >= SPLIT_K_DEPTH and m * n <= SPLIT_K_OUTPUT


def gemm_shape(kernel: Kernel) -> tuple[int, int, int]:
    """(M, K, N) of a dense GEMM kernel: K x N its one 2-D weight buffer, M from its FLOPs (2 M K N, plus any
    epilogue work too small to reach another row)."""
    k, n = kernel.weights[0].shape
    return kernel.flops // (2 * k * n), k, n


def moe_shape(kernel: Kernel) -> tuple[int, int, int, int, int]:
    """(tokens M, routed rows M k, touched experts U, K, N) of a grouped GEMM over the experts in weights[0]."""
    w = kernel.weights[0]
    tokens = kernel.group_tokens or kernel.group_rows
    return tokens, kernel.group_rows, w.shape[0], w.shape[-2], w.shape[-1]


@functools.lru_cache(maxsize=4096)
def expected_tiles(tokens: int, rows: int, experts: int, block: int = 0) -> tuple[float, int]:
    """(expected BLOCK_M-row tiles, BLOCK_M) of a grouped GEMM whose `tokens` x top-k = `rows` routed rows
    touch `experts` = U experts.

    vLLM's moe_align_block_size pads each expert's rows to whole tiles of BLOCK_M = 16 rows (64 once
    experts average more than 16). Routing is random, so experts do not get rows / U each: a touched
    expert holds n ~ Binomial(tokens, q) rows given n >= 1 (each token picks it or not), q set so that
    the mean is rows / U (uniform routing over E experts gives q = k / E exactly; q = 1 when every token
    picks every expert). The grid runs U E[ceil(n / BLOCK_M) | n >= 1] tiles: at 16 rows per expert on
    average ~1.45 U, not U (the H200 W4A16 runs at U = 64 and 128 launch 94 and 184 tiles:
    benchmarks/gpu/fam_moe.align_blocks)."""
    u = max(int(experts), 1)
    m = max(int(tokens), 1)
    mean = max(rows / u, 1.0)
    block = block or (64 if mean > 16 else 16)
    if mean >= m or m == 1:  # every token routes to every touched expert: no spread
        return float(u * math.ceil(min(mean, m) / block)), block
    lo, hi = 0.0, 1.0  # conditional mean m q / (1 - (1 - q)^m) rises from 1 to m with q
    for _ in range(60):
        q = 0.5 * (lo + hi)
        lo, hi = (q, hi) if m * q / -math.expm1(m * math.log1p(-q)) < mean else (lo, q)
    q = 0.5 * (lo + hi)
    sd = math.sqrt(m * q * (1.0 - q))
    n = np.arange(max(1, int(m * q - 12 * sd - 1)), min(m, int(m * q + 12 * sd + 2)) + 1, dtype=np.float64)
    log_pmf = (math.lgamma(m + 1) - _lgamma(n + 1) - _lgamma(m - n + 1)
               + n * math.log(q) + (m - n) * math.log1p(-q))
    touched = -math.expm1(m * math.log1p(-q))
    return u * float(np.sum(np.exp(log_pmf) * np.ceil(n / block))) / touched, block


def _lgamma(x: np.ndarray) -> np.ndarray:
    return np.vectorize(math.lgamma, otypes=[np.float64])(x)


def moe_tiles(kernel: Kernel) -> tuple[float, int]:
    """(expected row tiles, BLOCK_M) of the grouped GEMM (expected_tiles)."""
    tokens, rows, experts, _, _ = moe_shape(kernel)
    return expected_tiles(tokens, rows, experts)


def triton_moe_rounds(kernel: Kernel, impl: str, sms: int, tile: "engine_tiles.Tile | None" = None) -> float:
    """Memory round trips of vLLM's Triton fused_moe at its tile (engine_tiles): each program loads its K
    loop in `windows` of steps, its SM holds `resident` programs, so the grid runs programs x windows per
    program / (SMs x resident) windows one after another. Programs: one per BLOCK_M-row tile of an expert and
    BLOCK_N columns (one per routed row where the rows are too sparse to align, M k SPARSITY <= E). `tile`: the
    one a measurement launched (its CSV row's tile_config); by default the one vLLM picks for H200."""
    tokens, rows, experts, k, n = moe_shape(kernel)
    fp8 = TRITON_MOE[impl]
    if tile is None:
        inter = n // 2 if kernel.key == "fc1" else k
        tile = engine_tiles.vllm_fused_moe_tile(tokens, kernel.group_experts, inter, fp8)[0]
    if rows * engine_tiles.SPARSITY <= kernel.group_experts:
        blocks = float(rows)
    else:
        blocks = expected_tiles(tokens, rows, experts, tile.block_m)[0]
    return blocks * -(-n // tile.block_n) * tile.windows(k) / (sms * tile.resident(fp8))


def ogs_grid(kernel: Kernel, sms: int) -> tuple[int, int]:
    """(waves, BLOCK_M) of matmul_ogs programs over the SMs (one program per SM at a time: the H200 rows step with
    ceil(programs / 132), calibration/h200/README.md round 8): expected BLOCK_M-row tiles of the touched experts
    (expected_tiles, the block as opt_flags picks it) x 256-column blocks of N."""
    tokens, rows, experts, _, n = moe_shape(kernel)
    total = kernel.group_experts or experts
    block = max(16, min(128, 1 << max(0, (max(1, rows // total) - 1).bit_length())))
    tiles, _ = expected_tiles(tokens, rows, experts, block)
    return math.ceil(round(tiles, 6) * -(-n // OGS_BLOCK_N) / sms), block


def kda_shape(kernel: Kernel) -> tuple[int, int, int, int, int]:
    """(B sequences, heads, head dim H, T tokens per sequence, bytes of the states stored per token) of a KDA
    kernel: the state it reads is its one [B, heads, H, H] fp32 tensor; a verify that keeps each token's
    state writes one more [B, T - 1, heads, H, H] tensor."""
    state = next(t for t in kernel.reads if len(t.shape) == 4 and t.shape[-1] == t.shape[-2])
    b, heads, h, _ = state.shape
    per_token = sum(t.nbytes for t in kernel.writes if len(t.shape) == 5)
    return b, heads, h, max(1, kernel.reads[0].shape[0] // b), per_token


def mla_shape(kernel: Kernel) -> tuple[int, int, int, int]:
    """(B sequences, S cached tokens, heads, T tokens per sequence) of a latent decode: its query is the first
    read [M, heads, L + R], its cache the [B, S, L + R] read."""
    q = kernel.reads[0]
    cache = next(t for t in kernel.reads[1:] if len(t.shape) == 3)
    return cache.shape[0], cache.shape[1], q.shape[1], max(1, q.shape[0] // cache.shape[0])


def routing(kernel: Kernel, impls: Mapping[str, tuple[str, ...]]) -> tuple[int, int, int]:
    """(launches, experts scored per token, rows aligned) of a routing top-k as the engine runs it: a
    `floor="topk"` kernel reading the logits [M, E] and writing the ids [M, k] is the top-k launch, then vLLM's
    alignment (ALIGN_LAUNCHES, sorting the M k routed rows) where the set's implementation of the model's routed
    experts sorts them (ALIGNS; the experts' format is that of the config the kernel's op is bound to; none after a
    triton_kernels routing, OWN_SORT). (1, 0, 0) for every other kernel."""
    cfg = dict(kernel.consts).get("cfg")
    if kernel.floor != "topk" or cfg is None or not kernel.reads or len(kernel.reads[0].shape) != 2:
        return 1, 0, 0
    if kernel.source.startswith(OWN_SORT):
        return 1, kernel.reads[0].shape[1], 0
    m, e = kernel.reads[0].shape
    rule = next((ALIGNS[i] for i in impls.get(f"moe.{cfg.expert_dtype}", ()) if i in ALIGNS), None)
    aligns = rule == "always" or (rule == "dense" and m * cfg.top_k * SPARSITY > e)
    return 1 + ALIGN_LAUNCHES * aligns, e, m * cfg.top_k * aligns


def attn_res_sources(kernel: Kernel) -> int:
    """Sources an AttnRes kernel mixes: the block snapshots it reads ([n, M, D] `blocks`) and the prefix; 0 for
    a kernel that mixes none."""
    return next((t.shape[0] + 1 for t in kernel.reads if t.name == "blocks"), 0)


def sequence_steps(kernel: Kernel, sms: int) -> int:
    """Dependent steps of a small kernel that walks each sequence's tokens in order: one that updates a per-sequence
    state in place (a [B, X, W] history read and written back beside its [M, X] input, M = B T: the causal conv's
    update, vLLM's causal_conv1d_update) runs T steps per program, its programs (B x X / SEQUENCE_BLOCK features) in
    waves of one per SM: waves x T. 0 for every other small kernel."""
    x = kernel.reads[0] if kernel.reads else None
    if x is None or len(x.shape) != 2:
        return 0
    m, width = x.shape
    written = {t.name for t in kernel.writes}
    state = next((t for t in kernel.reads[1:] if t.name in written and len(t.shape) == 3 and t.shape[1] == width
                  and m % t.shape[0] == 0), None)
    if state is None:
        return 0
    b = state.shape[0]
    return m // b * -(-b * -(-width // SEQUENCE_BLOCK) // sms)


def features(kernel: Kernel, law: "LawKey", sms: int, l2_bytes: float,
             impls: Mapping[str, tuple[str, ...]] = {}, tile: "engine_tiles.Tile | None" = None) -> dict[str, float]:
    """Named regressors of the law of `law.family` for `kernel`: each multiplies one constant (module docstring).
    `impls`: the implementation set's role -> implementations (what the engine launches around a kernel);
    `tile`: the tile a measured Triton MoE launch ran with (default: the engine's pick)."""
    fam = law.family
    if fam == "collective":
        c = kernel.collective
        return {"t0": 1.0, "wire_bytes": wire_bytes(c.nbytes, c.ranks, COLLECTIVE_ALGORITHM[law.impl])}
    if fam == "kda":
        b, heads, h, t, extra = kda_shape(kernel)
        state = b * heads * h * h * 4
        waves = -(-(kernel.ctas or b * heads) // (sms * kernel.ctas_per_sm))
        return {"t0": 1.0, "serial": float(waves * t), "state_bytes": 2.0 * state,
                "token_state_bytes": float(extra), "drain_bytes": float(max(0, state + extra - l2_bytes)),
                "drain_state_bytes": float(state)}
    if fam == "mla":
        b, s, heads, t = mla_shape(kernel)
        splits, chunk = mla_splits(b, s, sms)
        blocks = -(-t * heads // MLA_ROWS.get(law.impl, 16))
        programs = b * splits * blocks
        passes = blocks if law.impl in MLA_ROWS else 1  # FlashMLA streams the cache once per row block
        return {"t0": 1.0, "tile_steps": float(-(-programs // sms) * -(-chunk // MLA_TILE)), "splits": float(splits),
                "cache_bytes": float(kernel.hbm_bytes * passes)}
    if fam == "gqa":
        if law.impl == "vllm_fa3":  # one CTA per SM; its split scheduler and combine launch every time (in t0)
            programs, tiles, _ = fa3_grid(kernel, sms)
            waves = -(-programs // sms)
            local = 1.0 if dict(kernel.consts).get("window") else 0.0  # FA3's windowed (local) kernel instance
            return {"t0": 1.0, "local": local, "waves": float(waves),
                    "tile_bytes": float(waves * tiles * fa3_block_bytes(kernel)),
                    "cache_bytes": float(kernel.hbm_bytes)}
        programs, tiles, segments, _ = gqa_grid(kernel)
        waves = -(-programs // (sms * kernel.ctas_per_sm))
        return {"t0": 1.0, "tile_steps": float(waves * tiles), "segments": float(segments),
                "cache_bytes": float(kernel.hbm_bytes)}
    f = {"t0": 1.0, "bytes": float(kernel.hbm_bytes), "flops": float(kernel.flops)}
    if fam == "gemm":
        m, k, n = gemm_shape(kernel)
        out = kernel.write_bytes
        f["bytes"] -= out
        f["out_bytes"] = float(out)
        split = splits_k(m, k, n, law.impl)
        f["narrow_k"] = k / 1000.0 if n <= NARROW_N and not split else 0.0
        f["split_k"] = float(split)
        f["flops"] = tiled_gemm_flops(m, k, n, sms)  # whole tiles, in waves
    if fam == "moe":  # padded tile math: every BLOCK_M-row block of an expert runs a full tile
        tiles, block = moe_tiles(kernel)
        _, rows, experts, k, n = moe_shape(kernel)
        f["experts"] = float(experts)
        if law.impl == "triton_matmul_ogs":  # waves of programs, each streaming its expert's K x 256 slab
            _, _, _, k, _ = moe_shape(kernel)    # and multiplying its BLOCK_M rows by it
            waves, block = ogs_grid(kernel, sms)
            return {"t0": 1.0, "bytes": float(kernel.hbm_bytes),
                    "program_bytes": float(waves * k * OGS_BLOCK_N * OGS_WEIGHT_BYTES),
                    "program_rows": waves * block * k * OGS_BLOCK_N / 1e6}
        if kernel.weights[0].dtype in ("mxfp4", "nvfp4"):  # W4A16: CUDA-core work per tile, not tensor-core math
            del f["flops"]
            f["dequant"] = tiles * k * n / 1e6
            f["a_rereads"] = rows * k * 2 * -(-n // W4A16_BLOCK_N[block]) / 1e6
        elif law.impl in TRITON_MOE:  # HBM against the round trips of the programs' loads (engine_tiles)
            del f["flops"], f["experts"]
            f["rounds"] = triton_moe_rounds(kernel, law.impl, sms, tile)
        else:
            f["flops"] = 2.0 * tiles * block * k * n
    if fam == "small":  # each kernel its own floor, one bandwidth for all
        launches, experts, rows = routing(kernel, impls)
        sources = attn_res_sources(kernel)
        f = {f"t0_{law.role}": 1.0, "bytes": f["bytes"], "extra_launches": float(launches - 1),
             "experts": experts / 1000.0, "aligned_rows": rows / 1000.0, "sources": float(sources),
             "token_steps": float(sequence_steps(kernel, sms))}
        if sources and CHAIN_HIDES_STREAM & set(impls.get("small", ())):  # its sources' chain of reads, or streaming
            f["chain_t0"], f["stream_t0"], f["stream_bytes"] = f.pop(f"t0_{law.role}"), 1.0, f.pop("bytes")
    return f


@dataclass(frozen=True)
class LawKey:
    """Which law prices a kernel: its family, the measured implementation, and the role within the family
    (a small kernel's own floor, fc1 or fc2 of the experts; "" where the family has one law)."""

    family: str
    impl: str
    role: str = ""

    def group(self, kernel: Kernel) -> str:
        """The group whose constants the law shares: one implementation of one family; short- and long-K
        GEMMs apart, fc1 and fc2 apart, the suite's W4A16 per tile config, all small kernels together
        (each with its own floor)."""
        if self.family in ("ceiling", "small"):
            return self.family
        g = f"{self.family}/{self.impl}"
        if self.family == "gemm":  # a short K cannot hide its prologue / epilogue behind the K loop
            return g + ("/short_k" if gemm_shape(kernel)[1] <= SHORT_K else "/long_k")
        if self.family != "moe":
            return g
        g += f"/{self.role}"
        return g + f"/block_m{moe_tiles(kernel)[1]}" if self.impl == "triton_w4a16" else g


# ---------------------------------------------------------------------------------------------------
# implementation sets
# ---------------------------------------------------------------------------------------------------

def role_of(kernel: Kernel) -> tuple[str | None, str]:
    """(role, role key) of a plan kernel, or (None, "") where no measured law can stand for it: a kernel
    that fuses an exchange into its work, an exchange that also computes, a batched GEMM."""
    fam, c = kernel.family, kernel.collective
    if fam == "collective":
        ok = c is not None and not c.in_kernel and not kernel.floor and c.ranks > 1
        return (c.op, "") if ok else (None, "")
    if c is not None:
        return None, ""
    if fam == "gemm":  # a 2-D weight, and a bias of its N outputs where the GEMM adds one (gpt-oss)
        w = kernel.weights
        ok = w and len(w[0].shape) == 2 and kernel.flops > 0
        bias = len(w) == 2 and w[1].shape == (w[0].shape[1],)
        return (("gemm.bias" if bias else "gemm"), "") if ok and (len(w) == 1 or bias) else (None, "")
    if fam == "moe":
        if not (kernel.weights and len(kernel.weights[0].shape) == 3 and kernel.group_rows):
            return None, ""
        role = "fc1" if kernel.key == "fc1" else "fc2"  # a fused fc2 + finalize is a down projection first
        dtype = kernel.weights[0].dtype
        return (f"moe.{dtype}", role) if f"moe.{dtype}" in ROLES else (None, "")
    if fam == "kda":  # the declared algorithm: vLLM's split-V recurrence or one program per head
        has_state = any(len(t.shape) == 4 and t.shape[-1] == t.shape[-2] for t in kernel.reads)
        ok = has_state and f"kda.{kernel.impl}" in ROLES
        return (f"kda.{kernel.impl}", "") if ok else (None, "")
    if fam == "mla":  # a query [M, heads, L + R] and a cache [B, S, L + R]
        ok = len(kernel.reads) > 1 and len(kernel.reads[0].shape) == 3 and any(
            len(t.shape) == 3 for t in kernel.reads[1:])
        return ("mla", "") if ok else (None, "")
    if fam == "gqa":  # a measured law once a GPU's kernel set holds one; the datasheet law until then
        return ("gqa", "") if "gqa" in ROLES and len(kernel.reads) > 3 else (None, "")
    return "small", SAME_LAUNCH.get(kernel.key, kernel.key)


def law_keys(kernel: Kernel, kset: KernelSet) -> tuple[LawKey, ...]:
    """The measured laws of the set that may price `kernel` (an engine takes the fastest of several)."""
    role, key = role_of(kernel)
    if role is None or (kernel.collective is not None and kernel.collective.ranks not in kset.ranks):
        return ()
    fam = "collective" if role in ("all_reduce", "reduce_scatter", "all_gather") else role.split(".")[0]
    impls = kset.impls_of(role)
    if kernel.impl in impls:  # the plan says which implementation launches it (gpt-oss's experts: matmul_ogs)
        impls = (kernel.impl,)
    return tuple(LawKey(fam, impl, key) for impl in impls if impl not in DECLARED_ONLY or impl == kernel.impl)


def law_us(kernel: Kernel, kset: KernelSet, sms: int, l2_bytes: float) -> float | None:
    """Per-launch µs (launch gap of back-to-back graph replay included) of `kernel` under the set's fastest
    measured implementation, or None when no law of the set covers it."""
    best = None
    for key in law_keys(kernel, kset):
        fit = kset.fit(key.group(kernel))
        if fit is None:
            continue
        feats = features(kernel, key, sms, l2_bytes, kset.role_impls)
        if not fit.covers(feats):
            continue
        t = fit.predict(feats)
        best = t if best is None else min(best, t)
    return best


