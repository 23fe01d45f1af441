"""Deterministic seeded weights for one decoder layer, generated lazily and held compactly, and TP
sharding helpers.

Every tensor is drawn from its own stream, `SeedSequence([seed, layer, crc32(name)])`, so a tensor's
values do not depend on which other tensors were generated first. That is what lets the routed
experts be lazy: a full-size Kimi K3 layer at batch 1 generates only the k selected experts
(16 x 17.5 MB in MXFP4 instead of 896 of them), regenerate one that was evicted, and stream the
442 a batch of 64 touches a chunk at a time in any order. Routed experts are drawn by fast/rng.py (NumPy's
PCG64 and ziggurat in Numba: the same numbers, 3-5x as fast, packed as they are drawn), the dense weights
by the same kernel a chunk at a time (rng.NormalStream).

Scaling keeps activations O(1) (STYLE item 13): a linear `[in, out]` is N(0, 1/in); norm weights
are 1 + N(0, 0.1^2); AttnRes projections are N(0, 1/D). Weights are rounded to their checkpoint
format (bf16 everywhere, MXFP4 or FP8 routed experts) and held in it: bf16 values as their 2 bytes,
MXFP4 experts as packed codes + E8M0 scales (0.53 B per weight); float copies are made on request.

Napkin math, Kimi K3 KDA + MoE layer: 634 M dense weights x 2 B = 1.3 GB held (float32 + a float64
copy took 12 B each, 7.6 GB); one expert is 3 x 3584 x 3072 x 0.53 B = 17.5 MB packed.

Layout: activations are rows, weights are `[in, out]`, so y = x @ w. Column-parallel shards split
`out` (w[:, r*out/P:(r+1)*out/P]); row-parallel shards split `in`.
"""

from __future__ import annotations

import os
import time
import zlib
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

import ml_dtypes
import numpy as np
import numpy.typing as npt

from simulator.config import ATTENTION_WEIGHTS, ModelConfig
from simulator.fast import kernels, rng
from simulator.dtypes import Array, round_bf16, round_fp8, round_mxfp4

PARTS = ("w_gate", "w_up", "w_down")
FP32_KINDS = ("a_log", "bias")  # FP32 in the checkpoint; every other non-expert weight is bf16
Packed = tuple[npt.NDArray[np.uint8], npt.NDArray[np.uint8]]  # MXFP4 W^T: codes [N, K/2], E8M0 bits [N, K/32]


def _seed(seed: int, layer: int, name: str) -> np.random.SeedSequence:
    return np.random.SeedSequence([seed, layer, zlib.crc32(name.encode())])


def _rng(seed: int, layer: int, name: str) -> np.random.Generator:
    return np.random.default_rng(_seed(seed, layer, name))


def _normal(seed: int, layer: int, name: str, shape: tuple[int, ...], std: float) -> Array:
    return _rng(seed, layer, name).standard_normal(shape, dtype=np.float32) * np.float32(std)


def _quantize(w: Array, fmt: str) -> Array:
    if fmt == "mxfp4":  # blocks of 32 run along the reduction (input) dimension: quantize w^T
        return np.ascontiguousarray(round_mxfp4(np.ascontiguousarray(w.T)).T)
    if fmt == "fp8":
        return round_fp8(w)
    return round_bf16(w)


def widen(w: np.ndarray, dtype: type) -> Array:
    """A float copy of a held weight (or a shard view of it); bf16 bits are widened exactly (in one compiled
    pass: NumPy's cast of the custom dtype goes element by element)."""
    if w.dtype == ml_dtypes.bfloat16:
        return kernels.bf16_to(w.view(np.uint16), dtype)
    return w.astype(dtype)


class BoundedCache:
    """A byte-bounded cache that keeps what it has: when an insert overflows the bound, the newest
    other entries give way. A pass over more entries than fit then regenerates only the overflow on the
    next pass (least-recently-used eviction would regenerate every one of a cyclic pass)."""

    def __init__(self, limit: int) -> None:
        self.limit, self.items, self.nbytes = limit, OrderedDict(), 0

    def get(self, key: object, make: Callable[[], object], size: Callable[[object], int]) -> object:
        if key in self.items:
            return self.items[key]
        value = make()
        self.items[key] = value
        self.nbytes += size(value)
        while self.nbytes > self.limit and len(self.items) > 1:
            newest = next(k for k in reversed(self.items) if k != key)
            self.nbytes -= size(self.items.pop(newest))
        return value


def _packed_bytes(q: Packed) -> int:
    return q[0].nbytes + q[1].nbytes


def _array_bytes(a: np.ndarray) -> int:
    return a.nbytes


@dataclass
class LayerWeights:
    """All weights of one layer, full (unsharded) size, created on first access and held compactly.

    Held: each dense weight once, in its checkpoint format (bf16 or FP32); routed MXFP4 experts packed
    per part in a cache of `expert_cache_bytes`, regenerated from their own stream when evicted (the
    same numbers every time). A pass over many experts streams them (`stream_experts`): a chunk of
    `stream_chunk_bytes` drawn on all cores, used by every rank, then the next. Float copies for computing (`get`,
    `shard`, `expert`) are made on
    request; full copies are kept in a second cache of `copy_cache_bytes`, so P simulated ranks and the
    reference share one float64 copy of a small weight while a 1.9 GB one is not kept."""

    cfg: ModelConfig
    layer: int
    seed: int
    expert_cache_bytes: int = 4 << 30
    copy_cache_bytes: int = 512 << 20
    stream_chunk_bytes: int = 512 << 20  # packed expert parts held per streamed chunk: ~29 full-size K3 experts
    spill_dir: str | None = None  # a folder for packed parts, read back instead of drawn again (`_draw_parts`)
    _held: dict[str, np.ndarray] = field(default_factory=dict, repr=False)
    _experts: BoundedCache = field(init=False, repr=False)
    _copies: BoundedCache = field(init=False, repr=False)
    _streamed: dict[tuple[int, str], Packed] = field(default_factory=dict, repr=False)  # the chunk in flight
    expert_generations: int = 0  # expert parts generated (more than the touched parts x 3 means evictions)
    spill_reads: int = 0  # expert parts read back from spill_dir instead of drawn
    # wall seconds spent drawing and packing weights, or reading them back (benchmarks take it out)
    generate_s: float = 0.0

    def __post_init__(self) -> None:
        self._experts = BoundedCache(self.expert_cache_bytes)
        self._copies = BoundedCache(self.copy_cache_bytes)

    def __getitem__(self, name: str) -> Array:
        """The weight's values in a float32 container (float64 if it was made so)."""
        return self.get(name, np.float64 if self._held_weight(name).dtype == np.float64 else np.float32)

    def get(self, name: str, dtype: type) -> Array:
        """The full weight in a compute dtype; one copy per (weight, dtype) while it fits the copy cache."""
        if name.startswith("expert."):
            _, e, part = name.split(".")
            return self.expert_float(int(e), part, dtype)
        held = self._held_weight(name)
        if held.dtype == dtype:
            return held
        return self._copies.get((name, np.dtype(dtype).name), lambda: widen(held, dtype), _array_bytes)

    def held(self, name: str) -> np.ndarray:
        """The weight as held (bf16, FP32): read it, do not write it."""
        return self._held_weight(name)

    def shard(self, name: str, dtype: type | None, how: str, rank: int, tp: int) -> Array:
        """Rank r's shard ("col", "col/n", "row" or "full"; `shard_piece`) in `dtype`: only the shard is converted
        (each rank reads its own once); a view of the held weight when `dtype` is None or the held dtype. "rank0": the
        whole weight on rank 0 and zeros on the others (a row-parallel layer's bias, added once by the sum)."""
        held = self._held_weight(name)
        if how == "rank0" and rank:
            return np.zeros(held.shape, dtype or held.dtype)
        if how in ("full", "rank0") and dtype is not None:
            return self.get(name, dtype)
        part = shard_array(held, how, rank, tp)
        return part if dtype is None or held.dtype == dtype else widen(part, dtype)

    def expert(self, e: int, dtype: type = np.float32) -> tuple[Array, Array, Array]:
        """Routed expert e: (w_gate [Din, F], w_up [Din, F], w_down [F, Din]) as float arrays."""
        return tuple(self.expert_float(e, p, dtype) for p in PARTS)

    def expert_float(self, e: int, part: str, dtype: type) -> Array:
        """One part of routed expert e as a float array, kept in the copy cache. Only that part: a kernel
        that reads gate and up must not draw the down part outside the chunk being streamed."""
        def make() -> Array:
            if not self.packs_experts:
                return self._make(f"expert.{e}.{part}").astype(dtype)
            return kernels.mxfp4_dequantize_t(*self.expert_part(e, part), dtype)
        return self._copies.get((f"expert.{e}.{part}", np.dtype(dtype).name), make, _array_bytes)

    def expert_part(self, e: int, part: str) -> Packed:
        """One part of routed expert e as MXFP4 W^T: codes [N, K/2] and E8M0 scale bits [N, K/32]."""
        if (e, part) in self._streamed:
            return self._streamed[(e, part)]
        return self._experts.get((e, part), lambda: self._draw_parts([(e, part)])[0], _packed_bytes)

    def expert_packed(self, e: int) -> tuple[Packed, Packed, Packed]:
        return tuple(self.expert_part(e, p) for p in PARTS)

    def stream_experts(self, experts: Iterable[int], parts: Iterable[str] = PARTS) -> Iterator[list[int]]:
        """The experts in order, a chunk of about `stream_chunk_bytes` of packed parts at a time: the chunk's
        parts missing from the cache are drawn on all cores and held (`expert_part` finds them) until
        the next chunk is asked for. A pass that runs every rank over a chunk before the next (expert-
        major) then draws each touched expert once, holding one chunk beside the bounded cache: at
        batch 64, 442 experts x 17.5 MB = 7.8 GB would not fit, and a rank-major pass drew the overflow
        once per rank."""
        experts, parts = [int(e) for e in experts], list(parts)
        if not self.packs_experts:
            yield experts
            return
        per_chunk = max(1, self.stream_chunk_bytes // (len(parts) * self._part_bytes))
        try:
            for i in range(0, len(experts), per_chunk):
                keys = [(e, p) for e in experts[i:i + per_chunk] for p in parts]
                missing = [key for key in keys if key not in self._experts.items]
                drawn = dict(zip(missing, self._draw_parts(missing)))
                self._streamed = {key: self._experts.items.get(key) or drawn[key] for key in keys}
                for key, q in drawn.items():  # the cache keeps what it has room for
                    self._experts.get(key, lambda q=q: q, _packed_bytes)
                yield experts[i:i + per_chunk]
        finally:
            self._streamed = {}

    def _draw_parts(self, keys: list[tuple[int, str]]) -> list[Packed]:
        """Expert parts drawn and packed on all cores (each from its own stream: order changes nothing).

        With `spill_dir`, every part drawn is also written there (0.53 B a weight), and a part found there
        is read instead of drawn: a pass over more experts than the bounded cache holds (three paths over
        the 7.8 GB a batch-64 layer touches) draws each part once, and later passes read 5.8 MB files
        (from the page cache, when the machine has the room) instead of drawing 11 M normals. The files
        are named by model, layer, seed, expert and part; the folder is the caller's (a temporary one)."""
        t0 = time.perf_counter()
        paths = [self._spill_path(key) for key in keys]
        spilled = [path is not None and os.path.exists(path) for path in paths]
        with ThreadPoolExecutor(max_workers=min(len(keys), os.cpu_count() or 1) or 1) as pool:
            made = list(pool.map(self._read_or_draw, keys, paths, spilled))
        self.generate_s += time.perf_counter() - t0
        self.spill_reads += sum(spilled)
        self.expert_generations += len(keys) - sum(spilled)
        return made

    def _spill_path(self, key: tuple[int, str]) -> str | None:
        if self.spill_dir is None:
            return None
        return os.path.join(self.spill_dir,
                            f"{self.cfg.name}-layer{self.layer}-seed{self.seed}-expert{key[0]}-{key[1]}.mxfp4")

    def _read_or_draw(self, key: tuple[int, str], path: str | None, spilled: bool) -> Packed:
        """Part `key` read from its spill file `path` (codes, then scale bits), or drawn (and spilled there)."""
        name = f"expert.{key[0]}.{key[1]}"
        (k, n), _ = weight_spec(self.cfg, name)
        if spilled:
            flat = np.fromfile(path, np.uint8)
            if flat.size != n * k // 2 + n * k // 32:  # a stale file of another shape under the same name
                raise ValueError(f"spill file {path} holds {flat.size} bytes, not the {n * k * 17 // 32} of "
                                 f"{name} [{k}, {n}] in MXFP4; use an empty --spill-dir")
            return flat[:n * k // 2].reshape(n, k // 2), flat[n * k // 2:].reshape(n, k // 32)
        codes, bits = self._make_packed(name)
        if path is not None:  # written whole under a temporary name, so a reader never sees half a file
            with open(path + ".part", "wb") as f:  # the arrays' own buffers (C-ordered): no 5.8 MB bytes copy
                f.write(memoryview(codes))
                f.write(memoryview(bits))
            os.replace(path + ".part", path)
        return codes, bits

    @property
    def _part_bytes(self) -> int:
        return self.cfg.expert_in_dim * self.cfg.moe_intermediate * 17 // 32  # codes (1/2 B) + scales (1/32 B)

    @property
    def packs_experts(self) -> bool:
        """Experts are held packed when the checkpoint is MXFP4 (config.py checks the 32-blocks)."""
        return self.cfg.expert_dtype == "mxfp4"

    @property
    def held_bytes(self) -> int:
        """Bytes held: dense weights, packed experts and kept float copies."""
        return sum(a.nbytes for a in self._held.values()) + self._experts.nbytes + self._copies.nbytes

    def cached_experts(self) -> list[int]:
        return sorted({e for e, _ in self._experts.items})

    def materialize(self, names: Iterable[str] = (), workers: int | None = None) -> None:
        """Generate the named weights now, on `workers` threads: the drawing kernels release the GIL, and
        each tensor has its own stream, so no value changes."""
        names = [n for n in names if n not in self._held]
        t0 = time.perf_counter()
        with ThreadPoolExecutor(max_workers=workers or os.cpu_count() or 1) as pool:
            made = list(pool.map(lambda n: self._make_held(n), names))
        self.generate_s += time.perf_counter() - t0
        self._held.update(zip(names, made))

    # ------------------------------------------------------------------ generation
    def _held_weight(self, name: str) -> np.ndarray:
        if name not in self._held:
            t0 = time.perf_counter()
            self._held[name] = self._make_held(name)
            self.generate_s += time.perf_counter() - t0
        return self._held[name]

    def _make_held(self, name: str) -> np.ndarray:
        """The weight in its checkpoint container: a bf16 value keeps its 2 bytes only."""
        w = self._make(name)
        if w.dtype != ml_dtypes.bfloat16 and weight_spec(self.cfg, name)[1] not in FP32_KINDS:
            return w.astype(ml_dtypes.bfloat16)
        return w

    def _make_packed(self, name: str) -> Packed:
        """MXFP4 expert `name` straight from its stream to codes + scales: the same draws, scaling and
        rounding as `_make` (rng.py draws NumPy's numbers 3-5x as fast and packs them a 32-row strip
        at a time), without its float32 part in memory."""
        shape, _ = weight_spec(self.cfg, name)
        return rng.draw_mxfp4_t(_seed(self.seed, self.layer, name), shape, shape[0] ** -0.5)

    def _make(self, name: str) -> Array:
        """The weight's values: FP32 kinds and experts as float32 containers, the rest as bfloat16."""
        shape, kind = weight_spec(self.cfg, name)
        if kind == "a_log":  # exp(A_log) in [1, 16]: gates neither saturated nor flat
            return np.log(_rng(self.seed, self.layer, name).uniform(1.0, 16.0, shape)).astype(np.float32)
        if kind == "bias":
            return _normal(self.seed, self.layer, name, shape, 0.05)  # FP32 correction bias
        if kind == "expert":
            return _quantize(_normal(self.seed, self.layer, name, shape, shape[0] ** -0.5), self.cfg.expert_dtype)
        if kind in ("norm", "dt_bias"):
            std = 0.1 if kind == "norm" else 0.5
        elif kind in ("res_proj", "conv"):
            std = (self.cfg.hidden_size if kind == "res_proj" else shape[-1]) ** -0.5
        else:
            std = shape[0] ** -0.5
        return _normal_bf16(_seed(self.seed, self.layer, name), shape, std, 1.0 if kind == "norm" else 0.0)


DRAW_CHUNK = 1 << 22  # elements drawn at a time: 16 MB of float32 scratch, whatever the weight's size


def _normal_bf16(seed: np.random.SeedSequence, shape: tuple[int, ...], std: float, offset: float) -> np.ndarray:
    """bf16(offset + N(0, std^2)) drawn in row chunks into the bf16 array: the same stream and the same
    float32 arithmetic as drawing it whole (rng.NormalStream continues NumPy's stream from chunk to chunk),
    without the 2.4 GB of float32 temporaries the 7168 x 33792 dense FFN weight would take."""
    out, stream = np.empty(shape, ml_dtypes.bfloat16), rng.NormalStream(seed)
    rows = max(1, DRAW_CHUNK // max(1, int(np.prod(shape[1:], dtype=np.int64))))
    chunk = np.empty((min(rows, shape[0]),) + shape[1:], np.float32)
    for r0 in range(0, shape[0], rows):
        part = chunk[:min(rows, shape[0] - r0)]
        stream.fill(part, std)
        out[r0:r0 + rows] = (part + offset if offset else part).astype(ml_dtypes.bfloat16)
    return out


def weight_spec(cfg: ModelConfig, name: str) -> tuple[tuple[int, ...], str]:
    """Full shape and init kind of a named weight (the single table of weight names)."""
    f_in = cfg.expert_in_dim
    if name.startswith("expert."):
        _, _, part = name.split(".")
        shape = (cfg.moe_intermediate, f_in) if part == "w_down" else (f_in, cfg.moe_intermediate)
        return shape, "expert"
    table = weight_table(cfg)
    if name not in table:
        raise KeyError(f"unknown weight '{name}'")
    return table[name]


def weight_table(cfg: ModelConfig) -> dict[str, tuple[tuple[int, ...], str]]:
    """name -> (full shape, init kind) of every non-expert weight a layer may hold: the residual stream's
    (AttnRes' mix weights only for a model that has it), each attention kind's (ATTENTION_WEIGHTS), the FFN's."""
    d = cfg.hidden_size
    attn_res = {"attn_res_norm": ((d,), "norm"), "attn_res_proj": ((d,), "res_proj"),
                "mlp_res_norm": ((d,), "norm"), "mlp_res_proj": ((d,), "res_proj")}
    table = (attn_res if cfg.residual == "attn_res" else {}) | {"input_norm": ((d,), "norm"),
                                                               "post_attn_norm": ((d,), "norm")}
    for weights in ATTENTION_WEIGHTS.values():
        table |= weights(cfg)
    return table | _biases(cfg) | {
        # MoE
        "router.w": ((d, cfg.num_experts), "linear"), "router.bias": ((cfg.num_experts,), "bias"),
        "latent.w_down": ((d, cfg.latent_dim), "linear"), "latent.norm": ((cfg.latent_dim,), "norm"),
        "latent.w_up": ((cfg.latent_dim, d), "linear"),
        "shared.w_gate": ((d, cfg.shared_intermediate), "linear"),
        "shared.w_up": ((d, cfg.shared_intermediate), "linear"),
        "shared.w_down": ((cfg.shared_intermediate, d), "linear"),
        # dense FFN
        "dense.w_gate": ((d, cfg.dense_intermediate), "linear"),
        "dense.w_up": ((d, cfg.dense_intermediate), "linear"),
        "dense.w_down": ((cfg.dense_intermediate, d), "linear"),
    }


def _biases(cfg: ModelConfig) -> dict[str, tuple[tuple[int, ...], str]]:
    """gpt-oss's biases, for a model that has them: the router linear's logit bias, every routed expert's gate, up
    and down biases (one row per expert; down is added once, by rank 0) and o_proj's (row-parallel: rank 0 adds it)."""
    E, F, d = cfg.num_experts, cfg.moe_intermediate, cfg.hidden_size
    return (({"router.logit_bias": ((E,), "bias")} if cfg.router_logit_bias else {})
            | ({"expert_bias.gate": ((E, F), "bias"), "expert_bias.up": ((E, F), "bias"),
                "expert_bias.down": ((E, cfg.expert_in_dim), "bias")} if cfg.expert_bias else {})
            | ({"o_proj.bias": ((d,), "bias")} if cfg.o_proj_bias else {}))


def model_weight_table(cfg: ModelConfig) -> dict[str, tuple[tuple[int, ...], str]]:
    """name -> (full shape, TP layout) of the weights outside the decoder layers: the vocab-parallel
    embedding (rows split by vocab) and LM head (columns split by vocab). The executor simulates one
    layer, so only the cost model reads these."""
    v, d = cfg.vocab_size, cfg.hidden_size
    return {"embed": ((v, d), "row"), "lm_head": ((d, v), "col")}


def shard_piece(shard: str, rank: int, tp: int) -> tuple[str, int, int]:
    """(layout, piece, pieces) of rank r under `shard`. "col/n": the columns cut into n pieces, each held by
    P/n ranks, rank r holding piece r n / P (vLLM's key/value heads when TP exceeds them: Nkv pieces, each head
    replicated on P/Nkv ranks); every other layout is cut into P pieces, rank r holding piece r."""
    if not shard.startswith("col/"):
        return shard, rank, tp
    pieces = int(shard[4:])
    if pieces <= 0 or tp % pieces:
        raise ValueError(f"shard {shard!r} needs a TP degree that is a multiple of {pieces}, not {tp}")
    return "col", rank * pieces // tp, pieces


def shard_array(w: Array, shard: str, rank: int, tp: int) -> Array:
    """Rank r's view of a whole array under `shard` (`shard_piece`); "rank0": zeros on every other rank."""
    if shard == "rank0":
        return w if rank == 0 else np.zeros_like(w)
    how, piece, pieces = shard_piece(shard, rank, tp)
    if how == "col":
        return column_shard(w, piece, pieces)
    return row_shard(w, rank, tp) if how == "row" else w


def shard_shape(shape: tuple[int, ...], shard: str, tp: int) -> tuple[int, ...]:
    """Per-rank shape of a weight under `shard`: "col" splits the last axis in P, "col/n" in n, "row" the first
    axis in P, "full" and "rank0" none."""
    if shard.startswith("col"):
        return shape[:-1] + (shape[-1] // shard_piece(shard, 0, tp)[2],)
    if shard == "row":
        return (shape[0] // tp,) + shape[1:]
    return shape


# ---------------------------------------------------------------------------------------
# tensor-parallel sharding (views, no copies)
# ---------------------------------------------------------------------------------------

def column_shard(w: Array, rank: int, tp: int) -> Array:
    """Output columns of rank r: w[..., r*out/P:(r+1)*out/P]  ->  [in, out/P]."""
    n = w.shape[-1] // tp
    return w[..., rank * n:(rank + 1) * n]


def row_shard(w: Array, rank: int, tp: int) -> Array:
    """Input rows of rank r: w[r*in/P:(r+1)*in/P]  ->  [in/P, ...]."""
    n = w.shape[0] // tp
    return w[rank * n:(rank + 1) * n]
