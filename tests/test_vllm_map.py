"""docs/vllm_k3_map.toml (the launches vLLM 0.33.0 makes for a Kimi K3 layer) held against moe-sim's plans.

Every configuration's launches are the plan's kernels one for one (count_delta = 0): each launch names the
plan kernel that does its work, and that kernel cites the launch's source function. Where a stream or PDL
still differs the configuration lists an open difference that docs/vllm-k3-source.md explains. When a plan
changes, these tests say which map entries (or which differences) no longer hold.
"""

import re
import tomllib
from pathlib import Path

import pytest

from simulator.config import load_model
from simulator.plans import specialized, standard
from simulator.plans.kernel import DecodeShape

ROOT = Path(__file__).resolve().parents[1]
MAP = tomllib.loads((ROOT / "docs" / "vllm_k3_map.toml").read_text())
DOC = (ROOT / "docs" / "vllm-k3-source.md").read_text()
LAUNCH_FIELDS = {"name": str, "source": str, "stream": str, "pdl": (bool, str), "prefetch": str, "collective": str,
                 "reads": str, "writes": str, "plan_keys": list, "external": bool}
CONFIG_FIELDS = {"path", "layer", "tp", "batch", "tokens_per_seq", "launches", "differences", "count_delta"}
STREAMS = {"main": "main", "aux": "aux", "attn_aux": "aux", "prefetch": "prefetch"}  # map stream -> plan stream
SOURCE = re.compile(r"^vllm/[\w/]+\.py:[A-Za-z_][\w.]*")
BUILD = {"standard": standard.build, "specialized": specialized.build}


def config_id(cfg: dict) -> str:
    return f"{cfg['path']}-{cfg['layer']}-tp{cfg['tp']}-{cfg['batch']}x{cfg['tokens_per_seq']}"


def plan_of(cfg: dict, model):
    shape = DecodeShape(batch=cfg["batch"], tokens_per_seq=cfg["tokens_per_seq"], context=1024)
    return BUILD[cfg["path"]](model, cfg["tp"], shape, cfg["layer"])


def cover_problems(cfg: dict, plan, launches: dict) -> list[str]:
    """What breaks 'the source launches do exactly the plan's kernels': plan kernels no launch does, plan
    keys a launch names that the plan lacks, and a count_delta that is not the actual difference."""
    keys = [k.key for k in plan.kernels]
    done = {key for lid in cfg["launches"] for key in launches[lid]["plan_keys"]}
    problems = [f"plan kernel {k} is done by no source launch" for k in keys if k not in done]
    problems += [f"a launch names {k}, which the plan does not have" for k in sorted(done - set(keys))]
    delta = len(cfg["launches"]) - len(keys)
    if delta != cfg["count_delta"]:
        problems.append(f"count_delta {cfg['count_delta']} but {len(cfg['launches'])} launches - "
                        f"{len(keys)} kernels = {delta}")
    if delta != 0 and not cfg["differences"]:
        problems.append("the counts differ and no difference is listed")
    return problems


def one_to_one(cfg: dict, launches: dict):
    """(launch id, plan key) where the launch does exactly one plan kernel and no other launch of the
    configuration does it: the pairs whose stream and PDL can be compared."""
    owners: dict[str, list[str]] = {}
    for lid in cfg["launches"]:
        for key in launches[lid]["plan_keys"]:
            owners.setdefault(key, []).append(lid)
    for lid in cfg["launches"]:
        keys = launches[lid]["plan_keys"]
        if len(keys) == 1 and owners[keys[0]] == [lid]:
            yield lid, keys[0]


def excused(cfg: dict, key: str) -> bool:
    return any(key in MAP["difference"][d]["plan_keys"] for d in cfg["differences"])


def test_meta_names_the_wheel():
    assert MAP["meta"]["vllm"] == "0.33.0" and MAP["meta"]["wheel"].startswith("vllm-0.33.0-")
    assert MAP["meta"]["wheel"] in DOC  # the doc's "how this was read" names the same wheel


@pytest.mark.parametrize("lid", sorted(MAP["launch"]))
def test_launch_entries_are_complete(lid):
    entry = MAP["launch"][lid]
    assert set(entry) == set(LAUNCH_FIELDS), f"{lid}: fields {sorted(entry)}"
    for field, kind in LAUNCH_FIELDS.items():
        assert isinstance(entry[field], kind), f"{lid}.{field} = {entry[field]!r}"
    assert entry["stream"] in STREAMS, f"{lid}: stream {entry['stream']!r}"
    assert entry["pdl"] in (True, False, "unknown"), f"{lid}: pdl {entry['pdl']!r}"
    assert SOURCE.match(entry["source"]), f"{lid}: source {entry['source']!r} is not 'vllm/<path>.py:<function>'"
    assert entry["name"] and all(isinstance(k, str) for k in entry["plan_keys"])
    assert len(entry["plan_keys"]) == 1, f"{lid}: one launch, one plan kernel"
    if entry["stream"] == "prefetch":  # an L2 prefetch is the plan's L2 prefetch launch
        assert entry["plan_keys"][0].startswith("l2_prefetch_"), lid


def test_configs_are_well_formed_and_everything_is_used():
    seen, used_launches, used_diffs = set(), set(), set()
    for cfg in MAP["config"]:
        assert CONFIG_FIELDS <= set(cfg) <= CONFIG_FIELDS | {"note"}, config_id(cfg)
        assert cfg["path"] in BUILD and cfg["layer"] in ("kda", "mla") and cfg["tp"] in (8, 16), config_id(cfg)
        assert config_id(cfg) not in seen, f"{config_id(cfg)} twice"
        seen.add(config_id(cfg))
        for lid in cfg["launches"]:
            assert lid in MAP["launch"], f"{config_id(cfg)}: unknown launch {lid}"
            assert lid.startswith("std." if cfg["path"] == "standard" else "sp."), f"{config_id(cfg)}: {lid}"
        for d in cfg["differences"]:
            assert d in MAP["difference"], f"{config_id(cfg)}: unknown difference {d}"
            assert MAP["difference"][d]["path"] == cfg["path"], f"{config_id(cfg)}: {d} is about the other path"
            assert MAP["difference"][d]["status"] == "open", f"{config_id(cfg)}: {d} is resolved"
        used_launches |= set(cfg["launches"])
        used_diffs |= set(cfg["differences"])
    assert not set(MAP["launch"]) - used_launches, "launches no configuration uses"
    # a difference no configuration lists must say it is about configurations outside the map
    for d in set(MAP["difference"]) - used_diffs:
        assert not MAP["difference"][d]["plan_keys"], f"difference {d} is listed by no configuration"


def test_map_covers_the_published_and_tp8_configurations():
    have = {(c["path"], c["layer"], c["tp"], c["batch"], c["tokens_per_seq"]) for c in MAP["config"]}
    want = {(p, layer, tp, b, t) for p in BUILD for layer in ("kda", "mla")
            for tp, b, t in [(16, 1, 8), (16, 1, 1)] + [(8, b, 1) for b in (*range(1, 9), 16, 32, 64)]}
    assert want <= have, sorted(want - have)


@pytest.mark.parametrize("cfg", MAP["config"], ids=config_id)
def test_source_launches_do_the_plans_kernels(cfg, k3):
    assert cover_problems(cfg, plan_of(cfg, k3), MAP["launch"]) == []
    assert cfg["count_delta"] == 0, "the plan launches what the source launches"


@pytest.mark.parametrize("cfg", MAP["config"], ids=config_id)
def test_each_plan_kernel_cites_the_function_that_launches_it(cfg, k3):
    """One launch, one kernel, in host issue order: the kernel's `source` is the launch's function."""
    plan = plan_of(cfg, k3)
    wrong = []
    for lid, kernel in zip(cfg["launches"], plan.kernels):
        entry = MAP["launch"][lid]
        if entry["plan_keys"] != [kernel.key]:
            wrong.append(f"{lid} is plan kernel {entry['plan_keys']}, the plan launches {kernel.key} there")
        if not SOURCE.fullmatch(kernel.source) or kernel.source != SOURCE.match(entry["source"]).group(0):
            wrong.append(f"{kernel.key} cites {kernel.source!r}, the map {entry['source']!r}")
    assert wrong == []


@pytest.mark.parametrize("path", sorted(BUILD))
@pytest.mark.parametrize("layer", ["kda", "mla"])
@pytest.mark.parametrize("tp, batch, tokens",
                         [(16, 1, 8), (16, 1, 1)] + [(8, b, 1) for b in (*range(1, 9), 16, 32, 64)])
def test_every_kernel_cites_its_source_function(path, layer, tp, batch, tokens, k3):
    plan = plan_of({"path": path, "layer": layer, "tp": tp, "batch": batch, "tokens_per_seq": tokens}, k3)
    assert [k.key for k in plan.kernels if not SOURCE.fullmatch(k.source)] == []


@pytest.mark.parametrize("cfg", MAP["config"], ids=config_id)
def test_streams_and_pdl_agree_unless_a_difference_says_why(cfg, k3):
    kernels = {k.key: k for k in plan_of(cfg, k3).kernels}
    wrong = []
    for lid, key in one_to_one(cfg, MAP["launch"]):
        entry, kernel = MAP["launch"][lid], kernels[key]
        if excused(cfg, key):
            continue
        if STREAMS[entry["stream"]] != kernel.stream:
            wrong.append(f"{lid} runs on {entry['stream']}, plan {key} on {kernel.stream}")
        if isinstance(entry["pdl"], bool) and entry["pdl"] != kernel.pdl:
            wrong.append(f"{lid} pdl={entry['pdl']}, plan {key} pdl={kernel.pdl}")
    assert wrong == []


def test_the_published_specialized_count_is_the_sources():
    """published.md: 13 specialized kernels per layer; at the configuration docs/cost-model.md assumes
    (KDA + MoE, TP16, 1 x 8) the source launches 13, two of them L2 prefetches on a side stream."""
    cfg = next(c for c in MAP["config"] if config_id(c) == "specialized-kda-tp16-1x8")
    streams = [MAP["launch"][lid]["stream"] for lid in cfg["launches"]]
    assert len(streams) == 13 and streams.count("prefetch") == 2
    assert [k.stream for k in plan_of(cfg, load_model("kimi-k3")).kernels].count("prefetch") == 2


def test_every_difference_is_in_the_doc_table():
    table = set(re.findall(r"^\| \*\*([SP]\d+)\*\* \|", DOC, flags=re.M))
    assert table == set(MAP["difference"])
    assert all(d["status"] in ("open", "resolved") for d in MAP["difference"].values())


def test_the_cover_check_can_fail(k3):
    """Dropping the launch that alone does a plan kernel, or naming a kernel the plan lacks, is caught."""
    cfg = next(c for c in MAP["config"] if config_id(c) == "specialized-kda-tp16-1x8")
    plan = plan_of(cfg, k3)
    lid = next(lid for lid, _ in one_to_one(cfg, MAP["launch"]))
    dropped = dict(cfg, launches=[x for x in cfg["launches"] if x != lid], count_delta=cfg["count_delta"] - 1)
    assert any("done by no source launch" in p for p in cover_problems(dropped, plan, MAP["launch"]))
    launches = dict(MAP["launch"], extra=dict(MAP["launch"][lid], plan_keys=["mla_decode"]))
    added = dict(cfg, launches=cfg["launches"] + ["extra"], count_delta=cfg["count_delta"] + 1)
    assert any("mla_decode" in p for p in cover_problems(added, plan, launches))


def test_the_pattern_table_names_every_launch_the_map_lists():
    """compare-trace's vllm-k3 engines have a pattern for every plan kernel of their variant in every map
    configuration, and that pattern matches the launch's name as the source gives it (external launches are
    named inside FlashInfer / TRT-LLM: the map describes them instead)."""
    from simulator.report.trace_patterns import load_engine
    engines = {"standard": load_engine("vllm-k3"), "specialized": load_engine("vllm-k3-specialized")}
    missing, unmatched = set(), set()
    for cfg in MAP["config"]:
        patterns = engines[cfg["path"]].patterns
        for lid in cfg["launches"]:
            key = MAP["launch"][lid]["plan_keys"][0]
            if key not in patterns:
                missing.add(key)
            elif MAP["launch"][lid]["external"]:  # named inside FlashInfer / TRT-LLM: the map describes it
                continue
            elif not any(p.search(name.strip()) for p in patterns[key]
                         for name in MAP["launch"][lid]["name"].split(" / ")):
                unmatched.add(lid)
    assert missing == set() and unmatched == set()
