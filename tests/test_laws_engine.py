"""What the engine launches around a plan kernel is in its law: vLLM's routing top-k with its alignment launches,
AttnRes with the sources it mixes, the causal conv with the tokens it walks in order.

The launch count the small law computes for a plan's top-k must be the one the CSV rows counted (vLLM's
alignment: Marlin always, Triton fused_moe when M k 4 > E); under the vllm set Kimi K3's top-k (three launches, 896
experts) must cost at least twice DeepSeek-V3's at M <= 8 (one launch); AttnRes over five sources must cost more
than over one; a laws table whose small law lacks one of these terms is one sentence and exit 2.
"""

import csv
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from simulator.cli import app
from simulator.cost import laws
from simulator.cost.measured import _plan, normalise, point_kernel
from simulator.cost.pricing import price_kernel
from simulator.cost.validate import set_impls
from simulator.errors import UserError
from simulator.hardware import load_hardware
from simulator.hardware.kernel_sets import FAMILY_TERMS

ROOT = Path(__file__).resolve().parent.parent
PRODUCTION = ROOT / "calibration" / "h200" / "production"
runner = CliRunner()


@pytest.fixture(scope="module")
def vllm():
    return load_hardware("h200", "vllm")


def _us(kernel, hw) -> float:
    cost = price_kernel(kernel, hw)
    assert cost.measured, kernel.key  # priced by the set's small law, not the datasheet's
    return cost.launch_us + cost.duration_us


def test_the_top_k_launch_count_is_the_one_the_rows_counted(vllm):
    """Each topk row's `launches` (what the profiler saw) is what the law computes for the plan's kernel with the
    set's experts: Kimi K3 (Marlin) 3 at every M, DeepSeek-V3 (Triton fused_moe, E = 256, k = 8) 1 up to M = 8."""
    impls = set_impls(PRODUCTION)
    with (PRODUCTION / "small.csv").open(newline="") as f:
        rows = [normalise(r) | {"launches": int(r["launches"])} for r in csv.DictReader(f) if r["plan_key"] == "topk"]
    got = {(r["model"], r["tp"], r["M"]): laws.routing(point_kernel(r), impls)[0] for r in rows}
    assert got == {(r["model"], r["tp"], r["M"]): r["launches"] for r in rows}
    assert {n for (model, _, m), n in got.items() if model == "deepseek-v3" and m <= 8} == {1}
    assert {n for (model, _, _), n in got.items() if model == "kimi-k3"} == {3}
    # the same kernel under the suite's set, whose experts no alignment precedes: one launch
    k3 = _plan("kimi-k3", "standard", 8, 1, 1, 512, "kda").kernel("topk")
    assert laws.routing(k3, set_impls(PRODUCTION.parent))[0] == 1
    # gpt-oss's triton_kernels routing sorts with launches its plan declares (ogs_hist ...): none added to it
    import sys
    sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))
    import predict_gptoss
    plan = predict_gptoss.plan_of(1, 8, 1720, 0)
    assert {"ogs_hist", "ogs_indices"} <= {k.key for k in plan}
    assert laws.routing(plan.kernel("topk"), impls)[0] == 1


@pytest.mark.parametrize("m", [1, 4, 8])
def test_k3_top_k_costs_at_least_twice_deepseek_v3s(vllm, m):
    k3 = _plan("kimi-k3", "standard", 8, m, 1, 512, "kda").kernel("topk")
    v3 = _plan("deepseek-v3", "standard", 8, m, 1, 512, "mla").kernel("topk")
    assert _us(k3, vllm) >= 2 * _us(v3, vllm)


def test_attn_res_pays_per_source(vllm):
    """Kimi K3's AttnRes mixes 5 sources (4 block snapshots and the prefix); the one-source call standing in for
    DeepSeek-V3's add + norm mixes 1: at M = 1 both are bound by their chain of source reads (their bytes stream
    under it, laws.CHAIN_HIDES_STREAM), so the five-source launch costs its four extra sources more."""
    from simulator.cost.measured import attn_res_stand_in
    k3 = _plan("kimi-k3", "standard", 8, 1, 1, 512, "kda").kernel("attn_res_pre")
    one = attn_res_stand_in("deepseek-v3", 8, 1, 1, "mla", "attn_res_pre")
    assert (laws.attn_res_sources(k3), laws.attn_res_sources(one)) == (5, 1)
    fit = vllm.kernel_set.fit("small")
    per_source = dict(zip(fit.names, fit.regimes[0]))["sources"]
    assert 0.2 < per_source < 2.0  # µs per source read: about one dependent DRAM round trip
    assert _us(k3, vllm) - _us(one, vllm) == pytest.approx(4 * per_source)


def test_only_the_conv_walks_tokens_in_order():
    verify = _plan("kimi-k3", "standard", 8, 8, 4, 512, "kda")
    steps = {k.key: laws.sequence_steps(k, 132) for k in verify if k.family == "small"}
    assert steps.pop("kda_conv") == 2 * 4  # 8 sequences x 4608 / 256 features = 144 programs: 2 waves of T = 4
    assert set(steps.values()) == {0}


def test_every_small_kernel_gets_every_shared_term(vllm):
    kernel = _plan("kimi-k3", "standard", 8, 1, 1, 512, "kda").kernel("tail_add")
    feats = laws.features(kernel, laws.LawKey("small", "vllm", "tail_add"), 132, 50e6)
    assert set(feats) == {"t0_tail_add", *FAMILY_TERMS["small"]}


def test_a_small_law_without_a_new_term_is_one_sentence_and_exit_2(tmp_path, monkeypatch):
    from test_laws import copied_laws
    path = copied_laws(tmp_path, monkeypatch)
    text = path.read_text(encoding="utf-8")
    start = text.index('[sets.vllm.laws."small"]')
    block = re.search(r'terms = \[(.*)\]\nregimes = \[\[(.*)\]\]', text[start:])
    terms, values = block.group(1).split(", "), block.group(2).split(", ")
    i = terms.index('"sources"')
    shorter = (f'terms = [{", ".join(terms[:i] + terms[i + 1:])}]\n'
               f'regimes = [[{", ".join(values[:i] + values[i + 1:])}]]')
    path.write_text(text[:start] + text[start:].replace(block.group(0), shorter, 1), encoding="utf-8")
    with pytest.raises(UserError, match="lacks the term"):
        load_hardware("h200", "vllm")
    load_hardware("h200", "gpu-suite")  # the other set is whole: it prices
    result = runner.invoke(app, ["step", "--hardware", "h200", "--tp", "8", "--no-interval"])
    assert result.exit_code == 2 and "lacks the term(s) sources" in result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1


def test_vllms_attn_res_streams_under_its_chain_and_the_suites_adds_them(vllm):
    """The law form follows the set's AttnRes kernel (laws.CHAIN_HIDES_STREAM): vLLM's is the larger of its chain
    of source reads and its stream, flat in M until the bytes outrun the chain (its rows: 7.4-8.0 µs from M = 1 to
    64, 22 µs at 512); the GPU suite's adds the two (8.4 µs at M = 1, 17.9 at 256)."""
    suite = load_hardware("h200", "gpu-suite")
    ks = {m: _plan("kimi-k3", "standard", 8, m, 1, 512, "kda").kernel("attn_res_pre") for m in (1, 64, 512)}
    key = laws.LawKey("small", "vllm", "attn_res_pre")
    with_chain = laws.features(ks[1], key, 132, 50e6, {"small": ("vllm",)})
    additive = laws.features(ks[1], key, 132, 50e6, {"small": ("triton",)})
    assert {"chain_t0", "stream_t0", "stream_bytes"} <= set(with_chain) and "t0_attn_res_pre" not in with_chain
    assert {"t0_attn_res_pre", "bytes"} <= set(additive) and "chain_t0" not in additive
    assert _us(ks[64], vllm) == pytest.approx(_us(ks[1], vllm))  # the 47-fold bytes hide under the chain
    assert _us(ks[512], vllm) > 2 * _us(ks[1], vllm)  # ... until they outrun it
    assert _us(ks[64], suite) > _us(ks[1], suite)
