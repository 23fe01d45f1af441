"""Chrome trace export: the keys Perfetto needs, one track per stream, nested prefetch slices, atomic write."""

from __future__ import annotations

import json
from pathlib import Path

from simulator.cost.timeline import Timeline, schedule
from simulator.hardware import load_hardware
from simulator.plans.kernel import Collective, DecodeShape, Kernel, Plan, Tensor
from simulator.report.trace import chrome_trace, write_trace


def _kernel(key: str, stream: str = "main", **extra) -> Kernel:
    return Kernel(key, f"name_{key}", "gemm", family="gemm", reads=(Tensor("x", (1, 7168), "bf16"),),
                  writes=(Tensor("y", (1, 1024), "bf16"),), weights=(Tensor("w", (7168, 1024), "bf16"),),
                  flops=2 * 7168 * 1024, stream=stream, **extra)


def _timeline(variant: str = "standard") -> Timeline:
    kernels = (
        _kernel("a"),
        Kernel("ar", "all_reduce", "collective", family="collective", collective=Collective("all_reduce", 7168 * 2, 8)),
        _kernel("b", pdl=True, prefetch_bytes=10**7),
        _kernel("s", stream="shared", deps=("a",)),
        _kernel("c", deps=("s",)),
    )
    plan = Plan(variant, "kda", 8, DecodeShape(), kernels)
    return schedule(plan, load_hardware("h200", "datasheet"))


def _slices(trace: dict) -> list[dict]:
    return [e for e in trace["traceEvents"] if e["ph"] == "X"]


def test_trace_has_the_required_keys_and_round_trips_through_json() -> None:
    trace = json.loads(json.dumps(chrome_trace(_timeline())))
    assert isinstance(trace["traceEvents"], list)
    for event in _slices(trace):
        assert {"name", "ph", "ts", "dur", "pid", "tid", "cat", "args"} <= set(event)
        assert event["dur"] >= 0 and isinstance(event["tid"], int)
    kernels = [e for e in _slices(trace) if e["cat"] != "prefetch"]
    assert [e["name"] for e in kernels] == ["name_a", "all_reduce", "name_b", "name_s", "name_c"]
    assert {"bytes", "flops", "bound", "GB/s", "fraction_of_peak"} <= set(kernels[0]["args"])


def test_one_named_track_per_stream() -> None:
    timeline = _timeline()
    trace = chrome_trace(timeline)
    names = {e["tid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert sorted(names.values()) == sorted(timeline.streams) == ["main", "shared"]
    for event in _slices(trace):
        assert event["tid"] in names
    by_stream = {s.key: s.stream for s in timeline.spans}
    for event in _slices(trace):
        if event["cat"] != "prefetch":
            assert names[event["tid"]] == by_stream[event["args"]["key"]]


def test_prefetch_slice_nests_inside_its_predecessor() -> None:
    trace = chrome_trace(_timeline())
    slices = _slices(trace)
    prefetch = next(e for e in slices if e["cat"] == "prefetch")
    ar = next(e for e in slices if e["name"] == "all_reduce")
    assert prefetch["tid"] == ar["tid"]
    assert ar["ts"] <= prefetch["ts"] and prefetch["ts"] + prefetch["dur"] <= ar["ts"] + ar["dur"] + 1e-9


def test_several_timelines_become_separate_processes() -> None:
    trace = chrome_trace([_timeline("standard"), _timeline("specialized")])
    processes = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert len(processes) == 2 and "specialized" in processes[2]
    assert {e["pid"] for e in _slices(trace)} == {1, 2}


def test_write_trace_is_atomic_and_overwrites(tmp_path: Path) -> None:
    target = tmp_path / "out" / "layer.json"
    write_trace(target, _timeline())
    write_trace(target, [_timeline(), _timeline("specialized")])
    assert len({e["pid"] for e in _slices(json.loads(target.read_text()))}) == 2
    assert [p.name for p in target.parent.iterdir()] == ["layer.json"]  # no temp file left behind
