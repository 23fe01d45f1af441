"""Attention kinds as a registry: one entry per kind, one module per entry (kda.py, mla.py, gqa.py).

An entry (`AttentionKind`, kind.py: what each field is) holds what the plans, the reference, the executor, the
check and the memory model need to know about one kind of attention layer, so they look the kind up instead of
branching on it: its kernels in each plan, its float64 reference, its state (seeded, sharded under TP, compared
by the check) and the cache or state memory of its layers.

Below the plans, the facts a config alone decides stay with the config: the kind names
(`config.ATTENTION_KINDS`), their TP constraints (`config.validate_tp`) and their weight specification
(`config.ATTENTION_WEIGHTS`, whose `<kind>.w_o` rows are the attention output width o_proj reads).
Adding a kind: its module here and its name in KINDS below; in config.py its name, fields and weights.
"""

from __future__ import annotations

from simulator.attention import gqa, kda, mla
from simulator.attention.kind import AttentionKind
from simulator.config import ModelConfig
from simulator.state import DecodeShape, LayerState


KINDS: dict[str, AttentionKind] = {m.KIND.name: m.KIND for m in (kda, mla, gqa)}  # in listing order


def kind(name: str) -> AttentionKind:
    """The entry of attention kind `name`."""
    if name not in KINDS:
        raise KeyError(f"unknown attention kind {name!r} (known: {', '.join(KINDS)})")
    return KINDS[name]


def entries() -> list[AttentionKind]:
    return list(KINDS.values())


def kernel_name(kernel, impls: tuple[str, ...]) -> str:
    """The name `kernel` has under the first of `impls`, the implementations a GPU's kernel set measured for its
    role (hardware/kernel_sets.py), when its attention entry knows it; else the plan's name."""
    entry = KINDS.get(kernel.family)
    names = entry.impl_names.get(impls[0], {}) if entry is not None and impls else {}
    return names.get(kernel.key, kernel.name)


def initial_state(cfg: ModelConfig, attn_kind: str, shape: DecodeShape, rng) -> LayerState:
    """The seeded state of a layer of attention kind `attn_kind`, in its storage format: random but O(1),
    standing for `context` processed tokens, so every variant and the reference start from the same history."""
    return kind(attn_kind).initial_state(cfg, shape, rng)


def shard_state(state: LayerState, tp: int) -> list[dict]:
    """Per-rank views of the state (copies, so ranks never alias one another), as each kind shards its own."""
    out: list[dict] = [{} for _ in range(tp)]
    for entry in KINDS.values():
        for mine, part in zip(out, entry.shard(state, tp)):
            mine.update(part)
    return out


def unshard_state(rank_bufs: list[dict], like: LayerState, advance: int) -> LayerState:
    """Reassemble the full state from the ranks' buffers; a cache now holds `advance` more tokens."""
    new: LayerState = {}
    for entry in KINDS.values():
        new |= entry.unshard(rank_bufs, like, advance)
    return new
