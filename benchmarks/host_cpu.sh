#!/usr/bin/env bash
# The full-size layer (benchmarks/fullsize.py) on another machine's CPU: a lent GPU host, whose 16 server
# cores are not the 2 shared vCPUs of the development VM. Run from the repository root; results go to
# $OUT (default ./host_cpu_out), one file per run, written as each run ends.
#
#   OUT=/tmp/x [ROUNDS=2] bash benchmarks/host_cpu.sh [WHEELS_DIR]
#
# WHEELS_DIR: numba and llvmlite wheels to install into /tmp/site first, for a host whose Numba is older
# than pyproject.toml's floor (numba_ext.py needs >= 0.68). Each run: batch 1, KDA + MoE layer, TP16,
# 5 repeats; bf16 and fp64 on two cores pinned (taskset 0,1: the VM's core count) and on all cores; the
# whole set ROUNDS times (default 1; files of round 2 on end in _r2), to see how far runs move.
set -u
OUT=${OUT:-host_cpu_out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} NUMBA_CACHE_DIR=/tmp/moe-sim-numba PYTHONUNBUFFERED=1
if ! python3 -c 'import numba, sys; sys.exit(tuple(map(int, numba.__version__.split(".")[:2])) < (0, 68))' \
        2>/dev/null && [ -n "${1:-}" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "$1"/numba-*.whl \
        "$1"/llvmlite-*.whl && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
{ lscpu; nproc; free -g; python3 -c 'import numba, numpy, llvmlite; print("numba", numba.__version__,
  "numpy", numpy.__version__, "llvmlite", llvmlite.__version__)'; } > "$OUT/env.txt" 2>&1
cores=$(nproc)
for round in $(seq 1 "${ROUNDS:-1}"); do
    tag=""
    [ "$round" -gt 1 ] && tag="_r$round"
    for precision in bf16 fp64; do
        for threads in 2 "$cores"; do
            pin=""
            [ "$threads" = 2 ] && pin="taskset -c 0,1"
            name="${precision}_${threads}t$tag"
            NUMBA_NUM_THREADS=$threads timeout 200 $pin python3 benchmarks/fullsize.py --precision "$precision" \
                --repeats 5 --json > "$OUT/$name.json" 2> "$OUT/$name.err"
            echo "$name: rc=$?" >> "$OUT/env.txt"
        done
    done
done
python3 - "$OUT" <<'PY'
import json, pathlib, sys
for f in sorted(pathlib.Path(sys.argv[1]).glob("*.json")):
    try:
        d = json.loads(f.read_text())
    except ValueError:
        print(f"{f.name}: no JSON (see {f.stem}.err)")
        continue
    print(f"{f.stem}: {d['threads']} threads, {d['precision']}, wall {d['wall_s']}; copy {d['copy_gbps']} GB/s, read "
          f"{d['read_gbps']} (copy/read {d.get('copy_vs_read')}); routed experts {d.get('expert_gbps')} GB/s = "
          f"{d.get('expert_vs_copy')} of the copy, {d.get('expert_vs_read')} of a read; grouped products "
          f"{d.get('expert_calls_vs_copy')} of the copy; specialized {d['specialized_vs_standard']}x standard")
PY
