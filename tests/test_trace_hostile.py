"""compare-trace against hostile files (tests/hostile_traces.py): one sentence, exit 2, no traceback, names
cut to a readable length; and what the reader still takes (a UTF-8 BOM, gzip members, long names, prefill
layers beside decode ones), the engine it detects, the progress bar of a large file."""

from __future__ import annotations

import gzip
import io
import json
import re
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

import hostile_traces as ht
from simulator.cli import app
from simulator.report import trace_reader, trace_source
from simulator.report.trace_compare import engine_names
from simulator.report.trace_reader import read_kernels

runner = CliRunner()
SCALE = 0.01  # the big cases at 1/100 of their size, the limits they hit lowered to match
CASES = ht.cases(SCALE)
MAX_LINE = 400  # a refusal with a 50-million-character name in it must still be a readable line


@pytest.fixture
def small_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trace_source, "MAX_TEXT_BYTES", 4 << 20)  # the 10 MB bomb passes it
    monkeypatch.setattr(trace_reader, "MAX_VALUE_CHARS", 256 << 10)  # the 500k-character name passes it
    monkeypatch.setattr(trace_reader, "CHUNK_CHARS", 64 << 10)  # (a value inside the first chunk is not measured)
    monkeypatch.setattr(trace_reader, "MAX_NAMES", 500)  # the 1,000 distinct names pass it


def _refusal(path: Path, *extra: str) -> str:
    r = runner.invoke(app, ["compare-trace", str(path), *ht.ARGS, *extra])
    assert r.exit_code == 2, (r.exit_code, r.output[-600:], r.exception)
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in r.output, r.output[:600]
    return lines[0]


def test_the_sweep_has_at_least_25_cases() -> None:
    assert len(CASES) >= 25


@pytest.mark.parametrize("case", list(CASES))
def test_hostile_file_is_one_readable_sentence_and_exit_2(tmp_path: Path, case: str, small_limits: None) -> None:
    writer, words = CASES[case]
    path = writer(tmp_path / f"{case}.json")
    line = _refusal(path)
    assert words in line, line
    assert len(line) < MAX_LINE and line.isprintable(), line[:MAX_LINE]


def test_json_mode_refuses_the_same_way(tmp_path: Path) -> None:
    path = CASES["negative-dur"][0](tmp_path / "neg.json")
    assert "-5 µs" in _refusal(path, "--json")


# ============================================================================ what is still read


def _kernels(path: Path) -> list:
    return read_kernels(path).kernels


def test_utf8_bom_and_gzip_members_read_like_the_plain_file(tmp_path: Path) -> None:
    plain = tmp_path / "t.json"
    text = json.dumps(ht.doc())
    plain.write_text(text)
    bom = tmp_path / "bom.json"
    bom.write_bytes(b"\xef\xbb\xbf" + text.encode())
    members = tmp_path / "two.json.gz"  # `cat a.gz b.gz`: one text, two gzip members
    members.write_bytes(gzip.compress(text[:1000].encode()) + gzip.compress(text[1000:].encode()))
    assert _kernels(bom) == _kernels(plain) == _kernels(members) and len(_kernels(plain)) == 4 * len(ht.LAYER)


def test_long_names_are_kept_cut_and_shown_cut(tmp_path: Path) -> None:
    long = "nvjet_tst_" + "x" * 10_000
    path = tmp_path / "long.json"
    path.write_text(json.dumps(ht.doc([ht.kernel(long, 1.0, 1.0)])))
    (k,) = _kernels(path)
    assert len(k.name) == trace_reader.MAX_NAME_CHARS and k.name.startswith("nvjet_tst_xxx")
    assert trace_reader.short("a\nb\x1b[0m" + "c" * 100) == "a\\nb\\x1b[0m" + "c" * 46 + "..."


def test_one_long_value_is_parsed_in_doubling_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A value longer than the buffer is retried with twice the text, not one chunk more: O(n) not O(n^2)."""
    path = tmp_path / "long.json"
    path.write_text(json.dumps(ht.doc([ht.kernel("k" * 1_000_000, 1.0, 1.0)])))
    reads = []
    real = trace_source.TextSource.read
    monkeypatch.setattr(trace_source.TextSource, "read", lambda self, n: reads.append(n) or real(self, n))
    monkeypatch.setattr(trace_reader, "CHUNK_CHARS", 1024)
    assert len(_kernels(path)) == 1
    assert len(reads) < 20, len(reads)  # 1 MB in 1 kB chunks would be ~1,000 reads


def test_prefill_layers_beside_decode_ones_are_left_out(tmp_path: Path) -> None:
    prefill = ht.events(2, extra=(("BatchPrefillWithRaggedKVCacheKernel<128>", 30.0),), start=1000.0)
    decode = ht.events(4, start=5000.0)
    path = tmp_path / "both.json"
    path.write_text(json.dumps(ht.doc(prefill + decode)))
    r = runner.invoke(app, ["compare-trace", str(path), *ht.ARGS, "--json"])
    assert r.exit_code == 0, r.output[-600:]
    doc = json.loads(r.output)
    assert doc["layers_found"] == 4 and doc["step"]["left_out_layer_shapes"] >= 1
    assert "a prefill step" in doc["step"]["left_out_because"][0]
    assert not any("Prefill" in k["measured"] for k in doc["kernels"])


def test_recorded_gemm_tokens_of_the_decode_batch_pass(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps(ht.doc(ht._gemm_ops(8) + ht.events())))
    r = runner.invoke(app, ["compare-trace", str(path), *ht.ARGS, "--json"])
    assert r.exit_code == 0, r.output[-600:]
    assert json.loads(r.output)["step"]["tokens_per_forward"] == {"most_common": 8, "max": 8, "expected": 8,
                                                                 "padded": 8}


def test_progress_bar_on_a_large_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "t.json"
    path.write_text(json.dumps(ht.doc()))
    monkeypatch.setattr(trace_source, "PROGRESS_BYTES", 100)
    out = io.StringIO()
    read_kernels(path, Console(file=out, force_terminal=True, width=100))
    assert "reading t.json" in out.getvalue()
    quiet = io.StringIO()
    read_kernels(path, Console(file=quiet, force_terminal=False))  # a pipe: no bar
    monkeypatch.setattr(trace_source, "PROGRESS_BYTES", 50_000_000)
    read_kernels(path, Console(file=out, force_terminal=True))
    assert quiet.getvalue() == ""


# ============================================================================ the engine, detected


def test_engine_is_detected_and_said(tmp_path: Path) -> None:
    path = tmp_path / "mini.json"
    path.write_text(json.dumps(ht.doc()))
    r = runner.invoke(app, ["compare-trace", str(path), *ht.ARGS, "--json"])
    doc = json.loads(r.output)
    assert doc["engine"] == "torch-mini" == doc["engine_detected"]["chosen"]
    ranking = doc["engine_detected"]["ranking"]
    assert ranking[0]["fit"] > ranking[1]["fit"] and {r["engine"] for r in ranking} <= set(engine_names())
    table = runner.invoke(app, ["compare-trace", str(path), *ht.ARGS], env={"COLUMNS": "200"})
    assert "engine torch-mini detected from the kernel names" in table.output


def test_a_named_engine_that_does_not_fit_names_the_closest(tmp_path: Path) -> None:
    path = tmp_path / "mini.json"
    path.write_text(json.dumps(ht.doc()))
    line = _refusal(path, "--engine", "moe-sim")
    assert "matches the 'moe-sim' patterns" in line and "the closest engine is 'torch-mini'" in line


def test_help_lists_every_engine_of_the_table() -> None:
    r = runner.invoke(app, ["compare-trace", "--help"])
    assert r.exit_code == 0
    text = re.sub(r"-\s+", "-", " ".join(r.output.split()))  # help wraps at 80 columns, also inside "vllm-stock"
    engines = engine_names()
    assert "gpu-suite" in engines and all(name in text for name in engines)


# ============================================================================ limits, lowered to be reached


def test_too_many_kernels_and_too_much_text_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "t.json"
    path.write_text(json.dumps(ht.doc()))
    monkeypatch.setattr(trace_reader, "MAX_KERNELS", 10)
    assert "over 10 GPU kernel events" in _refusal(path)
    monkeypatch.setattr(trace_reader, "MAX_KERNELS", 2_000_000)
    monkeypatch.setattr(trace_source, "MAX_TEXT_BYTES", 1000)
    assert "over the" in _refusal(path) and "profile fewer decode steps" in _refusal(path)


def test_a_trace_with_no_layer_boundary_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from simulator.report import trace_layers
    path = tmp_path / "t.json"
    path.write_text(json.dumps(ht.doc(ht.events(3))))
    monkeypatch.setattr(trace_layers, "MAX_LAYER_KERNELS", 2)  # every layer (8 kernels) is now too long
    assert "do not split into layers" in _refusal(path, "--engine", "torch-mini")


def test_long_top_level_values_are_skipped_not_kept(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    path.write_text(json.dumps(ht.doc(big=["x" * 100] * 1000, small={"a": 1})))
    trace = read_kernels(path)
    assert trace.metadata == {"small": {"a": 1}} and len(trace.kernels) == 4 * len(ht.LAYER)


def test_a_user_table_with_no_engine_for_the_layer_is_one_sentence(tmp_path: Path) -> None:
    path = tmp_path / "mini.json"
    path.write_text(json.dumps(ht.doc()))
    table = tmp_path / "mla-only.toml"
    table.write_text('[engine.mla-only]\nplan_keys = ["mla_decode"]\n'
                     '[engine.mla-only.patterns]\nmla_decode = ["mla"]\n')
    line = _refusal(path, "--patterns", str(table))  # the KDA layer has no mla_decode
    assert "no engine of the pattern table fits" in line and "no other engine for this layer type" in line


def test_a_small_gzip_of_a_large_text_draws_the_bar(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The bar is for slow reads: a .gz is judged by the text size its trailer states, not its own size."""
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(json.dumps(ht.doc()).encode()))
    monkeypatch.setattr(trace_source, "PROGRESS_BYTES", path.stat().st_size + 1)  # the file is under, its text over
    out = io.StringIO()
    read_kernels(path, Console(file=out, force_terminal=True, width=100))
    assert "reading t.json.gz" in out.getvalue()


def test_a_trace_of_many_processes_is_searched_in_its_busiest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """10,000 one-kernel processes before one real GPU: the layer is found among the busiest processes only."""
    from simulator.report import trace_layers
    monkeypatch.setattr(trace_layers, "MAX_PROCESSES", 1)  # only the busiest: the real GPU, listed last
    noise = [{**ht.kernel("nvjet_noise", 10.0 * i, 1.0), "pid": 1000 + i} for i in range(10_000)]
    path = tmp_path / "many.json"
    path.write_text(json.dumps(ht.doc(noise + ht.events())))
    r = runner.invoke(app, ["compare-trace", str(path), *ht.ARGS, "--engine", "torch-mini", "--json"])
    assert r.exit_code == 0, r.output[-600:]
    doc = json.loads(r.output)
    assert doc["layers_found"] == 4 and doc["matched"] == 8
