"""The record of one attention kind in the registry (simulator/attention/__init__.py): what each field holds."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from simulator.config import ModelConfig
from simulator.state import DecodeShape, LayerState


@dataclass(frozen=True)
class AttentionKind:
    """One attention kind's kernels, reference, state and memory."""

    name: str
    label: str
    # the kernels of each plan, from the normed input `x` to `attn.core` [M, n]: standard(d, c1, arch) (arch "sm100",
    # "sm90", "gfx942" or "gfx950": plans/standard.arch_of), specialized(d, on, go) (the fusions on, the launches)
    standard: Callable[..., list]
    specialized: Callable[..., list]
    # the float64 textbook form: (cfg, layer, shape, W, x, state) -> (attention output, state)
    reference: Callable[..., tuple[Any, LayerState]]
    initial_state: Callable[..., LayerState]  # a seeded state standing for `context` processed tokens
    shard: Callable[[LayerState, int], list[dict]]  # per-rank views of that state under TP
    unshard: Callable[[list[dict], LayerState, int], LayerState]  # ... and their reassembly
    # (name, plan's tensor, reference tensor, tolerance: "", "fp8" or "exact") the check compares
    state_errors: Callable[[LayerState, LayerState, DecodeShape], list[tuple[str, Any, Any, str]]]
    state_elements: Callable[[ModelConfig, int, DecodeShape], int]  # float64 elements one check holds (memory guard)
    # (key, label, bytes per GPU): the cache or state of all the kind's layers, as the capacity check counts it
    memory: tuple[str, str, Callable[[ModelConfig, int, DecodeShape], int]]
    reads_context: bool  # the kernels read the context (a KV cache), not a fixed state
    reshaped_weights: tuple[str, ...] = ()  # weights the reference copies to reshape (the check's memory guard)
    # implementation (as a GPU's kernel set names it) -> {kernel key: that implementation's kernel name}: a plan's
    # names are the published Blackwell path's; an answer priced with a measured set shows its own (`kernel_name`)
    impl_names: dict[str, dict[str, str]] = field(default_factory=dict)
