"""Kernel plans: counts come from len(plan), fused kernels never move more bytes, every switch works."""

import pytest

from simulator.ops import pointwise
from simulator.plans import specialized, standard
from simulator.plans.kernel import DecodeShape
from simulator.plans.specialized import FUSIONS

K3_TRACE = DecodeShape(batch=1, tokens_per_seq=8, context=1024)  # the configuration assumed for the trace


def test_published_counts_kda_layer_tp16(k3):
    """vLLM 0.33.0 (docs/vllm-k3-source.md): at 1 x 8 tokens the specialized path launches the published 13 and
    the stock path 22 (23 published: no one configuration gives both); at one token 23 and 8."""
    assert len(standard.build(k3, 16, K3_TRACE, "kda")) == 22
    assert len(specialized.build(k3, 16, K3_TRACE, "kda")) == 13
    assert len(standard.build(k3, 16, DecodeShape(1, 1, 1024), "kda")) == 23
    assert len(specialized.build(k3, 16, DecodeShape(1, 1, 1024), "kda")) == 8


def test_other_layer_counts(k3):
    assert len(standard.build(k3, 16, K3_TRACE, "mla")) == 26
    assert len(specialized.build(k3, 16, K3_TRACE, "mla")) == 15
    assert len(standard.build(k3, 16, K3_TRACE, "dense")) == 13
    assert len(specialized.build(k3, 16, K3_TRACE, "dense")) == 7


def test_stock_fused_kda_only_where_vllm_supports_it(k3):
    # TP8 = 12 local heads, one token per sequence: the stock fused KDA decode kernel applies (with the
    # projection split over the attention aux stream at <= 2 tokens).
    assert len(standard.build(k3, 8, DecodeShape(1, 1), "kda")) == 21
    assert len(standard.build(k3, 8, DecodeShape(3, 1), "kda")) == 20
    assert len(standard.build(k3, 8, DecodeShape(1, 8), "kda")) == 22  # draft tokens: fallback chain


def test_steps_the_specialized_runtime_does_not_serve_run_the_stock_forward(k3):
    """P13: 1-8, 16, 32, 64 tokens (CUDA-graph sizes 1, 2, 4, multiples of 8) and verifies up to 64 tokens."""
    for batch, served in ((8, True), (16, True), (24, False), (40, False), (64, True), (65, False), (128, False)):
        plan = specialized.build(k3, 8, DecodeShape(batch, 1, 512), "kda")
        stock = standard.build(k3, 8, DecodeShape(batch, 1, 512), "kda")
        assert (plan.kernels == stock.kernels) is not served, batch
    assert specialized.build(k3, 16, DecodeShape(8, 8, 512), "kda").kernels != standard.build(
        k3, 16, DecodeShape(8, 8, 512), "kda").kernels


FUSION_SAVINGS = {"fused_kda": 3, "oproj_allreduce_norm": 2, "split_router": 3, "glu_epilogue": 0,
                  "moe_finalize": 0, "latent_tail": 0, "shared_overlap": 0, "pdl_prefetch": 0, "small_batch_proj": 0,
                  "kda_fb_in_kernel": 1, "mla_query_value": 0, "persistent_experts": 1, "one_kernel_tail": 2,
                  "small_batch_chain": 0, "l2_prefetch": -2, "unpadded_experts": 0}


@pytest.mark.parametrize("fusion", list(FUSIONS))
def test_each_fusion_switches_off_alone(k3, fusion):
    full = specialized.build(k3, 16, K3_TRACE, "kda")
    without = specialized.build(k3, 16, K3_TRACE, "kda", fusions=set(FUSIONS) - {fusion})
    assert len(without) - len(full) == FUSION_SAVINGS[fusion]
    assert fusion not in without.fusions
    assert all(fusion not in k.fusions for k in without)
    for layer in ("kda", "mla", "dense"):  # every ablated plan is still well formed
        plan = specialized.build(k3, 16, K3_TRACE, layer, fusions=set(FUSIONS) - {fusion})
        keys = [k.key for k in plan]
        assert all(set(k.deps) <= set(keys[:i]) for i, k in enumerate(plan)), (fusion, layer)


@pytest.mark.parametrize("shape", [K3_TRACE, DecodeShape(1, 1, 512)], ids=["M8", "C1"])
@pytest.mark.parametrize("layer", ["kda", "mla", "dense"])
def test_no_fusion_is_the_standard_plan(k3, shape, layer):
    none = specialized.build(k3, 16, shape, layer, fusions=())
    std = standard.build(k3, 16, shape, layer)
    assert [(k.key, k.stream, k.deps, k.pdl, k.prefetch_bytes, k.hbm_bytes) for k in none] == \
        [(k.key, k.stream, k.deps, k.pdl, k.prefetch_bytes, k.hbm_bytes) for k in std]


@pytest.mark.parametrize("layer", ["kda", "mla", "dense"])
@pytest.mark.parametrize("tp, batch, tokens", [(8, 1, 1), (16, 1, 8), (16, 32, 1), (4, 3, 4)])
def test_fused_kernels_never_move_more_bytes_nor_flops(k3, layer, tp, batch, tokens):
    """A fusion's kernels together move no more HBM bytes and count no more FLOPs than the standard
    kernels they replace (scaling-book: a fused kernel never moves more bytes than its unfused sequence)."""
    shape = DecodeShape(batch, tokens, 512)
    std = {k.key: k for k in standard.build(k3, tp, shape, layer)}
    spec = specialized.build(k3, tp, shape, layer)
    for fusion in spec.fusions:  # a fusion's kernels together vs the standard kernels they replace
        group = [k for k in spec if fusion in k.fusions and k.replaces]
        replaced = {key for k in group for key in k.replaces if key in std} or {k.key for k in group if k.key in std}
        if group:
            assert sum(k.hbm_bytes for k in group) <= sum(std[key].hbm_bytes for key in replaced), fusion
            if not any("moe_finalize" in k.fusions for k in group):  # the weighted sum moves from the tail
                assert sum(k.flops for k in group) <= sum(std[key].flops for key in replaced), fusion
    stock = standard.build(k3, tp, shape, layer)
    assert spec.hbm_bytes <= stock.hbm_bytes and sum(k.flops for k in spec) <= sum(k.flops for k in stock)


@pytest.mark.parametrize("layer", ["kda", "mla", "dense"])
@pytest.mark.parametrize("build", [standard.build, specialized.build], ids=["standard", "specialized"])
def test_plan_is_well_formed(k3, layer, build):
    plan = build(k3, 16, K3_TRACE, layer)
    keys = [k.key for k in plan]
    assert len(keys) == len(set(keys))
    for i, k in enumerate(plan):
        assert set(k.deps) <= set(keys[:i]), f"{k.key} depends on a later or missing kernel"
        assert k.op is not None and k.note and k.source.startswith("vllm/")
        assert k.hbm_bytes > 0 or k.op is pointwise.nothing  # a launch that moves no numbers (an L2 prefetch)


def test_traffic_is_derived_from_shapes(k3):
    one = standard.build(k3, 16, DecodeShape(1, 1), "kda").kernel("kda_in_proj")
    assert one.weight_bytes == 7168 * 3216 * 2  # 4 x 768 + 128 + 6 = 3206 columns; padded N is 3216 in vLLM
    router = standard.build(k3, 16, DecodeShape(1, 1), "kda").kernel("router")
    assert router.weight_bytes == 7168 * 896 * 2
    fc1 = standard.build(k3, 16, DecodeShape(1, 1), "kda").kernel("fc1")
    assert fc1.weight_bytes == 16 * (3584 * 2 * 256 // 2 + 3584 * 2 * 256 // 32)  # MXFP4 4.25 bits; 192 padded to 256
    spec = specialized.build(k3, 16, DecodeShape(1, 1), "kda").kernel("experts")  # P1: the real 192 rows
    assert spec.weights[0].nbytes == 16 * (3584 * 2 * 192 // 2 + 3584 * 2 * 192 // 32)
    padded = specialized.build(k3, 16, DecodeShape(1, 1), "kda",
                               fusions=set(specialized.FUSIONS) - {"unpadded_experts"})
    assert padded.kernel("experts").weights[0].nbytes == fc1.weight_bytes


def test_expert_traffic_grows_with_unique_experts(k3):
    b = [standard.build(k3, 16, DecodeShape(batch, 1), "kda").kernel("fc1").weight_bytes for batch in (1, 8, 64)]
    assert b[0] < b[1] < b[2]


def test_kernels_doc_is_current():
    from pathlib import Path

    from simulator.report.kernels_doc import kernels_markdown
    committed = Path(__file__).resolve().parent.parent / "docs" / "kernels.md"
    assert committed.read_text() == kernels_markdown(), "run: python -m simulator.report.kernels_doc > docs/kernels.md"


@pytest.mark.parametrize("layer", ["kda", "mla", "dense"])
def test_streams_are_the_sourced_ones(k3, layer):
    """Stock vLLM 0.33.0 runs the MLA g_proj, the latent down-projection and the shared expert on aux streams;
    the specialized path runs the shared expert on its MoE side stream and the L2 prefetches on their own."""
    std = standard.build(k3, 16, K3_TRACE, layer)
    aux = {"mla_g_proj", "latent_down", "shared_gate_up", "shared_act", "shared_down"}
    moe = layer != "dense"
    assert {k.key for k in std if k.stream != "main"} == (aux & {k.key for k in std} if moe else set())
    spec = specialized.build(k3, 16, K3_TRACE, layer)
    assert {k.key for k in spec if k.stream == "aux"} == ({k.key for k in spec if k.key.startswith("shared_")}
                                                          if moe else set())
    assert {k.key for k in spec if k.stream == "prefetch"} == ({"l2_prefetch_oproj_down", "l2_prefetch_next_attention"}
                                                               if moe else set())


@pytest.mark.parametrize("layer", ["kda", "mla", "dense"])
def test_launches_are_the_sourced_ones(k3, layer):
    """pdl_prefetch: every launch is PDL and loads all its weights early except the routed experts, whose
    weights the routing picks. Stock C=1 (PR #53525, #53524): the KDA kernels, o_proj and the router only."""
    spec = specialized.build(k3, 16, K3_TRACE, layer)
    assert all(k.pdl != (k.stream == "prefetch") for k in spec)  # an L2 prefetch launches without PDL
    assert all(k.prefetch_bytes == (0 if k.kind == "moe" else k.weight_bytes) for k in spec)
    c1 = standard.build(k3, 16, DecodeShape(1, 1, 512), layer)
    early = {k.key for k in c1 if k.prefetch_bytes}
    assert early == {k.key for k in c1 if k.weights and (k.key.startswith("kda_") or k.key in ("o_proj", "router"))}
    assert all(k.prefetch_bytes == k.weight_bytes for k in c1 if k.key in early)
    if layer == "dense":
        return
    stock = standard.build(k3, 16, K3_TRACE, layer)  # S7: PDL at every batch on the launches the source says
    plain = {"kda_conv", "kda_recurrent", "kda_gated_norm", "shared_act", "mla_norm", "mla_absorb", "mla_cache_insert",
             "mla_decode", "mla_w_uv", "mla_gate_mul", "mxfp8_quant"}
    assert {k.key for k in stock if not k.pdl} == plain & {k.key for k in stock}
    assert not any(k.prefetch_bytes for k in stock)


def test_a_plans_remembered_hash_is_its_dataclass_hash_and_is_not_pickled(k3):
    """Plan keeps its hash after the first call (the cost model's caches key on plans): it stays the hash of its
    fields, a twin built apart hashes alike, a plan with one kernel changed does not, and pickling drops it (a
    string's hash differs between processes: a sweep's workers are other processes)."""
    import dataclasses
    import pickle
    plan = specialized.build(k3, 16, K3_TRACE, "mla")
    assert hash(plan) == hash((plan.variant, plan.layer, plan.tp, plan.shape, plan.kernels, plan.fusions))
    twin = dataclasses.replace(plan)
    assert twin == plan and twin is not plan and hash(twin) == hash(plan)
    other = dataclasses.replace(plan, kernels=plan.kernels[:-1] + (dataclasses.replace(plan.kernels[-1], flops=1),))
    assert hash(other) != hash(plan)
    assert "_hash" not in pickle.loads(pickle.dumps(plan)).__dict__


def test_a_kernels_remembered_hash_agrees_with_equality_and_separates_a_sweeps_kernels(k3):
    """Kernel keeps its hash after the first call (the pricing's caches look kernels up ~10^5 times a sweep),
    a hash of the scalars equality decides by: equal kernels built apart hash alike; a kernel that differs in
    its key, bytes or cache window does not collide, and one that differs only in what the hash leaves out
    (its note) is still told apart by equality. Over the MLA plans of a sweep's shapes (contexts, batches,
    draft lengths: ~1,000 distinct kernels), no two distinct kernels share a hash: a shared one costs every
    lookup a chain of full comparisons (a KV-cache insert at 40 contexts shared one before windows were in it,
    and kernels launched with and without PDL before the flag was)."""
    import dataclasses

    from simulator.plans.kernel import Kernel  # noqa: F401
    for kernel in specialized.build(k3, 16, K3_TRACE, "mla").kernels + standard.build(k3, 8, K3_TRACE, "kda").kernels:
        hash(kernel)  # remembered now
        twin = dataclasses.replace(kernel)
        assert twin == kernel and twin is not kernel and hash(twin) == hash(kernel)
        for change in ({"key": kernel.key + "'"}, {"flops": kernel.flops + 1}):
            assert hash(dataclasses.replace(kernel, **change)) != hash(kernel), change
        assert dataclasses.replace(kernel, note=kernel.note + ".") != kernel
    from simulator.cost.step import build_plan
    distinct = {k for variant in ("standard", "specialized") for context in range(512, 36_000, 2560)
                for batch in (1, 8, 128) for tokens in (1, 4, 8)
                for k in build_plan(k3, variant, 16, DecodeShape(batch, tokens, context), "mla")}
    assert len(distinct) > 500 and len({hash(k) for k in distinct}) == len(distinct)


@pytest.mark.parametrize("model", ["kimi-k3", "dspark-k3", "tiny-deepseek", "tiny-k3", "deepseek-v3"])
def test_kernels_shared_across_contexts_equal_kernels_built_afresh(model, monkeypatch):
    """`memo.context_free` factories are built once per shape without the context and shared by the
    plans of every context. Every layer type, both variants and each fusion left out alone, at contexts met
    after another context filled the memo, must build what the factories build from the real dims with the
    memo off: the kernels, their consts and their ops. A factory marked context-free that read the context
    (the cache insert or the decode attention) fails it."""
    from simulator.config import load_model, validate_tp
    from simulator.errors import UserError
    from simulator import memo
    from simulator.routing import RoutingStats
    cfg = load_model(model)
    tp = 8
    try:
        validate_tp(cfg, tp)
    except UserError:
        tp = 1
    layers = {cfg.layer_type(i): i for i in range(cfg.num_layers)}
    fusion_sets = [None, frozenset()] + [frozenset(FUSIONS) - {f} for f in FUSIONS]
    builds = [(standard.build, {})] + [(specialized.build, {"fusions": f}) for f in fusion_sets]
    monkeypatch.setattr(memo, "_KERNELS", {})
    for batch, tokens, routing in [(1, 1, RoutingStats()), (4, 3, RoutingStats(1.2, 0.5))]:
        for layer_type, index in layers.items():
            for build, kw in builds:
                build(cfg, tp, DecodeShape(batch, tokens, 1000, routing), layer_type, index, **kw)  # fills the memo
                for context in (0, 4096):
                    shape = DecodeShape(batch, tokens, context, routing)
                    shared = build(cfg, tp, shape, layer_type, index, **kw)
                    monkeypatch.setattr(memo, "KERNEL_MEMO", False)
                    fresh = build(cfg, tp, shape, layer_type, index, **kw)
                    monkeypatch.setattr(memo, "KERNEL_MEMO", True)
                    assert shared == fresh, (layer_type, kw, context)
                    assert [(k.consts, k.op) for k in shared] == [(k.consts, k.op) for k in fresh]
    assert memo._KERNELS  # the memo was used


def _docstring_table(doc: str) -> list[str]:
    """The fusion names of the specialized plan's docstring table: a line indented 4, a name, 2+ spaces."""
    import re
    return re.findall(r"^ {4}([a-z0-9_]+) {2,}\S", doc, re.M)


def test_specialized_docstring_table_lists_fusions_in_order():
    """The docstring's table is FUSIONS then WHAT_IF_FUSIONS, in their order (ablation.ORDER is FUSIONS' order)."""
    from simulator.cost.ablation import ORDER
    assert _docstring_table(specialized.__doc__) == list(FUSIONS) + list(specialized.WHAT_IF_FUSIONS)
    assert ORDER == tuple(FUSIONS)
    assert _docstring_table("    fused_kda  one\n      glu_epilogue  indented 6\n    split_router x\n") == ["fused_kda"]


def test_specialized_docstring_counts_are_the_plans(k3):
    """'KDA + MoE at TP16: 23 standard kernels -> 13 (fused_kda -2, ...)' is what the plans build: each named
    fusion saves what it says when it is the only one switched off, every unnamed one saves nothing."""
    import re
    doc = " ".join(specialized.__doc__.split())
    m = re.search(r"KDA \+ MoE at TP16: (\d+) standard kernels -> (\d+) \(([^)]*)\)", doc)
    assert m, "the docstring's count line is missing"
    full = specialized.build(k3, 16, K3_TRACE, "kda")
    assert (int(m[1]), int(m[2])) == (len(standard.build(k3, 16, K3_TRACE, "kda")), len(full))
    said = {name: -int(n) for name, n in re.findall(r"([a-z0-9_]+) ([-+]\d+)", m[3])}
    saved = {f: len(specialized.build(k3, 16, K3_TRACE, "kda", fusions=set(FUSIONS) - {f})) - len(full)
             for f in FUSIONS}
    assert said == {f: n for f, n in saved.items() if n}
