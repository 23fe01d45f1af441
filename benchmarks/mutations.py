"""Plant one-line bugs in a scratch copy of the repository and report which ones the test suite catches.

    python benchmarks/mutations.py            # a table: mutation, file, caught by (first failing test)
    python benchmarks/mutations.py --json     # {"planted", "caught", "caught_only_by_snapshot", "missed", "mutations"}
    python benchmarks/mutations.py --only situ_betas_swapped,rope_direction

A test suite that passes says little until it is shown to fail on the bugs it exists to catch. Each
mutation below is one exact, one-line edit of the source (FLOPs, bytes, a missing read, a stream, a
dependency, a collective size, the math of an op, ...). The working tree is never touched: the files
are copied to a temporary folder, each mutation is applied there, the suite runs there with that
folder first on PYTHONPATH (`-x`: it stops at the first failure, so a caught mutation costs seconds),
and the file is restored. The docs/kernels.md snapshot test is left out of that run; a mutation the
suite misses is then run against the snapshot alone, so "caught only by the snapshot" is reported
apart: a snapshot's message says to regenerate it, which would bless the bug. Target: every mutation
caught, none only by the snapshot.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SNAPSHOT = "tests/test_plans.py::test_kernels_doc_is_current"
# The scratch copy has no .git: tests of the repository tooling that read its history (benchmarks/ab.py
# checks out HEAD) cannot run there, and no mutation touches that tooling.
NEEDS_GIT = ("tests/test_ab_cli.py",)
# The catalogue's own test checks that each mutation's text occurs once: a planted mutation fails it by
# construction, which would count every mutation as caught.
SELF = ("tests/test_mutations.py",)
# Files first that catch most mutations quickly; the rest of the suite follows in its usual order.
FIRST = ["tests/test_golden.py", "tests/test_binding.py", "tests/test_plans.py", "tests/test_layers.py",
         "tests/test_equivalence.py", "tests/test_cost_model.py", "tests/test_timeline.py"]
COPY_IGNORE = shutil.ignore_patterns(".git", ".venv", "build", "dist", "out", "__pycache__", "*.egg-info",
                                     ".pytest_cache")


@dataclass(frozen=True)
class Mutation:
    name: str
    path: str
    old: str
    new: str
    why: str


MUTATIONS = [
    Mutation("gemm_flops_halved", "simulator/ops/linear.py", "    return 2 * m * k * n", "    return m * k * n",
             "every GEMM's FLOPs halved"),
    Mutation("kda_flops_halved", "simulator/ops/kda.py", "    return 7 * M * N * H * H",
             "    return 7 * M * N * H * H // 2", "the delta rule's FLOPs halved"),
    Mutation("attn_res_flops", "simulator/ops/norm.py", "    return 6 * S * M * D", "    return 3 * S * M * D",
             "AttnRes mix FLOPs per source element 6 -> 3"),
    Mutation("mla_decode_flops", "simulator/ops/mla.py", "    return 2 * M * N * S * (2 * L + R)",
             "    return 2 * M * N * S * (L + R)", "MLA decode FLOPs lose the value accumulation"),
    Mutation("shared_down_bytes_halved", "simulator/plans/moe_kernels.py",
             'weights=(weight(f"{prefix}.w_down", F, D, shard="row"),)',
             'weights=(weight(f"{prefix}.w_down", F // 2, D, shard="row"),)',
             "the shared expert's w_down declared at half size"),
    Mutation("mla_cache_read_missing", "simulator/attention/mla.py",
             'reads=(act("mla.qcat", M, Nh, lkv + r, dtype="fp8"), act("mla.cache", B, S, lkv + r, dtype="fp8")),',
             'reads=(act("mla.qcat", M, Nh, lkv + r, dtype="fp8"),),',
             "MLA decode no longer declares the cache it reads"),
    Mutation("expert_padding", "simulator/plans/moe_kernels.py", "STOCK_MIN_EXPERT_SHARD = 256",
             "STOCK_MIN_EXPERT_SHARD = 128", "the stock loader's expert padding 256 -> 128"),
    Mutation("situ_betas_swapped", "simulator/ops/experts.py", "        b1, b2 = cfg.situ_beta, cfg.situ_linear_beta",
             "        b1, b2 = cfg.situ_linear_beta, cfg.situ_beta", "SiTU's two betas swapped"),
    Mutation("router_group_top1", "simulator/ops/router.py", "[..., :2].sum(axis=-1)  # [M, G]",
             "[..., :1].sum(axis=-1)  # [M, G]", "router groups scored by their best expert instead of the best two"),
    Mutation("rope_direction", "simulator/ops/mla.py",
             "[x1 * cos - x2 * sin, x2 * cos + x1 * sin]", "[x1 * cos + x2 * sin, x2 * cos - x1 * sin]",
             "RoPE rotates the other way"),
    Mutation("sigmoid_sign", "simulator/ops/pointwise.py", "    return np.exp(-np.logaddexp(0.0, -x))",
             "    return np.exp(-np.logaddexp(0.0, x))", "the one sigmoid computes sigmoid(-x)"),
    Mutation("kda_gate_bound", "simulator/ops/kda.py",
             "    return float(lower_bound) * sigmoid(np.exp(a_log)[:, None] * zh)",
             "    return float(lower_bound) * sigmoid(a_log[:, None] * zh)",
             "KDA gate uses A_log instead of exp(A_log)"),
    Mutation("latent_down_stream", "simulator/plans/moe_kernels.py",
             'stream="aux", deps=deps, reads=(act("x2", M, D),)', 'stream="main", deps=deps, reads=(act("x2", M, D),)',
             "the stock latent down-projection leaves the aux stream"),
    Mutation("fc1_dependency", "simulator/moe/fused.py",
             'deps = ("latent_down",) if cfg.latent_dim else ()', "deps = ()",
             "FC1 no longer waits for the aux-stream latent it reads"),
    Mutation("shared_overlap_dependency", "simulator/moe/fused.py",
             'stream, deps = ("aux", (x2_from,)) if "shared_overlap" in on else ("main", ())',
             'stream, deps = ("aux", ()) if "shared_overlap" in on else ("main", ())',
             "the overlapped shared expert no longer waits for x2"),
    Mutation("all_reduce_size", "simulator/plans/common.py",
             'collective=Collective("all_reduce", t.nbytes, d.P, algorithms',
             'collective=Collective("all_reduce", t.nbytes // 2, d.P, algorithms',
             "standalone all-reduces carry half their payload"),
    Mutation("router_gather_size", "simulator/plans/moe_kernels.py",
             'collective=Collective("all_gather", sum(t.nbytes for t in shards), P, in_kernel=True)',
             'collective=Collective("all_gather", shards[0].nbytes, P, in_kernel=True)',
             "the split router gathers only the logits"),
    Mutation("pdl_off", "simulator/plans/specialized.py", "    return Launches(every=EARLY if pdl else std.PDL,",
             "    return Launches(every=std.PDL,", "pdl_prefetch no longer reaches most kernels"),
    Mutation("prefetch_half", "simulator/plans/kernel.py",
             '            object.__setattr__(self, "prefetch_bytes", self.weight_bytes)',
             '            object.__setattr__(self, "prefetch_bytes", self.weight_bytes // 2)',
             "prefetch loads half the weights"),
    Mutation("executor_shape_check", "simulator/execute.py",
             "    if tuple(np.shape(value)) != (t.unpadded or t.shape):", "    if False:",
             "the executor stops checking shapes"),
    Mutation("layer_back_edge", "simulator/reference.py", "from simulator.weights import LayerWeights\n",
             "from simulator.weights import LayerWeights\nfrom simulator.execute import run_plan  # noqa: F401\n",
             "the reference imports the executor again"),
    Mutation("topk_family_gemm", "simulator/plans/moe_kernels.py",
             'name="moe_routing_topk", kind="router", family="small",',
             'name="moe_routing_topk", kind="router", family="gemm",',
             "the routing top-k declared a GEMM (its draws take the GEMM residuals)"),
    Mutation("mla_decode_family_kda", "simulator/attention/mla.py",
             'key="mla_decode", name=name, kind="attention", family="mla",',
             'key="mla_decode", name=name, kind="attention", family="kda",', "the MLA decode declared a KDA kernel"),
    Mutation("collective_phase_unfactored", "simulator/cost/uncertainty.py",
             '    comm = "collective" if kernel.collective is not None else None',
             "    comm = None", "a fused kernel's exchange no longer takes the collective residual factor"),
    Mutation("kda_l2_doubled", "simulator/cost/laws.py", "max(0, state + extra - l2_bytes)",
             "max(0, state + extra - 2 * l2_bytes)", "the KDA law lets L2 absorb twice what it holds"),
    Mutation("law_gap_kept", "simulator/cost/pricing.py",
             "    duration = np.maximum(law - hw.launch_gap_us, hw.kernel_fixed_us)",
             "    duration = np.maximum(law, hw.kernel_fixed_us)", "a measured law's launch gap is charged twice"),
    Mutation("law_ranks_extrapolated", "simulator/cost/laws.py",
             "    if role is None or (kernel.collective is not None and kernel.collective.ranks not in kset.ranks):",
             "    if role is None:", "a collective law measured at P = 2 prices P = 8"),
    Mutation("law_pdl_ignored", "simulator/cost/pricing.py",
             "    if not kernel.pdl or (hw.kernel_set is not None and not hw.kernel_set.pdl):",
             "    if not kernel.pdl:", "kernels of a set without PDL still hide their launch gap"),
    Mutation("fast_rms_norm_differs", "simulator/fast/kernels.py", "        inv = 1 / np.sqrt(ss / D + eps)",
             "        inv = 1 / np.sqrt(ss / (D - 1) + eps)",
             "the fast backend's RMSNorm (a registered replacement) divides by D - 1, unlike ops.norm.rms_norm"),
    Mutation("attention_entry_context", "simulator/attention/mla.py",
             'state_elements=state_elements, memory=("mla_cache", "MLA cache", cache_bytes), reads_context=True',
             'state_elements=state_elements, memory=("mla_cache", "MLA cache", cache_bytes), reads_context=False',
             "a wrong attention-registry entry: MLA said not to read the context, so its layers price at context 0"),
    Mutation("deepseek_attn_res_kernel", "simulator/plans/common.py",
             '    return attn_res_pre(d, launch, attn_res_source) if d.attn_res else add_norm(d, "input_norm", launch)',
             "    return attn_res_pre(d, launch, attn_res_source)",
             "a plain-residual model (DeepSeek-V3) opens its layers with an AttnRes kernel"),
    Mutation("kda_fused_beta_dropped", "simulator/ops/kda.py",
             "        delta = sigmoid_exp(beta_logits[:, t])[..., None] * (v - u)  # [B, N, H] = beta (v - S^T k)",
             "        delta = v - u  # [B, N, H] = beta (v - S^T k)",
             "the NumPy fused KDA decode (the op the fast backend replaces) forgets the delta rule's beta"),
    Mutation("fast_kda_key_row", "simulator/fast/kda.py", "            S[i, j] *= alpha[i]",
             "            S[i, j] *= alpha[j]",
             "the compiled fused KDA replacement decays by value column, not key row"),
]


def _bad(message: str) -> None:
    print(message, file=sys.stderr)
    sys.exit(2)


def _parse(argv: list[str]) -> tuple[bool, list[Mutation]]:
    as_json, chosen = False, MUTATIONS
    args = list(argv)
    while args:
        arg = args.pop(0)
        if arg == "--json":
            as_json = True
        elif arg == "--only" and args:
            names = args.pop(0).split(",")
            known = {m.name: m for m in MUTATIONS}
            unknown = [n for n in names if n not in known]
            if unknown:
                _bad(f"--only names unknown mutation '{unknown[0]}'; known: {', '.join(known)}.")
            chosen = [known[n] for n in names]
        else:
            _bad(f"unknown argument '{arg}': use --json and --only NAME[,NAME...].")
    return as_json, chosen


def check_applies(mutation: Mutation, root: Path = ROOT) -> None:
    """Each mutation's `old` text must occur exactly once, so the catalogue stays in step with the code."""
    count = (root / mutation.path).read_text().count(mutation.old)
    if count != 1:
        raise ValueError(f"mutation {mutation.name}: the text to replace occurs {count} times in {mutation.path}")


def _pytest(scratch: Path, args: list[str]) -> tuple[bool, str]:
    env = dict(os.environ, PYTHONPATH=str(scratch) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               PYTHONDONTWRITEBYTECODE="1")
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-W", "ignore", *args]
    run = subprocess.run(cmd, cwd=scratch, env=env, capture_output=True, text=True)
    failed = [line.split(" ")[1] for line in run.stdout.splitlines() if line.startswith(("FAILED ", "ERROR "))]
    last = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else ""
    return run.returncode != 0, (failed[0] if failed else last)


def _suite_files(scratch: Path) -> list[str]:
    rest = sorted(str(p.relative_to(scratch)) for p in (scratch / "tests").glob("test_*.py")
                  if str(p.relative_to(scratch)) not in NEEDS_GIT + SELF)
    return [f for f in FIRST if f in rest] + [f for f in rest if f not in FIRST]


def run(mutations: list[Mutation], progress: bool) -> list[dict]:
    results = []
    with tempfile.TemporaryDirectory(prefix="moe-sim-mutations-") as tmp:
        scratch = Path(tmp) / "repo"
        shutil.copytree(ROOT, scratch, ignore=COPY_IGNORE)
        files = _suite_files(scratch)
        failed, by = _pytest(scratch, ["--deselect", SNAPSHOT, *files])  # the unmutated copy must pass
        if failed:
            raise SystemExit(f"the suite fails without any mutation ({by}); fix that first.")
        for m in mutations:
            check_applies(m, scratch)
            target = scratch / m.path
            original = target.read_text()
            target.write_text(original.replace(m.old, m.new))
            start = time.perf_counter()
            try:
                caught, by = _pytest(scratch, ["--deselect", SNAPSHOT, *files])
                snapshot = False
                if not caught:
                    snapshot, by = _pytest(scratch, [SNAPSHOT])
            finally:
                target.write_text(original)
            verdict = "caught" if caught else ("snapshot only" if snapshot else "missed")
            results.append({"name": m.name, "file": m.path, "why": m.why, "verdict": verdict, "by": by,
                            "seconds": round(time.perf_counter() - start, 1)})
            if progress:
                print(f"  {m.name:28s} {verdict:13s} {by}", file=sys.stderr, flush=True)
    return results


def main(argv: list[str]) -> None:
    as_json, chosen = _parse(argv)
    for m in chosen:
        try:
            check_applies(m)
        except ValueError as e:
            _bad(str(e) + ".")
    results = run(chosen, progress=not as_json)
    summary = {"planted": len(results), "caught": sum(r["verdict"] == "caught" for r in results),
               "caught_only_by_snapshot": sum(r["verdict"] == "snapshot only" for r in results),
               "missed": sum(r["verdict"] == "missed" for r in results), "mutations": results}
    if as_json:
        print(json.dumps(summary, indent=1))
        return
    width = max(len(r["name"]) for r in results)
    print(f"{'mutation':{width}s}  {'verdict':13s}  first failing test")
    for r in results:
        print(f"{r['name']:{width}s}  {r['verdict']:13s}  {r['by']}")
    print(f"planted {summary['planted']}, caught {summary['caught']}, caught only by the snapshot "
          f"{summary['caught_only_by_snapshot']}, missed {summary['missed']}")


if __name__ == "__main__":
    main(sys.argv[1:])
