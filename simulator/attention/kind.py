"""The record of one attention kind in the registry (simulator/attention/__init__.py says what each field is)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from simulator.config import ModelConfig
from simulator.state import DecodeShape, LayerState


@dataclass(frozen=True)
class AttentionKind:
    """One attention kind's kernels, reference, state and memory (fields: simulator/attention/__init__.py)."""

    name: str
    label: str
    standard: Callable[..., list]
    specialized: Callable[..., list]
    reference: Callable[..., tuple[Any, LayerState]]
    initial_state: Callable[..., LayerState]
    shard: Callable[[LayerState, int], list[dict]]
    unshard: Callable[[list[dict], LayerState, int], LayerState]
    state_errors: Callable[[LayerState, LayerState, DecodeShape], list[tuple[str, Any, Any, str]]]
    state_elements: Callable[[ModelConfig, int, DecodeShape], int]
    memory: tuple[str, str, Callable[[ModelConfig, int, DecodeShape], int]]
    reads_context: bool
    reshaped_weights: tuple[str, ...] = ()
    impl_names: dict[str, dict[str, str]] = field(default_factory=dict)  # implementation -> {kernel key: name}
