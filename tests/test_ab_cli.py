"""benchmarks/ab.py: two versions run in turns, each in its own directory, PYTHONPATH and Numba cache."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
AB = [sys.executable, str(ROOT / "benchmarks" / "ab.py")]
# prints which cache it was given (1.0 base, 2.0 new) and whether `import simulator` is its own directory's
PROBE = ("import json, os, pathlib, simulator; print('noise')\n"
         "print(json.dumps({'cache': 1.0 if os.environ['NUMBA_CACHE_DIR'].endswith('numba-base') else 2.0, "
         "'own': {'tree': float(pathlib.Path(simulator.__file__).parents[1] == pathlib.Path.cwd())}}))")


def test_versions_take_turns_in_their_own_tree_and_cache(tmp_path):
    probe = tmp_path / "probe.py"  # a script outside the tree: its own folder comes first on sys.path, not the cwd
    probe.write_text(PROBE)
    done = subprocess.run(AB + ["HEAD", ".", "--rounds", "2", "--metric", "cache", "--metric=-own.tree", "--json",
                                "--", sys.executable, str(probe)], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    cache, own = doc["metrics"]["cache"], doc["metrics"]["own.tree"]
    assert cache["base_runs"] == [1.0, 1.0] and cache["new_runs"] == [2.0, 2.0]
    assert cache["new_over_base_best"] == 2.0 and cache["new_over_base_median"] == 2.0
    assert own["lower_is_better"] and own["base_runs"] == own["new_runs"] == [1.0, 1.0]
    listed = subprocess.run(["git", "-C", str(ROOT), "worktree", "list"], capture_output=True, text=True).stdout
    assert "moe-sim-ab-" not in listed  # the scratch worktree is gone


def test_bad_input_is_one_sentence_and_exit_2():
    for extra, words in ((["no-such-rev", ".", "--metric", "x"], "not a git revision"),
                         ([".", ".", "--metric", "missing"], "has no 'missing'")):
        done = subprocess.run(AB + extra + ["--rounds", "1", "--", sys.executable, "-c", "print('{\"x\": 1}')"],
                              capture_output=True, text=True, cwd=ROOT)
        assert done.returncode == 2 and words in done.stderr
        assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
