"""The timeline: launch gaps, PDL, cross-stream dependencies, shared HBM bandwidth, prefetch under a
collective, and a speed-of-light floor that never exceeds the estimate (checked on random plans)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.cost.collectives import min_alpha_us
from simulator.cost.pricing import price_kernel
from simulator.cost.timeline import Timeline, floor_us, schedule
from simulator.hardware import list_hardware, load_hardware
from simulator.plans.kernel import Collective, DecodeShape, Kernel, Plan, Tensor

# the family a test kernel of each kind declares (an attention kernel here is an MLA decode)
FAMILY_OF_KIND = {"gemm": "gemm", "gemm_collective": "gemm", "moe": "moe", "pointwise": "small", "router": "small",
                  "attention": "mla", "collective": "collective"}

KINDS = ("gemm", "moe", "attention", "pointwise", "router", "collective", "gemm_collective")
ONE_TOKEN = 7168 * 2


ALL = 1 << 40  # prefetch every weight byte (the plans' ALL_WEIGHTS)


def stream_kernel(key: str, mbytes: float, kind: str = "gemm", **extra) -> Kernel:
    """A memory-bound kernel loading `mbytes` MB of bf16 weights (plus a tiny activation)."""
    n = max(1, int(mbytes * 1e6 / 2 / 7168))
    return Kernel(key, key, kind, family=FAMILY_OF_KIND[kind], reads=(Tensor("x", (1, 7168), "bf16"),),
                  writes=(Tensor("y", (1, n), "bf16"),),
                  weights=(Tensor("w", (7168, n), "bf16"),), flops=2 * 7168 * n, **extra)


def all_reduce(key: str, nbytes: int = ONE_TOKEN, ranks: int = 8, **extra) -> Kernel:
    return Kernel(key, "all_reduce", "collective", family="collective",
                  collective=Collective("all_reduce", nbytes, ranks), **extra)


def plan(*kernels: Kernel, tp: int = 8) -> Plan:
    return Plan("test", "kda", tp, DecodeShape(), tuple(kernels))


def run(*kernels: Kernel, hw: str = "h200") -> Timeline:
    return schedule(plan(*kernels), load_hardware(hw, "datasheet"))


def test_a_single_kernel_pays_one_gap_then_its_duration() -> None:
    hw = load_hardware("h200", "datasheet")
    kernel = stream_kernel("a", 30)
    span = run(kernel).span("a")
    assert span.start_us == pytest.approx(hw.launch_gap_us)
    assert span.duration_us == pytest.approx(price_kernel(kernel, hw).duration_us)


@pytest.mark.parametrize("name", list_hardware())
def test_a_serial_chain_is_the_sum_of_gaps_and_durations(name: str) -> None:
    hw = load_hardware(name, "datasheet")
    kernels = (stream_kernel("a", 30), all_reduce("b"), stream_kernel("c", 5, kind="pointwise"))
    timeline = run(*kernels, hw=name)
    assert timeline.layer_us == pytest.approx(sum(price_kernel(k, hw).total_us for k in kernels))
    assert timeline.kernel_count == 3 and timeline.streams == ("main",)
    spans = timeline.spans
    assert all(later.start_us >= earlier.end_us for earlier, later in zip(spans, spans[1:]))


def test_pdl_hides_a_boundary_as_far_as_the_kernel_has_independent_work() -> None:
    """H200 (calibration/h200/pdl): a kernel that waits on its predecessor first hides only
    pdl_dependent_hidden_us of the gap; one that loads its weights first hides all of it."""
    hw = load_hardware("h200", "datasheet")
    plain = run(stream_kernel("a", 10), stream_kernel("b", 10))
    waits = run(stream_kernel("a", 10, pdl=True), stream_kernel("b", 10, pdl=True))
    loads = run(stream_kernel("a", 10, pdl=True, prefetch_bytes=ALL),
                stream_kernel("b", 10, pdl=True, prefetch_bytes=ALL))
    assert waits.layer_us == pytest.approx(plain.layer_us - 2 * hw.pdl_dependent_hidden_us)
    assert loads.span("b").launch_us == pytest.approx(hw.launch_gap_pdl_us)
    assert loads.layer_us < waits.layer_us - (hw.launch_gap_us - hw.pdl_dependent_hidden_us)
    tiny = run(stream_kernel("a", 10), stream_kernel("b", 0.01, pdl=True, prefetch_bytes=ALL))
    assert tiny.span("b").launch_us == pytest.approx(hw.launch_gap_us - hw.pdl_dependent_hidden_us, abs=0.01)


def test_prefetch_under_a_collective_shortens_the_layer() -> None:
    base = (stream_kernel("a", 20), all_reduce("ar"))
    plain = run(*base, stream_kernel("c", 20, pdl=True))
    early = run(*base, stream_kernel("c", 20, pdl=True, prefetch_bytes=20_000_000))
    c = early.span("c")
    assert early.layer_us < plain.layer_us - 2.0  # ~4 us of the 20 MB load hid under the ~6 us all-reduce
    assert c.prefetched_bytes > 15e6 and c.prefetch_start_us >= early.span("ar").start_us
    assert c.prefetch_end_us <= early.span("ar").end_us + 1e-9


def test_prefetch_behind_a_memory_bound_kernel_buys_only_its_idle_latency() -> None:
    """Behind a streaming predecessor, HBM is busy except during its fixed latency; under a collective
    it is idle throughout, so the same prefetch hides more."""
    hw = load_hardware("h200", "datasheet")
    a, c = stream_kernel("a", 20), stream_kernel("c", 20)
    c_early = stream_kernel("c", 20, prefetch_bytes=20_000_000)
    saved_mem = run(a, c).layer_us - run(a, c_early).layer_us
    saved_comm = run(all_reduce("ar"), c).layer_us - run(all_reduce("ar"), c_early).layer_us
    assert 0 < saved_mem <= price_kernel(a, hw).fixed_us + 1e-9
    assert saved_comm > 1.5 * saved_mem


@pytest.mark.parametrize("name", list_hardware())
def test_two_memory_bound_kernels_on_two_streams_share_bandwidth(name: str) -> None:
    a, b = stream_kernel("a", 40), stream_kernel("b", 40, stream="aux")
    alone_a, alone_b = run(a, hw=name).layer_us, run(b, hw=name).layer_us
    together = run(a, b, hw=name).layer_us
    assert max(alone_a, alone_b) < together < alone_a + alone_b


def test_a_collective_on_another_stream_does_not_slow_memory_work() -> None:
    alone = run(stream_kernel("a", 40)).span("a")
    both = run(stream_kernel("a", 40), all_reduce("ar", stream="aux")).span("a")
    assert both.duration_us == pytest.approx(alone.duration_us)


def test_a_cross_stream_dependency_waits_for_its_kernel_plus_a_gap() -> None:
    hw = load_hardware("h200", "datasheet")
    timeline = run(stream_kernel("a", 10), stream_kernel("s", 5, stream="aux", deps=("a",)))
    assert timeline.span("s").start_us == pytest.approx(timeline.span("a").end_us + hw.launch_gap_us)


def test_unknown_or_forward_dependency_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown/later"):
        run(stream_kernel("a", 1, deps=("b",)), stream_kernel("b", 1, stream="aux"))


def test_floor_of_a_serial_plan_is_the_textbook_bound() -> None:
    """B / BW + n alpha_min (sources.md §7.5) when nothing overlaps."""
    hw = load_hardware("gb300")
    kernels = (stream_kernel("a", 30), all_reduce("ar", ranks=16), stream_kernel("c", 50, kind="moe"))
    weights = sum(k.weight_bytes for k in kernels)
    expected = weights / hw.hbm_bandwidth * 1e6 + min_alpha_us("all_reduce", 16, hw)
    assert floor_us(plan(*kernels, tp=16), hw) == pytest.approx(expected)


def test_floor_credits_prefetch_that_hides_under_a_collective() -> None:
    """60 MB loaded during a ~11 us all-reduce: the layer beats the textbook B/BW + alpha, so the floor
    must subtract what the declared prefetch can hide."""
    hw = load_hardware("gb300")
    kernels = (all_reduce("ar", ranks=16), stream_kernel("c", 60, pdl=True, prefetch_bytes=60_000_000))
    timeline = schedule(plan(*kernels, tp=16), hw)
    # the all-reduce here is a standalone kernel: its own alpha, not the in-kernel minimum
    textbook = kernels[1].weight_bytes / hw.hbm_bandwidth * 1e6 + hw.alpha_one_shot_us
    assert timeline.floor_us <= timeline.layer_us < textbook


@st.composite
def random_plans(draw: st.DrawFn) -> tuple[Plan, str]:
    """Up to 12 kernels of any kind on up to 3 streams, with deps, PDL, prefetch and collectives."""
    kernels: list[Kernel] = []
    for i in range(draw(st.integers(1, 12))):
        kind = draw(st.sampled_from(KINDS))
        stream = draw(st.sampled_from(("main", "main", "aux", "shared")))
        others = [k.key for k in kernels if k.stream != stream]
        deps = tuple(draw(st.lists(st.sampled_from(others), unique=True, max_size=2))) if others else ()
        m, n = draw(st.integers(1, 64)), draw(st.integers(0, 8192))
        weights = (Tensor("w", (7168, n), draw(st.sampled_from(("bf16", "mxfp4", "fp8")))),) if n else ()
        collective = None
        if kind in ("collective", "gemm_collective"):
            op = draw(st.sampled_from(("all_reduce", "reduce_scatter", "all_gather")))
            collective = Collective(op, draw(st.integers(0, 4 * 2**20)), draw(st.sampled_from((1, 2, 4, 8))))
        kernels.append(Kernel(
            f"k{i}", f"k{i}", kind, family=FAMILY_OF_KIND[kind], reads=(Tensor("x", (m, 7168), "bf16"),),
            writes=(Tensor("y", (m, n), "bf16"),),
            weights=weights, flops=2 * m * 7168 * n * draw(st.sampled_from((1, 1, 100))),
            math=draw(st.sampled_from(("bf16", "fp8", "fp4", "fp32"))), stream=stream, deps=deps,
            collective=collective, pdl=draw(st.booleans()),
            prefetch_bytes=draw(st.sampled_from((0, 0, 10**6, 10**8))),
        ))
    return plan(*kernels), draw(st.sampled_from(list_hardware()))


@settings(max_examples=300, deadline=None)
@given(random_plans())
def test_floor_never_exceeds_the_estimate(case: tuple[Plan, str]) -> None:
    the_plan, name = case
    timeline = schedule(the_plan, load_hardware(name))
    assert 0 < timeline.floor_us <= timeline.layer_us * (1 + 1e-9) or timeline.floor_us == 0
    assert timeline.kernel_count == len(the_plan)
    for stream in timeline.streams:  # a stream runs one kernel at a time
        spans = [s for s in timeline.spans if s.stream == stream]
        assert all(b.start_us >= a.end_us - 1e-9 for a, b in zip(spans, spans[1:]))
    for span in timeline.spans:  # sharing can only slow a kernel down; prefetch can shorten it
        hidden_us = span.prefetched_bytes / span.cost.stream_bandwidth * 1e6
        assert span.duration_us >= span.cost.duration_us - hidden_us - 1e-6


@settings(max_examples=150, deadline=None)
@given(random_plans())
def test_jitted_event_loop_matches_its_python_original(case: tuple[Plan, str]) -> None:
    """STYLE item 14: the Numba-compiled loop and its `.py_func` (pure Python) give the same schedule."""
    import numpy as np

    from simulator.cost import events
    from simulator.cost.fastsim import run, simulate
    from simulator.cost.layout import plan_arrays
    from simulator.cost.timeline import makespan_us
    plan_, hw_name = case
    hw = load_hardware(hw_name, "datasheet")
    arrays = plan_arrays(plan_, hw)
    assert run.py_func is events.run  # the plain loop that `schedule` runs is what Numba compiles
    for fast, slow in zip(simulate(*arrays), events.simulate(*arrays)):
        np.testing.assert_allclose(fast, slow, rtol=1e-12, atol=1e-9)
    assert makespan_us(plan_, hw) == pytest.approx(schedule(plan_, hw).layer_us)


def test_remembered_kernel_terms_equal_terms_priced_afresh(k3, monkeypatch):
    """The central pricing remembers each kernel's terms per profile (`layout._priced`): a plan whose
    kernels another plan priced first (an MLA layer at another context shares all but two) must get the
    makespan a cold pricing gives, and a profile with one constant changed must not get the old terms."""
    import dataclasses

    from simulator.cost import layout
    from simulator.cost.timeline import makespan_us
    from simulator.plans import standard
    hw = load_hardware("gb300")
    monkeypatch.setattr(layout, "_TERMS", {})
    makespan_us(standard.build(k3, 16, DecodeShape(8, 2, 1024), "mla"), hw)
    plan = standard.build(k3, 16, DecodeShape(8, 2, 8192), "mla")
    warm = makespan_us(plan, hw)
    assert len(layout._TERMS[hw]) > len(plan)  # the first plan's kernels were remembered
    layout._TERMS.clear()
    assert warm == makespan_us(plan, hw)
    slower = dataclasses.replace(hw, launch_gap_us=hw.launch_gap_us + 1.0)
    assert makespan_us(plan, slower) > warm
