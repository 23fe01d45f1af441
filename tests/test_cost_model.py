"""The cost model on the real plans: textbook takeaways, the published calibration, the step, the CLI."""

import json
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from simulator.cli import app
from simulator.config import load_model
from simulator.cost.step import build_plan, estimate_step, layer_timeline, plan_shape, representative_layer
from simulator.routing import RoutingStats
from simulator.cost.timeline import schedule
from simulator.hardware import list_hardware, load_hardware
from simulator.plans.kernel import DecodeShape

TRACE = DecodeShape(1, 8, 512)
runner = CliRunner()


@pytest.fixture(scope="module")
def gb300():
    return load_hardware("gb300")


@pytest.mark.parametrize("hw_name", list_hardware())
def test_decode_gemms_memory_bound_at_small_batch(k3, hw_name):
    hw = load_hardware(hw_name)
    tp = min(8, hw.nvlink_domain)
    for batch in (1, 8):
        tl = layer_timeline(k3, hw, "standard", tp, DecodeShape(batch, 1, 512), "kda")
        big = tl.span("kda_in_proj")  # 92 MB of weights per rank at TP8
        assert big.bound == "memory", (hw_name, batch)
        assert big.cost.intensity < hw.critical_intensity


def test_small_all_reduce_latency_bound(k3, gb300):
    tl = layer_timeline(k3, gb300, "standard", 16, DecodeShape(1, 1, 512), "kda")
    ar = tl.span("attn_all_reduce")  # 14 KiB payload
    assert ar.bound == "latency" and ar.cost.comm_alpha_us > 0.8 * ar.cost.comm_us


@pytest.mark.parametrize("variant", ["standard", "specialized"])
def test_step_time_monotone_in_batch(k3, gb300, variant):
    times = [estimate_step(k3, gb300, variant, 16, b, 512).step_us for b in (1, 2, 4, 8, 16, 32, 64)]
    assert times == sorted(times) and times[0] < times[-1]


@pytest.mark.parametrize("layer", ["kda", "mla", "dense"])
@pytest.mark.parametrize("hw_name", ["gb300", "h200"])
@pytest.mark.parametrize("batch, tokens", [(1, 1), (1, 8), (32, 1), (64, 1)])
def test_floor_never_above_estimate_and_fused_never_more_bytes(k3, hw_name, layer, batch, tokens):
    hw = load_hardware(hw_name)
    shape = DecodeShape(batch, tokens, 512)
    std, spec = (schedule(build_plan(k3, v, 8, shape, layer), hw) for v in ("standard", "specialized"))
    for tl in (std, spec):
        assert 0 < tl.floor_us <= tl.layer_us
    assert spec.hbm_bytes <= std.hbm_bytes


def test_single_token_layer_cannot_be_the_trace(k3, gb300):
    """published.md: 93 x 69 us exceeds the 3.90 ms step, so the trace had more than one token per forward."""
    one = layer_timeline(k3, gb300, "specialized", 16, DecodeShape(1, 1, 512), "kda").layer_us
    assert 93 * one < 3900 < 93 * 69


def test_speculative_decoding(k3, gb300):
    base = estimate_step(k3, gb300, "specialized", 16, 1, 512)
    spec = estimate_step(k3, gb300, "specialized", 16, 1, 512, draft_tokens=7, acceptance_length=6)
    assert spec.step_us > base.step_us and spec.breakdown_us["draft"] > 0
    assert spec.tokens_per_s_per_user == pytest.approx(6 / (spec.step_us * 1e-6))
    assert spec.tokens_per_s > base.tokens_per_s  # 6 tokens per step for < 6x the time
    worse = estimate_step(k3, gb300, "specialized", 16, 1, 512, draft_tokens=7, acceptance_length=2)
    assert worse.step_us == pytest.approx(spec.step_us) and worse.tokens_per_s < spec.tokens_per_s


def test_each_fusion_helps_or_is_neutral(k3, gb300):
    from simulator.plans.specialized import FUSIONS, resolve_fusions
    full = layer_timeline(k3, gb300, "specialized", 16, TRACE, "kda").layer_us
    for name in FUSIONS:
        without = layer_timeline(k3, gb300, "specialized", 16, TRACE, "kda", resolve_fusions(None, [name])).layer_us
        assert without >= full - 0.05, name


def test_layer_cli_default_and_json():
    r = runner.invoke(app, ["layer", "--json"])
    assert r.exit_code == 0
    doc = json.loads(r.output)
    std, spec = doc["variants"]["standard"], doc["variants"]["specialized"]
    assert (std["kernel_count"], spec["kernel_count"]) == (23, 8)  # one token: vLLM 0.33.0 launches 23 and 8
    assert doc["speedup"] == pytest.approx(std["layer_us"] / spec["layer_us"], rel=1e-3)
    for k in std["kernels"]:
        assert {"name", "stream", "start_us", "duration_us", "bytes", "flops", "bound"} <= set(k)
    assert std["floor_us"] <= std["layer_us"]
    human = runner.invoke(app, ["layer"])
    assert human.exit_code == 0 and "speedup" in human.output and "metric" in human.output


def test_step_cli_json():
    r = runner.invoke(app, ["step", "--json", "--draft-tokens", "7", "--acceptance-length", "6"])
    doc = json.loads(r.output)
    assert r.exit_code == 0 and doc["acceptance_length"] == 6
    for v in doc["variants"].values():
        assert {"step_ms", "tokens_per_s", "tokens_per_s_per_user", "breakdown_ms"} <= set(v)
        assert v["tokens_per_s"] == pytest.approx(6 / (v["step_ms"] / 1000), rel=1e-3)
    assert doc["speedup"] > 1


def test_trace_cli(tmp_path):
    out = tmp_path / "t.json"
    r = runner.invoke(app, ["trace", "--out", str(out)])
    assert r.exit_code == 0
    trace = json.loads(out.read_text())
    xs = [e for e in trace["traceEvents"] if e["ph"] == "X" and e.get("cat") != "prefetch"]
    assert len(xs) == 23 + 8 and all(e["dur"] >= 0 for e in xs)  # one token: vLLM 0.33.0 launches 23 and 8
    r = runner.invoke(app, ["trace", "--out", str(tmp_path / "s.json"), "--step", "--tokens-per-seq", "1",
                            "--variant", "specialized"])
    assert r.exit_code == 0


@pytest.mark.parametrize("args, needle", [
    (("layer", "--hardware", "tpu-v9"), "Unknown hardware"),
    (("layer", "--hardware", "h200", "--tp", "16"), "--tp 16 exceeds the 8-GPU NVLink domain"),
    (("step", "--draft-tokens", "3", "--acceptance-length", "5"), "acceptance-length"),
    (("step", "--draft-tokens", "-1"), "draft-tokens"),
    (("step", "--batch", "0"), "batch"),
    (("layer", "--context", "-5"), "context"),
    (("layer", "--disable-fusion", "warp_drive"), "unknown fusion"),
    (("trace", "--out", "/tmp/x.json", "--tp", "5"), "does not divide"),
    (("step", "--model", "deepseek-v3", "--tp", "8", "--draft-tokens", "3"), "does not match"),
    (("step", "--drafter", "no-such-drafter", "--draft-tokens", "3"), "unknown model"),
])
def test_cost_bad_input(args, needle):
    r = runner.invoke(app, list(args))
    assert r.exit_code == 2 and needle in r.output and "Traceback" not in r.output


def test_trace_bad_input_writes_nothing(tmp_path):
    out = tmp_path / "never.json"
    r = runner.invoke(app, ["trace", "--out", str(out), "--hardware", "nope"])
    assert r.exit_code == 2 and not out.exists()


def test_memory_capacity(k3):
    from simulator.cost.memory import weight_bytes_per_gpu
    assert weight_bytes_per_gpu(k3, 1) == pytest.approx(1.56e12, rel=0.02)  # the 1.56 TB checkpoint
    assert weight_bytes_per_gpu(k3, 16) < weight_bytes_per_gpu(k3, 8) < load_hardware("gb300").hbm_capacity
    r = runner.invoke(app, ["step", "--hardware", "h200", "--tp", "8", "--json"])
    mem = json.loads(r.output)["memory_gb"]
    assert r.exit_code == 0 and not mem["fits"] and mem["weights"] > mem["capacity"]
    assert "pipeline" in runner.invoke(app, ["step", "--hardware", "h200", "--tp", "8"]).output


def test_layer_and_ablation_plots(tmp_path):
    r = runner.invoke(app, ["layer", "--plot", str(tmp_path / "layer"), "--json"])
    assert r.exit_code == 0 and len(json.loads(r.output)["plots"]) == 6
    r = runner.invoke(app, ["ablation", "--plot", str(tmp_path / "abl"), "--json"])
    files = json.loads(r.output)["plots"]
    assert r.exit_code == 0 and len(files) == 4 and all(Path(f).stat().st_size > 0 for f in files)


def _measured_h200():
    import csv
    with open(Path(__file__).resolve().parent.parent / "data" / "h200_decode_gemms.csv") as f:
        return list(csv.DictReader(f))


def test_h200_measured_decode_gemms():
    """data/h200_decode_gemms.csv (benchmarks/h200_decode_gemms.py on one H200): Kimi K3's TP8 decode
    GEMMs take the same time from M = 1 to 64, the model predicts them within 20 % (one fitted
    efficiency), and no measurement beats the bytes / peak-bandwidth floor."""
    from simulator.cost.pricing import price_kernel
    from simulator.plans.kernel import Kernel, Tensor
    # the physics law; the fitted one
    hw, measured_law = load_hardware("h200", "datasheet"), load_hardware("h200", "gpu-suite")
    rows = _measured_h200()
    assert len(rows) == 27 and {r["gpu"] for r in rows} == {"NVIDIA H200"}
    for r in rows:
        k, n, m, measured = int(r["K"]), int(r["N"]), int(r["M"]), float(r["us_per_kernel"])
        gemm = Kernel("g", "g", "gemm", family="gemm", reads=(Tensor("x", (m, k), "bf16"),),
                      writes=(Tensor("y", (m, n), "bf16"),),
                      weights=(Tensor("w", (k, n), "bf16"),), flops=2 * m * k * n)
        cost = price_kernel(gemm, hw)
        predicted = cost.launch_us + cost.duration_us
        assert gemm.hbm_bytes / hw.hbm_bandwidth * 1e6 < measured  # speed of light
        tolerance = 0.30 if n < 1024 else 0.20  # the N = 896 router has few output tiles: a small grid
        assert abs(predicted / measured - 1) < tolerance, (r["kernel"], m, predicted, measured)
        law = price_kernel(gemm, measured_law)  # fitted on calibration/h200's later run: its held-back worst is < 25 %
        assert law.measured and abs((law.launch_us + law.duration_us) / measured - 1) < 0.25, (r["kernel"], m)
    by_shape: dict = {}
    for r in rows:
        by_shape.setdefault(r["kernel"], []).append(float(r["us_per_kernel"]))
    assert all(max(t) / min(t) < 1.2 for t in by_shape.values())  # memory-bound: flat from M = 1 to 64


SHAPES = [DecodeShape(4, 1, 512), DecodeShape(3, 4, 77, RoutingStats(1.01, 0.5)),
          DecodeShape(1, 1, 9000, RoutingStats(0.5, 0.9))]


@pytest.mark.parametrize("model", ["kimi-k3", "tiny-deepseek"])
@pytest.mark.parametrize("layer", ["kda", "mla", "dense"])
def test_layers_sharing_a_plan_shape_build_the_same_kernels(model, layer):
    """The sweep prices one plan per `plan_shape`: a shape it maps together must build the same kernels,
    and a change of what the plan does read (batch, the MLA context, the routing of an MoE layer) must not."""
    cfg = load_model(model)
    if not cfg.layer_counts().get(layer):
        pytest.skip(f"{model} has no {layer} layer")
    for variant in ("standard", "specialized"):
        for shape in SHAPES:
            same = plan_shape(cfg, shape, layer)
            assert build_plan(cfg, variant, 8, shape, layer).kernels == build_plan(cfg, variant, 8, same, layer).kernels
        moved = [replace(SHAPES[1], batch=5), replace(SHAPES[1], routing=RoutingStats(0.0, 0.5))]
        moved += [replace(SHAPES[1], context=5000)] if cfg.attn_kinds[representative_layer(cfg, layer)] == "mla" else []
        for shape in moved if layer != "dense" else moved[:1]:
            assert plan_shape(cfg, shape, layer) != plan_shape(cfg, SHAPES[1], layer)


@pytest.mark.parametrize("model", ["kimi-k3", "tiny-deepseek"])
def test_heads_sharing_a_head_shape_build_the_same_kernels(model):
    """The step prices one head (and draft head) per `head_shape`: the context and routing it drops must not
    change the kernels, and the tokens it keeps must."""
    from simulator.cost.step import head_shape
    from simulator.cost.head import draft_head_plan, head_plan
    cfg = load_model(model)
    for shape in SHAPES:
        same = head_shape(shape)
        for variant in ("standard", "specialized"):
            assert head_plan(cfg, 8, shape, variant).kernels == head_plan(cfg, 8, same, variant).kernels
        assert draft_head_plan(cfg, 8, shape, 3).kernels == draft_head_plan(cfg, 8, same, 3).kernels
    assert head_shape(replace(SHAPES[1], tokens_per_seq=2)) != head_shape(SHAPES[1])


def test_drafter_layers_that_build_the_same_kernels_are_one_plan():
    """The uncertainty draws remember a plan's schedule by identity: a drafter's dense layers differ only in
    their index, so `drafter_plans` builds one plan for them and hands out that object five times (a sweep
    then schedules one plan under 100 draws where it scheduled five), and the head stays its own."""
    from simulator.cost.step import drafter_plans, load_drafter
    from simulator.plans import standard
    drafter, drafting, taps = load_drafter("dspark-k3")
    plans, _ = drafter_plans(drafter, 8, 4, 3, 4096, drafting, taps)
    layers = plans[:drafter.num_layers]
    assert len(layers) == drafter.num_layers > 1 and all(p is layers[0] for p in layers)
    assert standard.build(drafter, 8, layers[0].shape, "dense", drafter.num_layers - 1).kernels == layers[0].kernels
    assert plans[-1] is not layers[0] and plans[-1] != layers[0]  # the draft head


@pytest.mark.parametrize("model", ["kimi-k3", "dspark-k3", "tiny-deepseek", "tiny-k3", "deepseek-v3", "gpt-oss-20b"])
def test_layers_of_one_signature_build_the_same_kernels(model):
    """`cost.step.layer_signature` says all a plan reads of its layer's index (callers build one plan per
    signature: `drafter_plans`): every layer of a model builds the kernels of the first layer with its
    signature, both variants, at two shapes; and layers of different signatures do not all agree."""
    from simulator.cost.step import layer_signature
    cfg = load_model(model)
    first: dict[tuple, int] = {}
    for i in range(cfg.num_layers):
        first.setdefault(layer_signature(cfg, i), i)
    from simulator.config import validate_tp
    from simulator.errors import UserError
    tp = 8
    try:
        validate_tp(cfg, tp)
    except UserError:
        tp = 1
    for shape in (DecodeShape(1, 1, 512), DecodeShape(4, 2, 4096)):
        for variant in ("standard", "specialized"):
            for i in range(cfg.num_layers):
                j = first[layer_signature(cfg, i)]
                if i != j:
                    kind = cfg.layer_type(i)
                    assert (build_plan(cfg, variant, tp, shape, kind, layer=i).kernels
                            == build_plan(cfg, variant, tp, shape, kind, layer=j).kernels), (model, variant, i, j)
    if len(first) > 1:
        plans = {build_plan(cfg, "standard", tp, DecodeShape(1, 1, 512), sig[0], layer=i).kernels
                 for sig, i in first.items()}
        assert len(plans) > 1


def test_remembered_step_times_equal_a_step_priced_afresh(k3, gb300):
    """estimate_step remembers a step's times per argument but the acceptance length (`step.step_times`): walk
    points that differ from the one before in one argument each, the acceptance length included, and hold
    each remembered step to the same step computed without the cache."""
    from simulator.cost import step
    point = {"hw": gb300, "variant": "specialized", "tp": 16, "batch": 4, "context": 2048, "draft_tokens": 3,
             "acceptance_length": 2.0, "drafter": "dspark-k3", "fusions": None, "routing": RoutingStats(1.2, 0.5)}
    changes = [("acceptance_length", 3.0), ("variant", "standard"), ("tp", 8), ("batch", 8), ("context", 4096),
               ("acceptance_length", 1.5), ("draft_tokens", 1), ("acceptance_length", 2.0),
               ("routing", RoutingStats(0.0, 0.0)), ("variant", "specialized"), ("fusions", frozenset()),
               ("hw", load_hardware("gb200"))]
    for key, value in [("variant", "specialized")] + changes:
        point[key] = value
        args = {k: v for k, v in point.items() if k not in ("hw", "acceptance_length")}
        got = estimate_step(k3, point["hw"], acceptance_length=point["acceptance_length"], **args)
        fresh = step._step(k3, point["hw"], args["variant"], args["tp"], args["batch"], args["context"],
                           args["draft_tokens"], args["drafter"], args["fusions"], args["routing"], step.makespan_us)
        assert got == replace(fresh, tokens_per_step=point["acceptance_length"]), f"after changing {key}"
