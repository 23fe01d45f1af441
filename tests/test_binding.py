"""One kernel, one truth: a kernel's declared tensors are exactly the arguments its op receives.

The executor hands each op the declared reads and weights and stores the declared writes; these tests
hold the declarations to the weight specification, the op signatures and the arithmetic, and check
that the executor refuses anything undeclared."""

import inspect
from dataclasses import replace

import numpy as np
import pytest

from simulator.plans.fuse import Chain

from simulator.check import make_inputs
from simulator.config import load_model
from simulator.dtypes import Precision
from simulator.execute import BindingError, run_plan
from simulator.ops import kda as kda_ops
from simulator.ops import linear as lin
from simulator.ops import mla as mla_ops
from simulator.plans import VARIANTS, specialized, standard
from simulator.plans.builders import BUILDERS
from simulator.plans.common import make_dims
from simulator.plans.kernel import EXPERT, DecodeShape, Plan
from simulator.plans.specialized import FUSIONS
from simulator.weights import LayerWeights, weight_spec

SHAPES = [DecodeShape(1, 1, 512), DecodeShape(1, 8, 1024), DecodeShape(3, 2, 64)]


def _plans(cfg, tp):
    layers = [lt for lt in ("kda", "mla", "dense") if any(cfg.layer_type(i) == lt for i in range(cfg.num_layers))]
    for shape in SHAPES:
        for layer in layers:
            yield standard.build(cfg, tp, shape, layer)
            yield specialized.build(cfg, tp, shape, layer)
            yield specialized.build(cfg, tp, shape, layer, fusions=set(FUSIONS) | {"unpadded_experts"})
            for off in FUSIONS:
                yield specialized.build(cfg, tp, shape, layer, fusions=set(FUSIONS) - {off})


@pytest.mark.parametrize("model, tp", [("kimi-k3", 16), ("kimi-k3", 8), ("deepseek-v3", 8)])
def test_every_declared_weight_is_in_the_specification(model, tp):
    cfg = load_model(model)
    for plan in _plans(cfg, tp):
        for k in plan:
            for t in k.weights:
                assert t.parts, f"{k.key}: weight '{t.name}' names no spec weight"
                for name, shard in t.parts:
                    weight_spec(cfg, name.replace(EXPERT, "expert.0."))  # KeyError if the spec lacks it
                    assert shard in ("full", "col", "row")


def _positional(op) -> tuple[int, bool]:
    params = inspect.signature(op).parameters.values()
    if any(p.kind == p.VAR_POSITIONAL for p in params):
        return 0, True
    return sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params), False


@pytest.mark.parametrize("tp", [16, 4])
def test_every_op_takes_exactly_the_declared_tensors(k3, tp):
    for plan in _plans(k3, tp):
        for k in plan:
            assert k.op is not None, k.key
            # a fused kernel (plans/fuse.py): each merged op takes its part's tensors and consts
            calls = ([(p.op, len(p.reads), p.weights, p.consts) for p in k.op.parts] if isinstance(k.op, Chain)
                     else [(k.op, len(k.reads), len(k.weights), tuple(c for c, _ in k.consts))])
            for op, reads, weights, consts in calls:
                n, variadic = _positional(op)
                params = inspect.signature(op).parameters
                assert variadic or n == reads + weights + sum(c in params and params[c].kind != params[c].KEYWORD_ONLY
                                                              for c in consts), \
                    f"{k.key}: {op.__name__} takes {n} tensors, the kernel declares {reads} + {weights}"
                assert all(c in params for c in consts), f"{k.key}: a const the op does not take"


def _run(cfg, plan, layer_type, seed=0):
    d = make_dims(cfg, plan.tp, plan.shape, None, layer_type)
    io, state = make_inputs(cfg, d, np.random.default_rng(seed))
    return run_plan(plan, d, LayerWeights(cfg, d.layer, seed), io, state, Precision("fp64"))


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("layer", ["kda", "mla", "dense"])
def test_ops_receive_the_declared_shapes(tiny, variant, layer):
    """Record what every op receives: one array (or expert function) per declared tensor, of its shape."""
    plan = BUILDERS[variant](tiny, 2, DecodeShape(2, 2, 5), layer)
    seen = {}

    def spy(k):
        def op(*args, **kw):
            seen[k.key] = args
            return k.op(*args, **kw)
        return replace(k, op=op)

    _run(tiny, Plan(plan.variant, plan.layer, plan.tp, plan.shape, tuple(spy(k) for k in plan)), layer)
    for k in plan:
        args = seen[k.key]
        assert len(args) == len(k.reads) + len(k.weights), k.key
        for t, a in zip(k.reads + k.weights, args):
            if callable(a):  # routed experts: the declared parts of one expert's shard
                parts = a(0)
                assert len(parts) == len(t.parts), k.key
                continue
            first = a[0] if k.scope == "ranks" else a
            assert np.shape(first) == (t.unpadded or t.shape), (k.key, t.name)


def _with(plan, key, **changes):
    return Plan(plan.variant, plan.layer, plan.tp, plan.shape,
                tuple(replace(k, **changes) if k.key == key else k for k in plan))


def test_executor_refuses_what_is_not_declared(tiny):
    plan = standard.build(tiny, 2, DecodeShape(2, 1, 5), "kda")
    fb = plan.kernel("kda_fb_proj")
    wrong_shape = replace(fb.reads[0], shape=(fb.reads[0].shape[0], fb.reads[0].shape[1] + 1))
    cases = {
        "a read of the wrong shape": _with(plan, "kda_fb_proj", reads=(wrong_shape,)),
        "a read nobody wrote": _with(plan, "kda_fb_proj", reads=(replace(fb.reads[0], name="kda.nowhere"),)),
        "an undeclared output": _with(plan, "kda_fb_proj", writes=()),
        "a write of the wrong shape": _with(plan, "kda_fb_proj", writes=(replace(fb.writes[0], shape=(1, 1)),)),
        "a weight of the wrong shard": _with(plan, "kda_fb_proj",
                                             weights=(replace(fb.weights[0], parts=(("kda.w_fb", "full"),)),)),
    }
    for what, bad in cases.items():
        with pytest.raises(BindingError):
            _run(tiny, bad, "kda")
        assert what
    with pytest.raises(KeyError):  # a weight the specification does not hold
        _run(tiny, _with(plan, "kda_fb_proj", weights=(replace(fb.weights[0], parts=(("kda.w_in", "col"),)),)), "kda")


@pytest.mark.parametrize("layer", ["kda", "mla", "dense"])
def test_gemm_flops_are_the_textbook_count(k3, layer):
    """Two FLOPs (multiply, add) per multiply-accumulate of every plain GEMM kernel, the MACs counted by
    doing them: ones([M, K]) @ ones([K, N]) sums to M K N (the padded N where the loader pads: the GEMM
    runs over the padding)."""
    plain = (lin.linear, lin.linear_split, mla_ops.linear_heads)
    for build in (standard.build, specialized.build):
        for k in build(k3, 16, DecodeShape(2, 4, 512), layer):
            if k.op in plain:
                (x,), (w,) = k.reads, k.weights
                macs = (np.ones(x.shape, np.float32) @ np.ones(w.shape, np.float32)).sum(dtype=np.float64)
                assert k.flops == 2 * macs, k.key


def test_delta_rule_flops_count_the_recurrence():
    """Per token and head: decay (diag(alpha) S), S^T k, the rank-1 update (product + add), S^T q."""
    N, H = 3, 8
    S, k = np.empty((N, H, H)), np.empty((N, H))

    def einsum_flops(spec, *ops):
        text = np.einsum_path(spec, *ops, optimize=False)[1]
        return float(next(line for line in text.splitlines() if "Naive FLOP" in line).split(":")[1])

    decay = S.size  # one multiply per state element
    transpose_product = einsum_flops("nij,ni->nj", S, k)  # S^T k and, the same count, S^T q
    rank_one = 2 * S.size  # the outer product k (beta (v - u))^T, then its add into S
    assert kda_ops.delta_rule_flops(1, N, H) == decay + 2 * transpose_product + rank_one


def test_standalone_collectives_carry_what_they_read(k3):
    for plan in _plans(k3, 16):
        for k in plan:
            if k.kind == "collective" and k.collective.op == "all_reduce" and not k.collective.in_kernel:
                assert k.collective.nbytes == k.read_bytes, k.key
            if k.key == "oproj_ar_norm":
                assert k.collective.nbytes == next(t.nbytes for t in k.writes if t.name == "x2"), k.key
            if k.key == "router_gather_topk":
                assert k.collective.nbytes == k.read_bytes, k.key


def _ordered_before(plan):
    """key -> the keys that complete before it starts: earlier kernels on its stream, its deps, transitively."""
    before = {}
    for i, k in enumerate(plan.kernels):
        direct = {j.key for j in plan.kernels[:i] if j.stream == k.stream} | set(k.deps)
        before[k.key] = set(direct).union(*(before[d] for d in direct))
    return before


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("layer", ["kda", "mla", "dense"])
def test_every_read_waits_for_its_writer(k3, variant, layer):
    """No data race across streams: the kernel that last wrote a tensor finishes before a reader starts."""
    for plan in (BUILDERS[variant](k3, 16, s, layer) for s in SHAPES):
        _assert_reads_wait(plan, layer)


def _assert_reads_wait(plan, label):
    """Every read waits for the last earlier writer of its tensor (on its stream, or through its deps)."""
    before = _ordered_before(plan)
    for i, k in enumerate(plan.kernels):
        for t in k.reads:
            writers = [j for j in plan.kernels[:i] if any(w.name == t.name for w in j.writes)]
            if writers:
                assert writers[-1].key in before[k.key], \
                    f"{label}: {k.key} reads {t.name} without waiting for {writers[-1].key}"


@pytest.mark.parametrize("model, tp, shape, build", [
    ("kimi-k3", 8, DecodeShape(1, 8, 64), lambda *a: standard.build(*a, arch="sm90")),  # Hopper: the unfused tail
    ("kimi-k3", 16, DecodeShape(160, 1, 64), standard.build),  # above the tier-0 tail's 128 tokens
    ("kimi-k3", 16, DecodeShape(160, 1, 64),  # the generic specialized MoE with the latent tail unfused
     lambda *a: specialized.build(*a, fusions=set(FUSIONS) - {"latent_tail"}, fallback=False)),
    ("deepseek-v3", 16, DecodeShape(1, 8, 64), specialized.build),  # the classic MoE, shared expert on aux
], ids=["k3-sm90", "k3-160-tokens", "k3-160-specialized", "deepseek-v3-specialized"])
def test_every_read_waits_for_its_writer_off_the_k3_blackwell_path(model, tp, shape, build):
    """The same race check on the MoE paths the Kimi K3 plans above do not take: the latent read by FC1 from the
    aux stream, the shared expert's partial read by the tail, the normed x2 read by the overlapped shared expert."""
    cfg = load_model(model)
    for layer in sorted({cfg.layer_type(i) for i in range(cfg.num_layers)} - {"dense"}):  # the MoE layers
        plan = build(cfg, tp, shape, layer)
        assert any(k.stream != "main" for k in plan.kernels), (model, layer)  # a plan that has streams to race
        _assert_reads_wait(plan, f"{model} {layer}")


def _einsum_flops(spec, *shapes):
    """numpy's naive FLOP count of one contraction (exact for these small sizes)."""
    text = np.einsum_path(spec, *(np.empty(s) for s in shapes), optimize=False)[1]
    return float(next(line for line in text.splitlines() if "Naive FLOP" in line).split(":")[1])


def test_count_functions_show_their_arithmetic():
    """Each named count equals its contractions counted by einsum_path plus its elementwise work."""
    from simulator.ops import mla, norm
    S, M, D = 3, 2, 5
    squares = 2 * S * M * D  # x * x, accumulated into the mean square
    query = _einsum_flops("smd,d->sm", (S, M, D), (D,))
    mix = _einsum_flops("sm,smd->md", (S, M), (S, M, D))
    assert norm.attn_res_mix_flops(S, M, D) == squares + query + mix
    assert norm.rms_norm_flops(M, D) == 2 * M * D + 2 * M * D  # squares + the two scalings
    T, N, L, R, C = 2, 3, 4, 2, 5  # tokens, heads, latent, rope slot, cached slots
    scores = _einsum_flops("tnl,sl->tns", (T, N, L), (C, L)) + _einsum_flops("tnr,sr->tns", (T, N, R), (C, R))
    values = _einsum_flops("tns,sl->tnl", (T, N, C), (C, L))
    assert mla.mla_decode_flops(T, N, C, L, R) == scores + values
