"""Benchmark two versions of the code against each other, taking turns, on a machine whose speed drifts.

    python benchmarks/ab.py BASE NEW [--rounds N] [--metric KEY ...] [--json] -- COMMAND ...
    python benchmarks/ab.py HEAD~1 . --metric expert_gbps -- python benchmarks/fullsize.py --json

BASE and NEW are git revisions of this repository, or `.` for the working tree as it is (uncommitted
edits included). Each revision other than `.` is checked out in a scratch worktree; every run of COMMAND
happens in its version's directory with PYTHONPATH pointing there (so `import simulator` is that version,
whatever is installed) and a Numba cache of its own (so no version loads the other's compiled kernels).
One untimed run per version first compiles its kernels; then the versions alternate, BASE, NEW, BASE, ...
for N rounds. COMMAND must print a JSON object (the last line that parses as one is read); each --metric
is a key of it, dotted for nested ones; a leading - marks one where lower is better (`--metric=-wall_s.specialized`):
its best is then the smallest.

Why turns: on the shared 2-vCPU machines this project runs on, the same build has read 0.29 and 0.64 of
the copy bandwidth an hour apart, and 5-12 GB/s for one kernel within minutes; a version measured in one
quiet spell against another in a loud one says nothing. Taken in turns, both see the same spells, and
the report gives each version's best (the quiet-spell figure, as STREAM reports) and median, and NEW over
BASE for both. A ratio that moves between runs of this script by more than its gap is not a result.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


class Refused(Exception):
    """Bad input: one sentence for the user, exit code 2."""


def main(argv: list[str] | None = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    try:
        doc = run(args.base, args.new, args.command, args.metric, args.rounds)
    except Refused as e:
        print(f"ab.py: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        _print(doc)
    return 0


def _parse(argv: list[str]) -> argparse.Namespace:
    command: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, command = argv[:cut], argv[cut + 1:]
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("base", help="git revision, or . for the working tree")
    p.add_argument("new", help="git revision, or . for the working tree")
    p.add_argument("--rounds", type=int, default=3, help="turns each version takes after its warm-up (default 3)")
    p.add_argument("--metric", action="append", default=[],
                   help="JSON key to compare, dotted if nested, -KEY where lower is better (repeatable)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    args = p.parse_args(argv)
    if not command:
        p.error("give the command after --, e.g. -- python benchmarks/fullsize.py --json")
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    if not args.metric:
        p.error("name at least one --metric")
    args.command = command
    return args


def run(base: str, new: str, command: list[str], metrics: list[str], rounds: int) -> dict[str, Any]:
    """Both versions' figures for each metric, runs in turns; see the module docstring."""
    scratch = Path(tempfile.mkdtemp(prefix="moe-sim-ab-"))
    trees: list[Path] = []
    try:
        dirs = {}
        for name, ref in (("base", base), ("new", new)):
            if ref == ".":
                dirs[name] = ROOT
            else:
                dirs[name] = scratch / name
                _checkout(ref, dirs[name])
                trees.append(dirs[name])
        caches = {name: scratch / f"numba-{name}" for name in dirs}
        runs: dict[str, list[dict[str, float]]] = {"base": [], "new": []}
        keys = [m.lstrip("-") for m in metrics]
        for name in dirs:  # warm-up: each version compiles its kernels into its own cache
            _figures(_run_once(command, dirs[name], caches[name]), keys)
        for _ in range(rounds):
            for name in ("base", "new"):
                runs[name].append(_figures(_run_once(command, dirs[name], caches[name]), keys))
    finally:
        for tree in trees:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], capture_output=True)
        shutil.rmtree(scratch, ignore_errors=True)
    report: dict[str, Any] = {"base": base, "new": new, "command": command, "rounds": rounds, "metrics": {}}
    for m in metrics:
        key, best = m.lstrip("-"), (min if m.startswith("-") else max)
        a, b = [r[key] for r in runs["base"]], [r[key] for r in runs["new"]]
        report["metrics"][key] = {
            "lower_is_better": m.startswith("-"), "base_runs": a, "new_runs": b,
            "base_best": best(a), "new_best": best(b),
            "base_median": statistics.median(a), "new_median": statistics.median(b),
            "new_over_base_best": _ratio(best(b), best(a)), "new_over_base_median": _ratio(statistics.median(b),
                                                                                           statistics.median(a))}
    return report


def _checkout(ref: str, where: Path) -> None:
    found = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"],
                           capture_output=True, text=True)
    if found.returncode != 0:
        raise Refused(f"'{ref}' is not a git revision of {ROOT} (and not '.', the working tree).")
    made = subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(where), found.stdout.strip()],
                          capture_output=True, text=True)
    if made.returncode != 0:
        raise Refused(f"git could not check out '{ref}': {made.stderr.strip().splitlines()[-1]}")


def _run_once(command: list[str], where: Path, cache: Path) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=str(where), NUMBA_CACHE_DIR=str(cache))
    done = subprocess.run(command, cwd=where, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stderr.strip() or done.stdout.strip()).splitlines()[-1:] or ["no output"]
        raise Refused(f"the command failed in {where} with exit code {done.returncode}: {tail[0]}")
    text = done.stdout
    for start in [i for i, ch in enumerate(text) if ch == "{"][::-1][:200]:  # the last JSON object printed
        try:
            doc = json.loads(text[start:])
        except json.JSONDecodeError:
            continue
        if isinstance(doc, dict):
            return doc
    raise Refused(f"the command printed no JSON object in {where}.")


def _figures(doc: dict[str, Any], metrics: list[str]) -> dict[str, float]:
    out = {}
    for m in metrics:
        value: Any = doc
        for key in m.split("."):
            if not isinstance(value, dict) or key not in value:
                raise Refused(f"the command's JSON has no '{m}'.")
            value = value[key]
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise Refused(f"'{m}' is not a number in the command's JSON.")
        out[m] = float(value)
    return out


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 3) if b else None


def _print(doc: dict[str, Any]) -> None:
    print(f"{doc['new']} against {doc['base']}, {doc['rounds']} turns each after a warm-up: {' '.join(doc['command'])}")
    for m, r in doc["metrics"].items():
        print(f"  {m}: base best {r['base_best']:.4g} median {r['base_median']:.4g} | new best {r['new_best']:.4g} "
              f"median {r['new_median']:.4g} | new/base best {r['new_over_base_best']} "
              f"median {r['new_over_base_median']}")


if __name__ == "__main__":
    sys.exit(main())
