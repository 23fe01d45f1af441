"""Model configuration: Hugging Face `config.json` -> one frozen, validated `ModelConfig`.

These `model_type`s are understood:
- `kimi_k3`     the multimodal wrapper; the text model is nested under `text_config`;
- `kimi_linear` KDA + MLA hybrid with (latent) MoE, Block Attention Residuals, SiTU-GLU;
- `deepseek_v3` MLA (RoPE) + classic MoE with grouped top-k, SiLU-GLU, plain residual;
- `gpt_oss`     GQA with sinks on sliding / full layers + top-k-softmax MoE with biases, clamped SwiGLU;
- `qwen3_moe`   GQA with QK-norm + softmax top-k MoE, SiLU-GLU;
- `mixtral`     GQA (optionally windowed) + softmax top-k MoE, renormalised, SiLU-GLU.

Dimension legend (scaling-book letters): D hidden, F expert hidden, E routed experts, k active experts,
N heads, H head dim, L latent (routed_expert_hidden_size), P tensor-parallel degree.

Only JSON is read, never executed. Every problem becomes one `UserError` sentence naming the field.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from simulator.errors import UserError
from simulator.paths import data_dir

MODELS_DIR = data_dir("models")
ACTIVATIONS = ("situ", "silu", "swiglu_oai")  # swiglu_oai: gpt-oss's clamped SwiGLU (ops/experts.glu)
ATTENTION_KINDS = ("kda", "mla", "gqa")  # each an entry of simulator/attention/ (kernels, reference, state, memory)
RESIDUALS = ("attn_res", "plain")  # Block Attention Residuals (Kimi K3), or a plain residual add + RMSNorm
EXPERT_DTYPES = ("mxfp4", "fp8", "bf16")
MAX_LAYERS = 10_000  # sanity bound on num_hidden_layers; Llama 3.1 405B has 126, DeepSeek-V3 61, Kimi K3 93


@dataclass(frozen=True, slots=True)
class RopeScaling:
    """YaRN context extension of RoPE (Peng et al. 2023, arXiv:2309.00071, section 3.2 "NTK-by-parts").

    A model trained at `original_max` positions and stretched by `factor`: rotary pairs that turn more
    than `beta_fast` times over `original_max` keep their frequency (extrapolated), pairs that turn fewer
    than `beta_slow` times are interpolated (frequency / factor), and a linear ramp blends the band in
    between (`simulator.ops.mla.rope_inv_freq`). Attention logits are sharpened by the temperature

        mscale = 0.1 * mscale_all_dim * ln(factor) + 1,      softmax scale = (Dn + R)^-1/2 * mscale^2

    (paper section 3.4: sqrt(1/t) = 0.1 ln(s) + 1; DeepSeek-V3 folds it into the softmax scale of every head,
    all dims, hence `mscale_all_dim`). DeepSeek-V3: factor 40, original 4096, beta 32 / 1, mscale 1, so
    the scale goes from 192^-1/2 = 0.0722 to 0.0722 * (0.1 ln 40 + 1)^2 = 0.1352. Both corrections apply
    whenever the config carries them, as in Hugging Face's DeepSeek-V3 attention (DeepSeek's own inference
    script applies them only when its max_seq_len exceeds original_max; the checkpoint's config is the contract).
    """

    factor: float  # s: context stretch
    original_max: int  # L: original_max_position_embeddings
    beta_fast: float = 32.0  # rotations above which a pair is extrapolated (unchanged)
    beta_slow: float = 1.0  # rotations below which a pair is interpolated (frequency / s)
    mscale_all_dim: float = 0.0  # 0: no logit temperature (Hugging Face's default)
    truncate: bool = True  # floor / ceil the correction range's ends (DeepSeek-V3); False keeps them (gpt-oss)

    @property
    def softmax_mscale(self) -> float:
        """mscale of the softmax scale; 1 when `factor` <= 1 or `mscale_all_dim` is 0."""
        if self.factor <= 1 or not self.mscale_all_dim:
            return 1.0
        return 0.1 * self.mscale_all_dim * math.log(self.factor) + 1.0


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """One decoder stack. Field names follow the math, not any one checkpoint's keys."""

    name: str
    family: str
    hidden_size: int  # D
    vocab_size: int
    num_layers: int
    rms_norm_eps: float
    attn_kinds: tuple[str, ...]  # per 0-based layer: an attention kind of simulator.attention ("kda", "mla")
    first_k_dense: int  # layers [0, first_k_dense) use a dense FFN instead of MoE
    dense_intermediate: int  # dense FFN width
    hidden_act: str  # "situ" | "silu" | "swiglu_oai"
    situ_beta: float  # beta_1 on the gate branch
    situ_linear_beta: float  # beta_2 on the up branch
    # --- MLA ---
    mla_heads: int
    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_dim: int
    qk_rope_dim: int
    v_head_dim: int
    mla_nope: bool  # True: the rope slot is never rotated (Kimi); False: RoPE (DeepSeek)
    mla_output_gate: bool  # sigmoid(g_proj x) multiplies the attention output before o_proj
    mla_lora_eps: float  # eps of q_a / kv_a RMSNorms (first-party Kimi uses 1e-6)
    rope_theta: float
    # --- KDA ---
    kda_heads: int
    kda_head_dim: int
    conv_size: int
    gate_lower_bound: float
    # --- MoE ---
    num_experts: int  # E
    top_k: int  # k
    moe_intermediate: int  # F
    num_shared_experts: int  # S (stored as one MLP of width S*F)
    latent_dim: int  # L; 0 means classic MoE (experts run on D)
    latent_norm: bool  # RMSNorm of the weighted latent sum before the up-projection
    router_act: str  # "sigmoid" | "softmax"
    n_group: int
    topk_group: int
    renormalize: bool
    routed_scaling_factor: float
    # --- residual stream ---
    attn_res_block: int  # Block AttnRes block size; 0 with a plain residual
    expert_dtype: str  # storage of routed experts: "mxfp4" | "fp8" | "bf16"
    rope_scaling: RopeScaling | None = None  # YaRN; None: plain RoPE at rope_theta
    residual: str = "plain"  # "attn_res": Block AttnRes mixes the layer inputs; "plain": residual add + RMSNorm
    # --- gpt-oss's MoE and attention extras ---
    swiglu_limit: float = 7.0  # swiglu_oai: gate clamped to <= limit, up to [-limit, limit]
    swiglu_alpha: float = 1.702  # swiglu_oai: gate * sigmoid(alpha * gate)
    router_logit_bias: bool = False  # the router linear adds a learned bias to its logits (gpt-oss)
    selection_bias: bool = True  # a selection-only score bias (DeepSeek-V3's e_score_correction_bias, Kimi);
    # False for plain softmax top-k routers (Qwen3-MoE, Mixtral, gpt-oss)
    expert_bias: bool = False  # biases on every routed expert's gate, up and down projections (gpt-oss)
    o_proj_bias: bool = False  # a bias on the attention output projection (gpt-oss: attention_bias)
    # --- GQA (RoPE at rope_theta / rope_scaling) ---
    gqa_heads: int = 0  # Nq query heads
    gqa_kv_heads: int = 0  # Nkv key/value heads (Nq / Nkv queries share each)
    gqa_head_dim: int = 0  # H
    gqa_qkv_bias: bool = False  # biases on the q, k, v projections (gpt-oss)
    gqa_qk_norm: bool = False  # per-head RMSNorm of q and k before RoPE (Qwen3)
    gqa_sinks: bool = False  # one learned sink logit per head in the softmax denominator (gpt-oss)
    gqa_windows: tuple[int, ...] = ()  # per layer: sliding window in tokens (0: full attention); () all full
    # --- as a drafter (this simulator's keys moe_sim_drafting, moe_sim_target_taps) ---
    drafting: str = "autoregressive"  # "block": one forward proposes every draft token
    target_taps: int = 1  # target layers whose hidden states the drafter's input projection reads
    source: str = field(default="", compare=False)  # file the config came from

    def __post_init__(self) -> None:
        _validate(self)

    # derived quantities ------------------------------------------------------------
    @property
    def shared_intermediate(self) -> int:
        return self.num_shared_experts * self.moe_intermediate

    @property
    def mla_qk_head_dim(self) -> int:
        return self.qk_nope_dim + self.qk_rope_dim

    @property
    def mla_softmax_scale(self) -> float:
        """(Dn + R)^-1/2, times YaRN's mscale^2 when the config stretches RoPE (0.1352 for DeepSeek-V3)."""
        mscale = self.rope_scaling.softmax_mscale if self.rope_scaling else 1.0
        return self.mla_qk_head_dim ** -0.5 * mscale * mscale

    @property
    def kda_width(self) -> int:
        return self.kda_heads * self.kda_head_dim

    @property
    def expert_in_dim(self) -> int:
        """Width the routed experts run in: the latent L when present, else D."""
        return self.latent_dim or self.hidden_size

    @property
    def has_moe(self) -> bool:
        return self.first_k_dense < self.num_layers

    @property
    def has_kda(self) -> bool:
        return "kda" in self.attn_kinds

    def gqa_window(self, layer: int) -> int:
        """Sliding window of a GQA layer in tokens, the current one included; 0 for full attention."""
        return self.gqa_windows[layer] if self.gqa_windows else 0

    def layer_type(self, layer: int) -> str:
        """`kda`, `mla` or `dense` (a dense FFN layer; its attention kind is `attn_kinds[layer]`)."""
        return "dense" if layer < self.first_k_dense else self.attn_kinds[layer]

    def first_layer_of(self, layer_type: str) -> int:
        for i in range(self.num_layers):
            if self.layer_type(i) == layer_type:
                return i
        raise UserError(f"model '{self.name}' has no layer of type '{layer_type}'.")

    def layer_counts(self) -> dict[str, int]:
        """Layers of each type: the first `first_k_dense` are dense, the rest by attention kind (each kind the
        model has, in ATTENTION_KINDS order)."""
        dense = min(self.first_k_dense, self.num_layers)
        moe = self.attn_kinds[dense:self.num_layers]
        return {kind: moe.count(kind) for kind in ATTENTION_KINDS if kind in self.attn_kinds} | {"dense": dense}


# ---------------------------------------------------------------------------------------
# each attention kind's weights (its kernels, reference and state are its entry in simulator/attention/)
# ---------------------------------------------------------------------------------------

def _kda_weights(cfg: ModelConfig) -> dict[str, tuple[tuple[int, ...], str]]:
    d, kn, kh, w = cfg.hidden_size, cfg.kda_heads, cfg.kda_head_dim, cfg.conv_size
    return {
        "kda.w_q": ((d, kn * kh), "linear"), "kda.w_k": ((d, kn * kh), "linear"),
        "kda.w_v": ((d, kn * kh), "linear"), "kda.w_g": ((d, kn * kh), "linear"),
        "kda.w_fa": ((d, kh), "linear"), "kda.w_fb": ((kh, kn * kh), "linear"),
        "kda.w_b": ((d, kn), "linear"),
        "kda.conv_q": ((kn * kh, w), "conv"), "kda.conv_k": ((kn * kh, w), "conv"),
        "kda.conv_v": ((kn * kh, w), "conv"),
        "kda.dt_bias": ((kn * kh,), "dt_bias"), "kda.a_log": ((kn,), "a_log"),
        "kda.o_norm": ((kh,), "norm"), "kda.w_o": ((kn * kh, d), "linear"),
    }


def _mla_weights(cfg: ModelConfig) -> dict[str, tuple[tuple[int, ...], str]]:
    d, n, h = cfg.hidden_size, cfg.mla_heads, cfg.v_head_dim
    return {
        "mla.w_qa": ((d, cfg.q_lora_rank), "linear"),
        "mla.w_kva": ((d, cfg.kv_lora_rank + cfg.qk_rope_dim), "linear"),
        "mla.q_a_norm": ((cfg.q_lora_rank,), "norm"), "mla.kv_a_norm": ((cfg.kv_lora_rank,), "norm"),
        "mla.w_qb": ((cfg.q_lora_rank, n * cfg.mla_qk_head_dim), "linear"),
        "mla.w_uk": ((cfg.kv_lora_rank, n * cfg.qk_nope_dim), "linear"),
        "mla.w_uv": ((cfg.kv_lora_rank, n * h), "linear"),
        "mla.w_g": ((d, n * h), "linear"), "mla.w_o": ((n * h, d), "linear"),
    }


# kind -> the weights its fields imply (name -> full shape, init kind), read by weights.weight_table; a kind's
# `<kind>.w_o` is [attention output width, D], the rows o_proj reads
def _gqa_weights(cfg: ModelConfig) -> dict[str, tuple[tuple[int, ...], str]]:
    d, q, kv = cfg.hidden_size, cfg.gqa_heads * cfg.gqa_head_dim, cfg.gqa_kv_heads * cfg.gqa_head_dim
    bias = {"gqa.b_q": ((q,), "bias"), "gqa.b_k": ((kv,), "bias"), "gqa.b_v": ((kv,), "bias")}
    return ({"gqa.w_q": ((d, q), "linear"), "gqa.w_k": ((d, kv), "linear"), "gqa.w_v": ((d, kv), "linear")}
            | (bias if cfg.gqa_qkv_bias else {})
            | {"gqa.q_norm": ((cfg.gqa_head_dim,), "norm"), "gqa.k_norm": ((cfg.gqa_head_dim,), "norm"),
               "gqa.sinks": ((cfg.gqa_heads,), "bias"), "gqa.w_o": ((q, d), "linear")})


ATTENTION_WEIGHTS: dict[str, Callable[[ModelConfig], dict[str, tuple[tuple[int, ...], str]]]] = {
    "kda": _kda_weights, "mla": _mla_weights, "gqa": _gqa_weights}



# ---------------------------------------------------------------------------------------
# validation
# ---------------------------------------------------------------------------------------

def _bad(cfg: ModelConfig, fname: str, msg: str) -> UserError:
    where = f" ({cfg.source})" if cfg.source else ""
    return UserError(f"model '{cfg.name}'{where}: field '{fname}' = {getattr(cfg, fname)!r} {msg}.")


def _validate(cfg: ModelConfig) -> None:
    positive = ["hidden_size", "vocab_size", "num_layers", "n_group", "topk_group"]
    if "mla" in cfg.attn_kinds:
        positive += ["mla_heads", "q_lora_rank", "kv_lora_rank", "qk_nope_dim", "v_head_dim"]
    if "gqa" in cfg.attn_kinds:
        positive += ["gqa_heads", "gqa_kv_heads", "gqa_head_dim"]
    if cfg.has_moe:  # an all-dense model (a drafter) needs no expert fields
        positive += ["num_experts", "top_k", "moe_intermediate"]
    for name in positive:
        if not isinstance(getattr(cfg, name), int) or getattr(cfg, name) <= 0:
            raise _bad(cfg, name, "must be a positive integer")
    for name in ("qk_rope_dim", "first_k_dense", "num_shared_experts", "latent_dim", "attn_res_block",
                 "kda_heads", "kda_head_dim", "conv_size", "dense_intermediate"):
        if not isinstance(getattr(cfg, name), int) or getattr(cfg, name) < 0:
            raise _bad(cfg, name, "must be a non-negative integer")
    for name in ("rms_norm_eps", "mla_lora_eps", "rope_theta", "situ_beta", "situ_linear_beta",
                 "routed_scaling_factor"):
        if not 0 < getattr(cfg, name) < math.inf:  # also refuses NaN, which fails every comparison
            raise _bad(cfg, name, "must be a finite positive number")
    if not math.isfinite(cfg.gate_lower_bound):
        raise _bad(cfg, "gate_lower_bound", "must be a finite number")
    if cfg.num_layers > MAX_LAYERS:
        raise _bad(cfg, "num_layers", f"exceeds {MAX_LAYERS} (a sanity bound: the deepest public decoder stacks "
                                      "have ~130 layers, and every layer is listed and looped over)")
    if cfg.hidden_act not in ACTIVATIONS:
        raise _bad(cfg, "hidden_act", f"is not a known activation (known: {', '.join(ACTIVATIONS)})")
    if cfg.router_act not in ("sigmoid", "softmax"):
        raise _bad(cfg, "router_act", "must be 'sigmoid' or 'softmax'")
    if cfg.expert_dtype not in EXPERT_DTYPES:
        raise _bad(cfg, "expert_dtype", f"is not a known expert format (known: {', '.join(EXPERT_DTYPES)})")
    if not cfg.has_moe:
        return _validate_layers(cfg)
    if cfg.top_k > cfg.num_experts:
        raise _bad(cfg, "top_k", f"exceeds the number of routed experts ({cfg.num_experts})")
    if cfg.num_experts % cfg.n_group:
        raise _bad(cfg, "n_group", f"does not divide the number of routed experts ({cfg.num_experts})")
    if cfg.topk_group > cfg.n_group:
        raise _bad(cfg, "topk_group", f"exceeds the number of expert groups ({cfg.n_group})")
    if cfg.top_k > cfg.topk_group * (cfg.num_experts // cfg.n_group):
        raise _bad(cfg, "top_k", "exceeds the experts available in the selected groups")
    if cfg.expert_dtype == "mxfp4" and cfg.expert_in_dim % 32:
        raise _bad(cfg, "latent_dim", "must be a multiple of 32 for MXFP4 experts (one scale per 32)")
    if cfg.expert_dtype == "mxfp4" and cfg.moe_intermediate % 32:
        raise _bad(cfg, "moe_intermediate", "must be a multiple of 32 for MXFP4 experts (one scale per 32)")
    _validate_layers(cfg)


def _validate_layers(cfg: ModelConfig) -> None:
    if len(cfg.attn_kinds) != cfg.num_layers:
        raise _bad(cfg, "attn_kinds", f"lists {len(cfg.attn_kinds)} layers but num_layers is {cfg.num_layers}")
    if any(kind not in ATTENTION_KINDS for kind in cfg.attn_kinds):
        raise _bad(cfg, "attn_kinds", f"may only hold attention kinds {', '.join(ATTENTION_KINDS)}")
    if cfg.residual not in RESIDUALS or (cfg.residual == "attn_res") != (cfg.attn_res_block > 0):
        raise _bad(cfg, "residual", "must be 'attn_res' with a positive attn_res_block, or 'plain' with 0")
    if cfg.has_kda and (cfg.kda_heads <= 0 or cfg.kda_head_dim <= 0 or cfg.conv_size <= 0):
        raise _bad(cfg, "kda_heads", "must be positive (with kda_head_dim and conv_size) when KDA layers exist")
    if cfg.first_k_dense > cfg.num_layers:
        raise _bad(cfg, "first_k_dense", f"exceeds num_layers ({cfg.num_layers})")
    if cfg.first_k_dense and cfg.dense_intermediate <= 0:
        raise _bad(cfg, "dense_intermediate", "must be positive when dense layers exist")
    if not cfg.mla_nope and cfg.qk_rope_dim % 2:
        raise _bad(cfg, "qk_rope_dim", "must be even for RoPE")
    if "gqa" in cfg.attn_kinds:
        _validate_gqa(cfg)
    if not cfg.mla_nope and cfg.rope_theta <= 1:
        raise _bad(cfg, "rope_theta", "must exceed 1 for RoPE (frequencies theta^(-2i/R) must fall with i)")


def _validate_gqa(cfg: ModelConfig) -> None:
    if cfg.gqa_heads % cfg.gqa_kv_heads:
        raise _bad(cfg, "gqa_kv_heads", f"does not divide the query heads ({cfg.gqa_heads})")
    if cfg.gqa_head_dim % 2:
        raise _bad(cfg, "gqa_head_dim", "must be even for RoPE")
    if cfg.gqa_windows and (len(cfg.gqa_windows) != cfg.num_layers
                            or not all(isinstance(w, int) and w >= 0 for w in cfg.gqa_windows)):
        raise _bad(cfg, "gqa_windows", f"must list a non-negative window for each of the {cfg.num_layers} layers")


def validate_tp(cfg: ModelConfig, tp: int) -> None:
    """Raise one sentence when TP degree `tp` cannot shard this model's heads and widths."""
    if not isinstance(tp, int) or tp <= 0:
        raise UserError(f"--tp = {tp!r} must be a positive integer.")
    checks = [("mla_heads", cfg.mla_heads), ("moe_intermediate", cfg.moe_intermediate),
              ("shared intermediate (num_shared_experts x moe_intermediate)", cfg.shared_intermediate),
              ("hidden_size", cfg.hidden_size)]
    if cfg.has_kda:
        checks.append(("kda_heads", cfg.kda_heads))
    if "gqa" in cfg.attn_kinds:  # above P = Nkv vLLM replicates each key/value head on P / Nkv ranks
        checks.append(("gqa_heads", cfg.gqa_heads))
        nkv = cfg.gqa_kv_heads
        if nkv and nkv % tp and tp % nkv:
            raise UserError(f"--tp {tp} neither divides nor is a multiple of gqa_kv_heads = {nkv} of model "
                            f"'{cfg.name}': vLLM splits the key/value heads over the ranks or replicates each "
                            "on P / Nkv of them, and needs one or the other.")
    if cfg.first_k_dense:
        checks.append(("dense_intermediate", cfg.dense_intermediate))
    for name, value in checks:
        if value and value % tp:
            raise UserError(f"--tp {tp} does not divide {name} = {value} of model '{cfg.name}'.")


# ---------------------------------------------------------------------------------------
# parsing Hugging Face config.json
# ---------------------------------------------------------------------------------------

class _Reader:
    """Typed field access on a JSON object, with one-sentence errors naming the key."""

    def __init__(self, raw: dict[str, Any], source: str, nested: tuple[str, ...] = ()):
        self.raw, self.source, self.nested = raw, source, nested

    def _find(self, key: str) -> tuple[bool, Any]:
        if key in self.raw:
            return True, self.raw[key]
        for sub in self.nested:
            inner = self.raw.get(sub)
            if isinstance(inner, dict) and key in inner:
                return True, inner[key]
        return False, None

    def get(self, key: str, kind: type, default: Any = ...) -> Any:
        found, value = self._find(key)
        if not found or value is None:
            if default is ...:
                raise UserError(f"{self.source}: required field '{key}' is missing.")
            return default
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
        if not ok:
            raise UserError(f"{self.source}: field '{key}' = {value!r} should be of type {kind.__name__}.")
        if kind is float and not math.isfinite(value):  # json reads NaN / Infinity / -Infinity as floats
            raise UserError(f"{self.source}: field '{key}' = {value!r} must be a finite number.")
        return value

    def positive(self, key: str, default: float) -> float:
        """A finite float > 0 (an eps, a temperature, a scaling factor), named by its JSON key when not."""
        value = self.get(key, float, default)
        if value <= 0:
            raise UserError(f"{self.source}: field '{key}' = {value!r} must be positive.")
        return value


def _layer_kinds(r: _Reader, num_layers: int) -> tuple[str, ...]:
    """MLA layers come from `full_attn_layers` (1-based, as Kimi configs store them); the rest are KDA."""
    full = r.get("full_attn_layers", list, None)
    if full is None:
        return ("mla",) * num_layers
    for item in full:
        if not isinstance(item, int) or not 1 <= item <= num_layers:
            raise UserError(f"{r.source}: field 'full_attn_layers' holds {item!r}, "
                            f"not a 1-based layer number in 1..{num_layers}.")
    kinds = ["kda"] * num_layers
    for item in full:
        kinds[item - 1] = "mla"
    kda = r.get("kda_layers", list, None)
    if kda is not None and sorted(kda) != [i + 1 for i, k in enumerate(kinds) if k == "kda"]:
        raise UserError(f"{r.source}: fields 'kda_layers' and 'full_attn_layers' do not partition the "
                        f"{num_layers} layers.")
    return tuple(kinds)


def _stack(r: _Reader, name: str, family: str, eps: float, theta: float, attention_factor: bool) -> dict[str, Any]:
    """The fields every family shares: the stack's sizes, its norms' eps and RoPE (defaults: the family's)."""
    num_layers = r.get("num_hidden_layers", int)
    if not 0 < num_layers <= MAX_LAYERS:
        raise UserError(f"{r.source}: field 'num_hidden_layers' = {num_layers} must be an integer in [1, "
                        f"{MAX_LAYERS}].")
    if "rope_parameters" in r.raw:  # transformers 5 saves rope_theta / rope_scaling there
        raise UserError(f"{r.source}: field 'rope_parameters' (transformers 5's layout) is not read; give rope_theta "
                        "and rope_scaling as the model's published config.json does.")
    drafting = r.get("moe_sim_drafting", str, "autoregressive")
    if drafting not in ("block", "autoregressive"):
        raise UserError(f"{r.source}: field 'moe_sim_drafting' = {drafting!r} is not 'block' or 'autoregressive'.")
    return dict(
        name=name, family=family, source=r.source,
        drafting=drafting, target_taps=r.get("moe_sim_target_taps", int, 1),
        hidden_size=r.get("hidden_size", int), vocab_size=r.get("vocab_size", int),
        num_layers=num_layers, rms_norm_eps=r.positive("rms_norm_eps", eps),
        rope_theta=r.positive("rope_theta", theta), rope_scaling=_rope_scaling(r, attention_factor),
    )


def _common(r: _Reader, name: str, family: str) -> dict[str, Any]:
    """The MLA families' fields (kimi_linear, deepseek_v3)."""
    return _stack(r, name, family, 1e-6, 10000.0, attention_factor=False) | dict(
        first_k_dense=r.get("first_k_dense_replace", int, 0),
        dense_intermediate=r.get("intermediate_size", int, 0),
        hidden_act=r.get("hidden_act", str, "silu"),
        situ_beta=r.positive("activation_situ_beta", 4.0),
        situ_linear_beta=r.positive("activation_situ_linear_beta", 25.0),
        mla_heads=r.get("num_attention_heads", int), q_lora_rank=r.get("q_lora_rank", int),
        kv_lora_rank=r.get("kv_lora_rank", int), qk_nope_dim=r.get("qk_nope_head_dim", int),
        qk_rope_dim=r.get("qk_rope_head_dim", int), v_head_dim=r.get("v_head_dim", int),
        moe_intermediate=r.get("moe_intermediate_size", int, 0),
        routed_scaling_factor=r.positive("routed_scaling_factor", 1.0),
    )


YARN_KEYS = {"type", "rope_type", "factor", "original_max_position_embeddings", "beta_fast", "beta_slow",
             "mscale", "mscale_all_dim", "truncate"}


def _rope_scaling(r: _Reader, attention_factor: bool = False) -> RopeScaling | None:
    """`rope_scaling` as Hugging Face writes it; only YaRN is modelled, anything else is refused.

    A key that would change the math and is not modelled (another type, an unknown key, a rotary
    magnitude `mscale` different from `mscale_all_dim`) is an error, never silently dropped.
    `attention_factor`: the family's attention uses Hugging Face's generic YaRN (`_compute_yarn_parameters`),
    which, with neither `mscale` nor `mscale_all_dim`, multiplies cos and sin by 0.1 ln(factor) + 1, so every
    q.k logit by its square: moe-sim's `mscale_all_dim = 1` (gpt_oss, qwen3_moe, mixtral). Otherwise the
    DeepSeek reading: the attention folds `mscale_all_dim` into its softmax scale and `mscale` must equal it.
    """
    raw = r.get("rope_scaling", dict, None)
    if raw is None:
        return None
    kind = raw.get("type", raw.get("rope_type"))
    if kind != "yarn":
        raise UserError(f"{r.source}: field 'rope_scaling' has type {kind!r}; only 'yarn' is modelled.")
    unknown = sorted(set(raw) - YARN_KEYS)
    if unknown:
        raise UserError(f"{r.source}: field 'rope_scaling' has unknown key {unknown[0]!r} (known: "
                        f"{', '.join(sorted(YARN_KEYS))}).")
    y = _Reader(raw, f"{r.source} rope_scaling")
    if attention_factor and {"mscale", "mscale_all_dim"} & set(raw):
        raise UserError(f"{r.source}: field 'rope_scaling' sets mscale or mscale_all_dim; for model_type "
                        f"{r.raw.get('model_type')!r} only YaRN's default attention factor 0.1 ln(factor) + 1 is "
                        "modelled.")
    scaling = RopeScaling(factor=y.get("factor", float), original_max=y.get("original_max_position_embeddings", int),
                          beta_fast=y.get("beta_fast", float, 32.0), beta_slow=y.get("beta_slow", float, 1.0),
                          mscale_all_dim=1.0 if attention_factor else y.get("mscale_all_dim", float, 0.0),
                          truncate=y.get("truncate", bool, True))
    bad = [k for k, ok in (("factor", scaling.factor >= 1),
                           ("original_max_position_embeddings", scaling.original_max > 0),
                           ("beta_slow", 0 < scaling.beta_slow < scaling.beta_fast),
                           ("mscale_all_dim", scaling.mscale_all_dim >= 0)) if not ok]  # NaN fails every test
    if bad or not math.isfinite(scaling.factor * scaling.beta_fast * scaling.mscale_all_dim):
        raise UserError(f"{r.source}: field 'rope_scaling' = {raw!r} is out of range: YaRN needs finite factor >= 1, "
                        "original_max_position_embeddings > 0, 0 < beta_slow < beta_fast, mscale_all_dim >= 0.")
    mscale = y.get("mscale", float, scaling.mscale_all_dim if attention_factor else 1.0)  # HF: 1 and 0
    if mscale != scaling.mscale_all_dim:  # cos/sin would be scaled by get_mscale(mscale) / get_mscale(all_dim)
        raise UserError(f"{r.source}: field 'rope_scaling' has mscale {mscale:g} != mscale_all_dim "
                        f"{scaling.mscale_all_dim:g}; the rotary magnitude factor this implies is not modelled.")
    return scaling


def _parse_kimi_linear(raw: dict[str, Any], name: str, source: str) -> ModelConfig:
    r = _Reader(raw, source, nested=("linear_attn_config",))
    base = _common(r, name, "kimi_linear")
    grouped = r.get("use_grouped_topk", bool, False)
    return ModelConfig(
        **base,
        attn_kinds=_layer_kinds(r, base["num_layers"]),
        mla_nope=r.get("mla_use_nope", bool, True),
        mla_output_gate=r.get("mla_use_output_gate", bool, False),
        mla_lora_eps=r.positive("mla_lora_norm_eps", 1e-6),
        kda_heads=r.get("num_heads", int, 0), kda_head_dim=r.get("head_dim", int, 0),
        conv_size=r.get("short_conv_kernel_size", int, 4),
        gate_lower_bound=r.get("gate_lower_bound", float, -5.0),
        num_experts=r.get("num_experts", int), top_k=r.get("num_experts_per_token", int),
        num_shared_experts=r.get("num_shared_experts", int, 0),
        latent_dim=r.get("routed_expert_hidden_size", int, 0),
        latent_norm=r.get("latent_moe_use_norm", bool, False),
        router_act=r.get("moe_router_activation_func", str, "sigmoid"),
        n_group=r.get("num_expert_group", int, 1) if grouped else 1,
        topk_group=r.get("topk_group", int, 1) if grouped else 1,
        renormalize=r.get("moe_renormalize", bool, True),
        attn_res_block=r.get("attn_res_block_size", int, 0),
        residual="attn_res" if r.get("attn_res_block_size", int, 0) > 0 else "plain",
        expert_dtype=_expert_dtype(r),
    )


def _expert_dtype(r: _Reader) -> str:
    """`quantization_config` names the routed-expert format; absent means BF16 experts."""
    quant = r.get("quantization_config", dict, None)
    if quant is None:
        return "bf16"
    fmt = str(quant.get("format", quant.get("quant_method", ""))).lower()
    if "mxfp4" in fmt:
        return "mxfp4"
    if "fp8" in fmt:
        return "fp8"
    raise UserError(f"{r.source}: field 'quantization_config' names format {fmt!r}, not one of mxfp4, fp8.")


def _parse_deepseek_v3(raw: dict[str, Any], name: str, source: str) -> ModelConfig:
    r = _Reader(raw, source)
    base = _common(r, name, "deepseek_v3")
    return ModelConfig(
        **base,
        attn_kinds=("mla",) * base["num_layers"],
        mla_nope=False, mla_output_gate=False, mla_lora_eps=base["rms_norm_eps"],
        kda_heads=0, kda_head_dim=0, conv_size=0, gate_lower_bound=0.0,
        num_experts=r.get("n_routed_experts", int, 0), top_k=r.get("num_experts_per_tok", int, 0),
        num_shared_experts=r.get("n_shared_experts", int, 0), latent_dim=0, latent_norm=False,
        router_act=r.get("scoring_func", str, "sigmoid"),
        n_group=r.get("n_group", int, 1), topk_group=r.get("topk_group", int, 1),
        renormalize=r.get("norm_topk_prob", bool, True), attn_res_block=0,
        expert_dtype=_expert_dtype(r),
    )


# ---------------------------------------------------------------------------------------
# GQA families: attention, routing and FFN read from each family's Hugging Face keys; a key absent from the
# file takes the default of transformers' configuration_<family>.py (docs/models.md lists both)
# ---------------------------------------------------------------------------------------

NO_MLA_KDA = dict(mla_heads=0, q_lora_rank=0, kv_lora_rank=0, qk_nope_dim=0, qk_rope_dim=0, v_head_dim=0,
                  mla_nope=False, mla_output_gate=False, kda_heads=0, kda_head_dim=0, conv_size=0,
                  gate_lower_bound=0.0, situ_beta=4.0, situ_linear_beta=25.0, num_shared_experts=0, latent_dim=0,
                  latent_norm=False, router_act="softmax", n_group=1, topk_group=1, routed_scaling_factor=1.0,
                  attn_res_block=0, residual="plain", selection_bias=False)  # plain softmax top-k: no score bias


def _gqa(r: _Reader, base: dict[str, Any], head_dim: int | None) -> dict[str, Any]:
    """GQA heads of every layer; `head_dim` None: hidden_size / num_attention_heads (Hugging Face's rule)."""
    heads = r.get("num_attention_heads", int)
    if heads <= 0:
        raise UserError(f"{r.source}: field 'num_attention_heads' = {heads} must be a positive integer.")
    if head_dim is None and base["hidden_size"] % heads:
        raise UserError(f"{r.source}: field 'head_dim' is missing and num_attention_heads = {heads} does not divide "
                        f"hidden_size = {base['hidden_size']}.")
    return dict(attn_kinds=("gqa",) * base["num_layers"], gqa_heads=heads,
                gqa_kv_heads=r.get("num_key_value_heads", int, heads),
                gqa_head_dim=r.get("head_dim", int, head_dim or base["hidden_size"] // heads),
                mla_lora_eps=base["rms_norm_eps"])  # unused without MLA; must still be a valid eps


def _parse_gpt_oss(raw: dict[str, Any], name: str, source: str) -> ModelConfig:
    """gpt-oss (OpenAI, 2025): GQA with learned sinks on alternating banded / full layers, YaRN unrounded,
    top-k router logits (with bias) softmaxed over the k, clamped-SwiGLU experts with biases, MXFP4 experts.
    The experts' activation is fixed in its code (`GptOssExperts`), so `hidden_act` must be the published 'silu'."""
    r = _Reader(raw, source)
    base = _stack(r, name, "gpt_oss", 1e-5, 150000.0, attention_factor=True)
    if "rope_scaling" not in raw:  # GptOssConfig's default rope_parameters
        base["rope_scaling"] = RopeScaling(factor=32.0, original_max=4096, mscale_all_dim=1.0, truncate=False)
    top_k = r.get("num_experts_per_tok", int, 4)
    if r.get("experts_per_token", int, top_k) != top_k:  # the key of OpenAI's own checkpoint format
        raise UserError(f"{source}: field 'experts_per_token' = {raw['experts_per_token']!r} differs from "
                        f"num_experts_per_tok = {top_k}.")
    if r.get("hidden_act", str, "silu") != "silu":
        raise UserError(f"{source}: field 'hidden_act' = {raw['hidden_act']!r} is not 'silu'; gpt-oss's experts "
                        "compute clamped SwiGLU whatever it says, and only the published value is accepted.")
    bias = r.get("attention_bias", bool, True)
    return ModelConfig(
        **base, **NO_MLA_KDA, **_gqa(r, base, 64), gqa_qkv_bias=bias,
        gqa_sinks=True, gqa_windows=_layer_windows(r, base["num_layers"], 128), gqa_qk_norm=False,
        o_proj_bias=bias, first_k_dense=0, dense_intermediate=0,
        hidden_act="swiglu_oai", swiglu_limit=r.positive("swiglu_limit", 7.0),
        swiglu_alpha=r.positive("swiglu_alpha", 1.702),
        num_experts=r.get("num_local_experts", int), top_k=top_k, moe_intermediate=r.get("intermediate_size", int),
        renormalize=True, router_logit_bias=True, expert_bias=True, expert_dtype=_expert_dtype(r),
    )


def _parse_qwen3_moe(raw: dict[str, Any], name: str, source: str) -> ModelConfig:
    """Qwen3-MoE (Qwen, 2025): GQA with per-head RMSNorm of q and k before RoPE, softmax top-k routing
    renormalised when `norm_topk_prob`, SiLU-GLU experts. Dense layers are modelled as a prefix only
    (`mlp_only_layers` = [0, k), `decoder_sparse_step` 1); sliding windows (`use_sliding_window`) are refused."""
    r = _Reader(raw, source)
    base = _stack(r, name, "qwen3_moe", 1e-6, 10000.0, attention_factor=True)
    if r.get("use_sliding_window", bool, False):
        raise UserError(f"{source}: field 'use_sliding_window' = true is not modelled (Qwen3-MoE's published "
                        "configs set it false).")
    step = r.get("decoder_sparse_step", int, 1)
    if step != 1:
        raise UserError(f"{source}: field 'decoder_sparse_step' = {step!r} would interleave dense and MoE layers; "
                        "only 1 (every layer MoE, but for a prefix in mlp_only_layers) is modelled.")
    dense = r.get("mlp_only_layers", list, [])
    if not all(type(i) is int for i in dense) or sorted(dense) != list(range(len(dense))):
        raise UserError(f"{source}: field 'mlp_only_layers' = {dense!r} is not a prefix [0, 1, ..., k-1] of the "
                        "layers, the only dense layers moe-sim models.")
    bias = r.get("attention_bias", bool, False)
    return ModelConfig(
        **base, **NO_MLA_KDA, **_gqa(r, base, None), gqa_qkv_bias=bias, o_proj_bias=bias, gqa_qk_norm=True,
        gqa_sinks=False,
        first_k_dense=len(dense), dense_intermediate=r.get("intermediate_size", int) if dense else 0,
        hidden_act=_silu(r), num_experts=r.get("num_experts", int), top_k=r.get("num_experts_per_tok", int),
        moe_intermediate=r.get("moe_intermediate_size", int), renormalize=r.get("norm_topk_prob", bool, False),
        expert_dtype=_expert_dtype(r),
    )


def _parse_mixtral(raw: dict[str, Any], name: str, source: str) -> ModelConfig:
    """Mixtral (Mistral AI, 2023): GQA without biases, an optional sliding window on every layer, softmax top-k
    routing always renormalised over the k, SiLU-GLU experts of width `intermediate_size`."""
    r = _Reader(raw, source)
    base = _stack(r, name, "mixtral", 1e-5, 1000000.0, attention_factor=True)
    window = r.get("sliding_window", int, None)  # null (Mixtral-8x7B-v0.1): full attention
    if window is not None and window <= 0:
        raise UserError(f"{source}: field 'sliding_window' = {window} must be a positive integer or null.")
    return ModelConfig(
        **base, **NO_MLA_KDA, **_gqa(r, base, None), gqa_qkv_bias=False, gqa_qk_norm=False, gqa_sinks=False,
        gqa_windows=(window,) * base["num_layers"] if window else (), first_k_dense=0,
        dense_intermediate=0, hidden_act=_silu(r),
        num_experts=r.get("num_local_experts", int), top_k=r.get("num_experts_per_tok", int),
        moe_intermediate=r.get("intermediate_size", int), renormalize=True, expert_dtype=_expert_dtype(r),
    )


def _silu(r: _Reader) -> str:
    act = r.get("hidden_act", str, "silu")
    if act != "silu":
        raise UserError(f"{r.source}: field 'hidden_act' = {act!r} is not modelled for this model type (only 'silu').")
    return act


LAYER_TYPES = {"sliding_attention", "full_attention"}


def _layer_windows(r: _Reader, num_layers: int, default_window: int | None) -> tuple[int, ...]:
    """`layer_types` (default: sliding first, alternating) -> each layer's `sliding_window` or 0 (full)."""
    types = r.get("layer_types", list, ["sliding_attention" if i % 2 == 0 else "full_attention"
                                        for i in range(num_layers)])
    if len(types) != num_layers or not all(isinstance(t, str) and t in LAYER_TYPES for t in types):
        raise UserError(f"{r.source}: field 'layer_types' must list 'sliding_attention' or 'full_attention' for each "
                        f"of the {num_layers} layers.")
    if "sliding_attention" not in types:
        return (0,) * num_layers
    window = None if r.raw.get("sliding_window", 0) is None else r.get("sliding_window", int, default_window)
    if window is None or window <= 0:
        raise UserError(f"{r.source}: field 'sliding_window' = {window!r} must be a positive integer when layer_types "
                        "has sliding layers.")
    return tuple(window if t == "sliding_attention" else 0 for t in types)


def parse_config(raw: Any, name: str, source: str) -> ModelConfig:
    """Dispatch on `model_type`; `kimi_k3` unwraps `text_config`."""
    if not isinstance(raw, dict):
        raise UserError(f"{source}: the top level must be a JSON object, not {type(raw).__name__}.")
    model_type = raw.get("model_type")
    if model_type == "kimi_k3":
        text = raw.get("text_config")
        if not isinstance(text, dict):
            raise UserError(f"{source}: field 'text_config' is missing or not an object (kimi_k3 nests the text model "
                            f"there).")
        return _parse_kimi_linear(text, name, source)
    parsers = {"kimi_linear": _parse_kimi_linear, "deepseek_v3": _parse_deepseek_v3, "gpt_oss": _parse_gpt_oss,
               "qwen3_moe": _parse_qwen3_moe, "mixtral": _parse_mixtral}
    if not isinstance(model_type, str) or model_type not in parsers:
        raise UserError(f"{source}: field 'model_type' = {model_type!r} is not one of kimi_k3, "
                        f"{', '.join(parsers)}.")
    return parsers[model_type](raw, name, source)


def list_models() -> list[str]:
    return sorted(p.stem for p in MODELS_DIR.glob("*.json"))


def load_model(name_or_path: str) -> ModelConfig:
    """Load a model by registry name (a file in models/) or by path to a config.json."""
    path = Path(name_or_path)
    if not path.is_file():
        candidate = MODELS_DIR / f"{name_or_path.lower()}.json"  # names are case-insensitive: Kimi-K3
        if not candidate.is_file():
            raise UserError(f"unknown model '{name_or_path}': not a file and not one of "
                            f"{', '.join(list_models())}.")
        path = candidate
    try:
        raw = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: not valid JSON ({exc}).") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot be read ({exc.strerror}).") from None
    return parse_config(raw, path.stem, str(path))
