"""Routing statistics: unique experts touched under uniform, skewed and draft-correlated routing."""

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from simulator.cli import app
from simulator.config import load_model
from simulator.cost.step import build_plan
from simulator.routing import RoutingStats, expected_unique_experts, inclusion_probabilities
from simulator.plans.kernel import DecodeShape

runner = CliRunner()


def test_uniform_is_the_closed_form():
    assert expected_unique_experts(8, 896, 16) == pytest.approx(896 * (1 - (1 - 16 / 896) ** 8))
    assert expected_unique_experts(1, 896, 16, skew=1.2) == pytest.approx(16, rel=1e-9)  # one token: k experts


@pytest.mark.parametrize("skew", [0.5, 1.01, 1.2, 2.0])
def test_inclusion_probabilities_sum_to_k_and_fall_with_rank(skew):
    q = inclusion_probabilities(896, 16, skew)
    assert q.sum() == pytest.approx(16, rel=1e-9) and np.all(q <= 1) and np.all(np.diff(q) <= 0)


@pytest.mark.parametrize("skew", [1.01, 1.2])
@pytest.mark.parametrize("tokens", [8, 64, 256])
def test_skewed_u_matches_sampling_without_replacement(skew, tokens):
    """Monte Carlo: each token's top-16 is a Gumbel top-k of log p (k draws without replacement)."""
    rng = np.random.default_rng(7)
    p = np.arange(1, 897, dtype=np.float64) ** -skew
    logp = np.log(p / p.sum())
    counts = []
    for _ in range(max(12, 4096 // tokens)):
        g = logp[None, :] + rng.gumbel(size=(tokens, 896))
        counts.append(len(np.unique(np.argpartition(-g, 16, axis=1)[:, :16])))
    assert expected_unique_experts(tokens, 896, 16, skew) == pytest.approx(np.mean(counts), rel=0.03)


def test_skew_and_correlation_lower_u_and_the_plan_streams_fewer_expert_bytes():
    cfg = load_model("kimi-k3")
    bytes_of = {}
    for name, routing in {"uniform": RoutingStats(), "skew": RoutingStats(1.2), "corr": RoutingStats(0, 1.0)}.items():
        plan = build_plan(cfg, "specialized", 16, DecodeShape(1, 8, 512, routing), "kda")
        bytes_of[name] = plan.kernel("experts").weight_bytes
    assert bytes_of["skew"] < 0.7 * bytes_of["uniform"]
    experts = build_plan(cfg, "specialized", 16, DecodeShape(1, 1, 512), "kda").kernel("experts")
    assert bytes_of["corr"] == experts.weight_bytes


def test_full_draft_correlation_routes_a_verify_like_one_token():
    assert RoutingStats(0.0, 1.0).free_tokens(4, 8) == 4 and RoutingStats(0.0, 0.0).free_tokens(4, 8) == 32


def test_step_routing_bracket_spans_concentrated_to_uniform():
    r = runner.invoke(app, ["step", "--batch", "8", "--routing-bracket", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    ends = doc["routing_bracket"]
    for v in ("standard", "specialized"):
        assert ends["concentrated"]["variants"][v]["step_ms"] < ends["uniform"]["variants"][v]["step_ms"]
        assert ends["uniform"]["variants"][v]["step_ms"] == doc["variants"][v]["step_ms"]
    assert ends["concentrated"]["expert_skew"] == 1.2


@pytest.mark.parametrize("args", [["--expert-skew", "-1"], ["--expert-skew", "nan"], ["--draft-correlation", "1.5"]])
def test_bad_routing_statistics_are_one_sentence(args):
    r = runner.invoke(app, ["step", *args])
    assert r.exit_code == 2 and "Traceback" not in r.output


def _scenario(tmp_path, kind: str, sweep: str) -> Path:
    path = tmp_path / f"{kind}.toml"
    path.write_text(f'question = "routing in a {kind} sweep"\nkind = "{kind}"\n[base]\nbatch = 4\ntokens_per_seq = 2\n'
                    f'context = 64\ntp = 16\n[sweep]\n{sweep}\n')
    return path


@pytest.mark.parametrize("kind", ["step", "layer", "ablation"])
def test_scenarios_honour_routing_statistics(tmp_path, kind):
    """expert_skew is a scenario key every kind prices (never silently ignored): skew lowers the cost."""
    from simulator.scenario import load_scenario
    from simulator.sweep import run
    rows = run(load_scenario(str(_scenario(tmp_path, kind, "expert_skew = [0.0, 1.2]"))), None)["rows"]
    key = {"step": "step_ms", "layer": "layer_us", "ablation": "specialized_step_ms"}[kind]
    cost = {}
    for r in rows:
        assert r["status"] == "ok", r
        cost[(r["variant"], r.get("fusion"), r["expert_skew"])] = r[key]
    assert len(cost) >= 2 and all(cost[(v, f, 1.2)] < cost[(v, f, 0.0)] for v, f, s in cost if s == 0.0)


@pytest.mark.parametrize("line", ["expert_skew = [5.0]", "draft_correlation = [-0.1]", "expert_skew = [nan]"])
def test_bad_routing_in_a_scenario_is_one_sentence(tmp_path, line):
    from simulator.scenario import load_scenario
    with pytest.raises(Exception) as err:
        load_scenario(str(_scenario(tmp_path, "step", line)))
    assert type(err.value).__name__ == "UserError" and "sweep" in str(err.value)


def test_expected_unique_experts():
    assert expected_unique_experts(1, 896, 16) == pytest.approx(16)
    assert expected_unique_experts(8, 256, 8) == pytest.approx(57.4, abs=0.1)  # sources.md §5.1
    assert expected_unique_experts(10_000, 256, 8) == pytest.approx(256)
