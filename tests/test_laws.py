"""One model of GPU time: the measured laws pricing reads are the laws validate fits, from one function.

The H200 profile's kernel set (simulator/hardware/laws/h200.toml) must be the fit of the committed CSVs;
a plan kernel and the kernel a CSV row measured must get the same regressors; pricing must use the law
where the set has one and the datasheet law where it has none; a bad table is one sentence.
"""

import re
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from simulator.cli import app
from simulator.config import load_model
from simulator.cost import laws
from simulator.cost.measured import _plan, point_kernel
from simulator.cost.pricing import kernel_terms, launch_gap_us, price_kernel
from simulator.cost.timeline import schedule
from simulator.cost.validate import kernel_set_of, law_key, read_measurements, row_law
from simulator.errors import UserError
from simulator.hardware import DATASHEET, load_hardware
from simulator.hardware.kernel_sets import dump_sets, laws_path, load_sets
from simulator.plans.kernel import Collective, DecodeShape, Kernel

ROOT = Path(__file__).resolve().parent.parent
MEASURED = ROOT / "calibration" / "h200"
runner = CliRunner()


@pytest.fixture(scope="module")
def h200():
    return load_hardware("h200", "gpu-suite")


@pytest.fixture(scope="module")
def rows():
    return read_measurements(MEASURED)


def test_the_committed_laws_are_the_fit_of_the_committed_csvs():
    """`moe-sim validate --measurements calibration/h200 --fit` writes exactly the committed table."""
    base = load_hardware("h200", DATASHEET)
    fresh = kernel_set_of(MEASURED, base)
    _, committed = load_sets(laws_path("h200"))
    assert committed[fresh.name] == fresh
    default, _ = load_sets(laws_path("h200"))
    assert dump_sets(base.name, default, committed.values()) == laws_path("h200").read_text(encoding="utf-8")


def test_an_answer_prices_with_the_set_it_names(h200):
    assert h200.kernels == "gpu-suite" and h200.kernel_set is not None
    assert load_hardware("H200", "GPU-Suite").kernel_set == h200.kernel_set  # names are case-insensitive
    default, _ = load_sets(laws_path("h200"))
    assert load_hardware("h200").kernels == default
    import json
    for command in (["step", "--no-interval"], ["layer", "--no-interval"], ["ablation"]):
        doc = json.loads(runner.invoke(app, [*command, "--hardware", "h200", "--tp", "8", "--kernels", "gpu-suite",
                                             "--json"]).output)
        assert doc["kernel_set"] == "gpu-suite", command  # the answer names the set it priced with
    assert load_hardware("gb300").kernels == DATASHEET  # nothing measured on Blackwell: the datasheet law
    with pytest.raises(UserError, match="Unknown kernel set 'sglang'"):
        load_hardware("h200", "sglang")


def test_a_plan_kernel_gets_the_regressors_of_the_kernel_its_row_measured(rows, h200):
    """The law is written once: the row's rebuilt kernel and the plan's own kernel give the same terms."""
    checked = 0
    for r in rows:
        if r["family"] not in ("moe", "small", "kda", "mla") or r["variant"].endswith("sweep"):
            continue
        group, feats = row_law(r, h200)
        kernel = point_kernel(r)
        key = law_key(r)
        assert key.group(kernel) == group
        got = laws.features(kernel, key, h200.sm_count, h200.l2_bytes)
        assert got == feats, r["id"]
        checked += 1
    assert checked > 300


def test_pricing_uses_the_set_law_and_the_datasheet_law_elsewhere(rows, h200):
    row = next(r for r in rows if r["plan_key"] == "fc1" and r["impl"] == "triton_w4a16" and r["M"] == 1)
    fc1 = _plan(row["model"], "standard", row["tp"], 1, 1, 512, row["layer"]).kernel("fc1")
    group, feats = row_law(row, h200)
    law = h200.kernel_set.fit(group).predict(laws.features(fc1, law_key(row), h200.sm_count, h200.l2_bytes))
    cost = price_kernel(fc1, h200)
    assert cost.measured and cost.launch_us + cost.duration_us == pytest.approx(law)
    assert law == pytest.approx(row["measured_us"], rel=0.1)  # the suite's W4A16 kernel, measured at ~59 µs
    datasheet = price_kernel(fc1, load_hardware("h200", DATASHEET))
    assert not datasheet.measured and abs(datasheet.duration_us - cost.duration_us) > 10
    launch, fixed, math_us, comm, _ = kernel_terms(fc1, h200)
    assert launch + fixed + cost.mem_us == pytest.approx(law) and math_us == comm == 0.0


def test_a_set_without_pdl_pays_every_gap_and_prefetches_nothing(h200):
    cfg = load_model("kimi-k3")
    from simulator.cost.step import build_plan
    plan = build_plan(cfg, "specialized", 8, DecodeShape(1, 1, 512), "kda")
    assert any(k.pdl for k in plan) and any(k.prefetch_bytes for k in plan)
    assert all(launch_gap_us(k, h200) == h200.launch_gap_us for k in plan)
    assert all(s.prefetched_bytes == 0 for s in schedule(plan, h200).spans)
    with_pdl = replace(h200, kernel_set=replace(h200.kernel_set, pdl=True))
    assert any(s.prefetched_bytes > 0 for s in schedule(plan, with_pdl).spans)


def test_a_law_is_not_extrapolated_to_rank_counts_it_never_saw(h200):
    def all_reduce(ranks):
        return Kernel("ar", "allreduce", "collective", family="collective",
                      collective=Collective("all_reduce", 7168 * 2, ranks))
    assert h200.kernel_set.ranks == (2,)
    assert price_kernel(all_reduce(2), h200).measured
    assert not price_kernel(all_reduce(8), h200).measured  # P = 8: the datasheet alpha-beta law


def test_an_engine_takes_the_fastest_measured_all_reduce(h200):
    ar = Kernel("ar", "allreduce", "collective", family="collective", collective=Collective("all_reduce", 1 << 20, 2))
    keys = laws.law_keys(ar, h200.kernel_set)
    each = [h200.kernel_set.fit(k.group(ar)).predict(laws.features(ar, k, h200.sm_count, h200.l2_bytes))
            for k in keys]
    assert len(keys) == 3 and laws.law_us(ar, h200.kernel_set, h200.sm_count, h200.l2_bytes) == min(each)


def test_kernels_no_set_measured_fall_back_to_the_datasheet_law(h200):
    cfg = load_model("kimi-k3")
    from simulator.cost.step import build_plan
    plan = build_plan(cfg, "specialized", 8, DecodeShape(1, 1, 512), "kda")
    fused = plan.kernel("oproj_producer")  # a GEMM with an in-kernel all-reduce: nobody measured it
    assert laws.role_of(fused) == (None, "") and not price_kernel(fused, h200).measured
    conv = build_plan(cfg, "standard", 8, DecodeShape(1, 2, 512), "kda").kernel("kda_conv")
    assert laws.law_us(conv, h200.kernel_set, h200.sm_count, h200.l2_bytes) is None  # no floor of its own


BAD_TABLES = [  # (pattern, replacement, words of the one sentence)
    (r"regimes = \[\[[-+0-9.e]+", 'regimes = [["x"', "must be a finite number"),
    (r'(collective/symm_one_shot"\]\nn = \d+\nterms = \["t0", "wire_bytes"\]\nregimes = \[\[)[-+0-9.e]+', r"\g<1>999.0",
     "outside its range"),
    (r'laws\."mla/triton_split_kv"\]', 'laws."attention/triton_split_kv"]', "unknown family 'attention'"),
    (r'laws\."mla/triton_split_kv"\]', 'laws."mla/flashmla"]', "implementation 'flashmla' is not in"),
    (r'"small" = \["triton"\]', '"tiny" = ["triton"]', "unknown role 'tiny'"),
    (r"pdl = false", "pdl = 0", "'pdl' must be true or false"),
    (r'default = "\w+"', 'default = "sglang"', "names no set"),
    (r'hardware = "H200"', 'hardware = "H200', "not valid TOML"),
]


def copied_laws(tmp_path, monkeypatch) -> Path:
    """The H200 laws table copied where the loader will read it instead: its path, to edit."""
    from simulator.hardware import kernel_sets
    laws_dir = tmp_path / "laws"
    shutil.copytree(laws_path("h200").parent, laws_dir)
    monkeypatch.setattr(kernel_sets, "LAWS_DIR", laws_dir)
    return laws_dir / "h200.toml"


@pytest.mark.parametrize("pattern,new,words", BAD_TABLES)
def test_a_bad_laws_table_is_one_sentence_and_exit_2(tmp_path, monkeypatch, pattern, new, words):
    path = copied_laws(tmp_path, monkeypatch)
    bad, n = re.subn(pattern, new, path.read_text(encoding="utf-8"), count=1)
    assert n == 1
    path.write_text(bad, encoding="utf-8")
    with pytest.raises(UserError, match=words):
        load_hardware("h200")
    result = runner.invoke(app, ["step", "--hardware", "h200", "--tp", "8", "--no-interval"])
    assert result.exit_code == 2 and words.split("'")[0] in result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1


def test_a_table_missing_a_constant_is_refused(tmp_path, monkeypatch):
    path = copied_laws(tmp_path, monkeypatch)
    text = path.read_text(encoding="utf-8")
    start = text.index('[sets.gpu-suite.laws."mla/triton_split_kv"]')
    line = re.search(r"regimes = \[\[(.*)\]\]", text[start:])
    shorter = line.group(0).replace(line.group(1), line.group(1).rsplit(",", 1)[0])
    path.write_text(text[:start] + text[start:].replace(line.group(0), shorter, 1), encoding="utf-8")
    with pytest.raises(UserError, match="one constant per term"):
        load_hardware("h200")


def test_validate_fit_writes_the_set_and_says_where(tmp_path, monkeypatch):
    from simulator.hardware import kernel_sets
    monkeypatch.setattr(kernel_sets, "LAWS_DIR", tmp_path / "laws")
    result = runner.invoke(app, ["validate", "--measurements", str(MEASURED), "--fit"])
    assert result.exit_code == 0, result.output
    written = tmp_path / "laws" / "h200.toml"
    said = " ".join(result.output.split())  # rich wraps at the terminal's width
    assert f"to {written}" in result.output.replace("\n", "")
    assert "'gpu-suite' is the fit of these CSVs: model and refit are one law" in said
    _, sets = load_sets(written)
    assert sets["gpu-suite"] == load_sets(laws_path("h200"))[1]["gpu-suite"]


def test_intervals_draw_from_the_residuals_of_the_law_that_prices():
    """An answer priced with a measured set takes its interval's family factors from that set's own
    residuals (the held-back errors of those very laws); families it did not measure, and GPUs without a
    set, keep the gpu-suite laws' residuals."""
    from simulator.cost.uncertainty import load_residuals, residuals_of
    base = load_residuals()
    vllm = load_hardware("h200", "vllm")
    own = {fam: fitted for fam, fitted, _ in vllm.kernel_set.residuals}
    res = residuals_of(vllm)
    assert own["mla"] and res.fitted["mla"] == own["mla"] != base.fitted["mla"]
    assert own["collective"] and res.fitted["collective"] == own["collective"]  # the suite's rows it borrows
    assert "ceiling" not in own and res.fitted["ceiling"] == base.fitted["ceiling"]
    assert residuals_of(load_hardware("gb300")) == base
    assert residuals_of(load_hardware("h200", DATASHEET)) == base


@pytest.mark.parametrize("batch", [1, 64])
def test_the_suite_layers_take_what_the_measured_laws_say(batch):
    """Issue 29: the suite's own graph captures of the standard KDA layer (TP8), priced with the laws fitted
    to the same kernels measured back to back: the layer makespan within 10 % (the datasheet law was 51 %
    and 79 % short). The laws describe these kernels launched plainly: no PDL, no prefetch."""
    import json
    trace = ROOT / "tests" / "data" / "traces" / f"suite-graph-b{batch}t1.json.gz"
    args = [str(trace), "--hardware", "h200", "--tp", "8", "--batch", str(batch), "--tokens-per-seq", "1",
            "--engine", "gpu-suite", "--json"]
    measured = json.loads(runner.invoke(app, ["compare-trace", *args, "--kernels", "gpu-suite"]).output)
    datasheet = json.loads(runner.invoke(app, ["compare-trace", *args, "--kernels", "datasheet"]).output)
    assert measured["kernel_set"] == "gpu-suite" and measured["matched"] == 19
    span = measured["makespan_us"]
    assert abs(span["model"] / span["measured"] - 1) < 0.10, span
    assert datasheet["makespan_us"]["model"] < 0.6 * span["measured"]
    # per launch (idle gap + duration) the kernels agree too; a duration alone does not, since a profiler
    # counts the launch ramp inside a kernel and the model charges it with the gap PDL can hide
    assert measured["median_abs_launch_error_pct"] < 10.0 < measured["median_abs_pct_error"]
    # the replay ran on one stream: the model serialises the plan's side stream the same way, and each
    # kernel is held to its family's 90 % interval (a 90 % interval leaves about one kernel in ten out)
    assert measured["model_streams"].startswith("one stream")
    got = measured["inside_family_interval"]
    assert got["checked"] == 19 and got["inside"] >= 14, [
        (k["plan"], k["launch_error_pct"], k["interval_pct"]) for k in measured["kernels"] if not k["inside_interval"]]


def test_the_split_k_rule_is_the_launch_count_cublas_chose():
    """`splits_k` predicts the second (reducing) launch from the shape alone; the CSVs recorded how many
    launches each measured GEMM made. 60 of the 62 distinct shapes agree (N = 6288 and 16160 at M = 1 run
    unsplit), and a rule with the thresholds moved by a factor two misses many more."""
    import csv
    seen = {}
    for path in (MEASURED / "gemm.csv", MEASURED / "production" / "gemm.csv"):
        with path.open() as f:
            for r in csv.DictReader(f):
                if r["status"] == "ok" and r["launches"] and r["impl"] == "torch_matmul":
                    seen[(int(r["M"]), int(r["K"]), int(r["N"]))] = int(r["launches"]) == 2
    wrong = [shape for shape, split in seen.items() if laws.splits_k(*shape) != split]
    assert len(seen) >= 60 and len(wrong) <= 0.05 * len(seen), wrong
    moved = [s for s, split in seen.items() if (s[0] * s[2] <= 2 * laws.SPLIT_K_OUTPUT and s[1] >= laws.SPLIT_K_DEPTH)
             != split]
    assert len(moved) > 3 * max(1, len(wrong))


def test_flashmla_streams_the_cache_once_per_64_query_rows():
    """FlashMLA holds 64 query rows (tokens x heads) per program: 8 tokens x 16 heads is two row blocks and
    two passes over the cache, 8 x 6 one; the suite's Triton kernel is one pass at any row count."""
    def feats(heads_model, tp, t, impl):
        kernel = _plan(heads_model, "standard", tp, 64, t, 8192 - t, "mla").kernel("mla_decode")
        return laws.features(kernel, laws.LawKey("mla", impl), 132, 50e6)["cache_bytes"], kernel.hbm_bytes
    two, raw = feats("deepseek-v3", 8, 8, "flashmla_fp8")
    assert two == 2 * raw
    one, raw = feats("kimi-k3", 16, 8, "flashmla_fp8")
    assert one == raw
    assert feats("deepseek-v3", 8, 8, "triton_split_kv")[0] == feats("deepseek-v3", 8, 8, "triton_split_kv")[1]
