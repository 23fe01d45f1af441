"""Part B: collectives on two GPUs of one host, NCCL and symmetric memory, under torchrun.

    torchrun --nproc-per-node 2 benchmarks/gpu/suite.py --part B --out DIR

impl                 op per launch                                              n_bytes (bf16)
nccl_all_reduce      dist.all_reduce(x)                                         x, per rank
nccl_reduce_scatter  dist.reduce_scatter_tensor(out[n/P], x[n])                 the full input x
nccl_all_gather      dist.all_gather_into_tensor(out[n*P], x[n])                this rank's shard x
symm_one_shot        torch.ops.symm_mem.one_shot_all_reduce(x_symm, "sum", g)   x, per rank
symm_two_shot        torch.ops.symm_mem.two_shot_all_reduce_(x_symm, "sum", g)  x, per rank

Method: per point each rank captures `reps` (32) back-to-back ops in one CUDA graph, replays it
`replays` (20) times with a barrier before each replay, timed with CUDA events; per-op time = replay / reps.
Each rank's median / p10 / p90 are all-gathered; the row carries the MAX over ranks (the collective is
as slow as its slowest rank) and DIR/collective_skew.csv the rank skew (max - min of the per-rank
medians) with the per-rank medians. Rank 0 appends each row to DIR/collective.csv as soon as the point
is done (rows.write_row, same columns as the other families), so a hung teardown loses nothing.

NVLink multicast (NVLS) stays OFF: the environment variables below are set at import, before
torch.distributed initialises, and no multimem op is ever called. Symmetric-memory ops that do not
exist or fail (first point of each impl) mark every point of that impl "unsupported: <reason>".
First thing: a 1 GiB GPU0 -> GPU1 copy, its bandwidth printed and written to DIR/p2p.txt.
"""

from __future__ import annotations

import json
import os
import statistics
import time
import traceback
from pathlib import Path
from typing import Any, Callable

for _k, _v in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ.setdefault(_k, _v)

REPS, REPLAYS = 32, 20
NVLINK_MIN_GBPS = 200.0
SYMM_IMPLS = ("symm_one_shot", "symm_two_shot")
NCCL_IMPLS = ("nccl_all_reduce", "nccl_reduce_scatter", "nccl_all_gather")
SKEW_FIELDS = ["id", "impl", "n_bytes", "skew_us", "rank_medians_us"]
_SYMM_BACKEND: list[str] = []  # set once per process


class Unsupported(Exception):
    """This impl cannot run here (missing API, or it failed on its first point): not a measurement error."""


def shapes(impl: str, n_bytes: int, world: int) -> tuple[int, int]:
    """(input, output) bf16 elements per rank for a point's per-rank payload n_bytes."""
    n = n_bytes // 2
    if impl == "nccl_reduce_scatter":
        if n % world:
            raise ValueError(f"reduce-scatter input of {n} elements does not split over {world} ranks")
        return n, n // world
    if impl == "nccl_all_gather":
        return n, n * world
    if impl in ("nccl_all_reduce",) + SYMM_IMPLS:
        return n, n
    raise ValueError(f"unknown collective impl {impl!r}")


def make_op(impl: str, torch: Any, dist: Any, n_bytes: int, device: Any) -> Callable[[], Any]:
    """The op of one launch, on buffers allocated here (bf16, filled so sums stay finite)."""
    world = dist.get_world_size()
    n_in, n_out = shapes(impl, n_bytes, world)
    if impl in SYMM_IMPLS:
        return _symm_op(impl, torch, dist, n_in, device)
    x = torch.ones(n_in, device=device, dtype=torch.bfloat16)
    if impl == "nccl_all_reduce":
        return lambda: dist.all_reduce(x)
    out = torch.empty(n_out, device=device, dtype=torch.bfloat16)
    if impl == "nccl_reduce_scatter":
        return lambda: dist.reduce_scatter_tensor(out, x)
    return lambda: dist.all_gather_into_tensor(out, x)


def _symm_op(impl: str, torch: Any, dist: Any, n: int, device: Any) -> Callable[[], Any]:
    if getattr(device, "type", str(device)) != "cuda":
        raise Unsupported("symmetric memory needs CUDA devices")
    try:
        import torch.distributed._symmetric_memory as symm_mem
    except ImportError as exc:
        raise Unsupported(f"no torch.distributed._symmetric_memory ({exc})") from exc
    op_name = "one_shot_all_reduce" if impl == "symm_one_shot" else "two_shot_all_reduce_"
    for attr in ("empty", "rendezvous"):
        if not hasattr(symm_mem, attr):
            raise Unsupported(f"symm_mem.{attr} missing in torch {torch.__version__}")
    if not hasattr(torch.ops.symm_mem, op_name):
        raise Unsupported(f"torch.ops.symm_mem.{op_name} missing in torch {torch.__version__}")
    group_name = dist.group.WORLD.group_name
    if hasattr(symm_mem, "set_backend") and not _SYMM_BACKEND:  # the native CUDA (P2P) backend, not NVSHMEM
        try:
            symm_mem.set_backend("CUDA")
            _SYMM_BACKEND.append("CUDA")
        except Exception as exc:  # noqa: BLE001 - keep the default backend
            _SYMM_BACKEND.append(f"default ({type(exc).__name__})")
    if hasattr(symm_mem, "enable_symm_mem_for_group"):  # needed before torch 2.8, deprecated no-op after
        try:
            symm_mem.enable_symm_mem_for_group(group_name)
        except Exception:  # noqa: BLE001 - newer torch warns or refuses; rendezvous below decides
            pass
    buf = symm_mem.empty(n, device=device, dtype=torch.bfloat16)
    symm_mem.rendezvous(buf, group_name)
    buf.fill_(1.0)
    op = getattr(torch.ops.symm_mem, op_name)  # one_shot returns a new tensor, two_shot reduces in place
    return lambda: op(buf, "sum", group_name)


def time_op_cuda(torch: Any, dist: Any, op: Callable[[], Any], reps: int = REPS, replays: int = REPLAYS) -> list[float]:
    """Per-op µs of each replay of a graph of `reps` ops, a barrier before each replay."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):  # warm-up outside the graph (communicator set-up, symm-mem handshakes)
            op()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for _ in range(reps):
            op()
    torch.cuda.synchronize()
    dist.barrier()
    graph.replay()  # upload
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        dist.barrier()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0 / reps)
    torch.cuda.synchronize()
    dist.barrier()
    del graph
    return times


def time_op_host(torch: Any, dist: Any, op: Callable[[], Any], reps: int = REPS, replays: int = REPLAYS) -> list[float]:
    """CPU stand-in of time_op_cuda (gloo tests of the host-side logic): eager ops, wall clock."""
    op()
    times = []
    for _ in range(replays):
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(reps):
            op()
        times.append((time.perf_counter() - t0) * 1e6 / reps)
    dist.barrier()
    return times


def _percentile(values: list[float], q: float) -> float:
    from harness import percentile
    return percentile(values, q)


def summarise(per_rank: list[list[float]]) -> dict:
    """per_rank[r] = [median, p10, p90] of rank r -> the row's numbers (max over ranks) and the skew."""
    medians = [r[0] for r in per_rank]
    return {"median_us": max(medians), "p10_us": max(r[1] for r in per_rank), "p90_us": max(r[2] for r in per_rank),
            "skew_us": max(medians) - min(medians), "rank_medians_us": " ".join(f"{m:.3f}" for m in medians)}


def p2p_check(torch: Any, out_dir: Path) -> str:
    """1 GiB copy GPU0 -> GPU1, best of 5 after a warm-up; says whether it looks like NVLink."""
    if torch.cuda.device_count() < 2:
        msg = f"p2p: only {torch.cuda.device_count()} GPU visible, no GPU0 -> GPU1 copy"
    else:
        n = 1 << 30
        src = torch.empty(n, dtype=torch.uint8, device="cuda:0").fill_(1)
        dst = torch.empty(n, dtype=torch.uint8, device="cuda:1")
        peer = torch.cuda.can_device_access_peer(0, 1)
        dst.copy_(src)
        torch.cuda.synchronize(0)
        torch.cuda.synchronize(1)
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            dst.copy_(src)
            torch.cuda.synchronize(0)
            torch.cuda.synchronize(1)
            best = min(best, time.perf_counter() - t0)
        gbps = n / best / 1e9
        verdict = "NVLink-class" if gbps >= NVLINK_MIN_GBPS else f"below {NVLINK_MIN_GBPS:.0f} GB/s: NO NVLink path?"
        msg = f"p2p: 1 GiB GPU0 -> GPU1 in {best * 1e3:.3f} ms = {gbps:.1f} GB/s (peer access {peer}); {verdict}"
        del src, dst
        torch.cuda.empty_cache()
    print(msg, flush=True)
    (out_dir / "p2p.txt").write_text(msg + "\n")
    return msg


def _write_skew(path: Path, row: dict) -> None:
    from rows import append_row
    append_row(path, row, SKEW_FIELDS)


def _agree(torch: Any, dist: Any, device: Any, ok: bool) -> bool:
    """True when every rank says ok (MIN over ranks), so all ranks skip or run a point together."""
    flag = torch.tensor([1 if ok else 0], dtype=torch.int32, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def run_distributed(points: list, out_dir: Path, budget_s: float, *, backend: str = "nccl", reps: int = REPS,
                    replays: int = REPLAYS) -> int:
    """Measure `points` (family collective) on WORLD_SIZE ranks; rank 0 writes the rows. Returns 0."""
    import torch
    import torch.distributed as dist
    from rows import ENV_FIELDS, write_row
    out_dir = Path(out_dir)
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_RANK", str(rank)))
    cuda = backend == "nccl"
    if cuda:
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
    t0 = time.time()
    if rank == 0:
        out_dir.mkdir(parents=True, exist_ok=True)
        env = _environment(torch, cuda)
        env.update(world_size=world, **{k: os.environ.get(k, "") for k in (
            "NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS")})
        if cuda:
            env["p2p"] = p2p_check(torch, out_dir)
        (out_dir / "env_B.json").write_text(json.dumps(env, indent=2))
        print(json.dumps(env), flush=True)
    else:
        env = {}
    init = {"backend": backend}
    if cuda:
        init["device_id"] = device
    try:
        dist.init_process_group(**init)
    except TypeError:  # a torch without device_id
        init.pop("device_id", None)
        dist.init_process_group(**init)
    unsupported: dict[str, str] = {}
    worked: set[str] = set()
    base_timer = time_op_cuda if cuda else time_op_host

    def timer(torch: Any, dist: Any, op: Callable[[], Any]) -> list[float]:
        return base_timer(torch, dist, op, reps, replays)

    try:
        for i, p in enumerate(points):
            go = torch.tensor([1 if time.time() - t0 <= budget_s else 0], dtype=torch.int32, device=device)
            dist.broadcast(go, src=0)  # rank 0's clock decides for everyone
            if not go.item():
                if rank == 0:
                    print(f"budget of {budget_s:.0f} s spent: stopping before point {i} of {len(points)}", flush=True)
                break
            res = _measure_point(p, torch, dist, device, timer, unsupported, world, worked)
            if res["status"] == "ok":
                res.update(reps=reps, replays=replays)
            if rank == 0:
                row = {**p.row(), **{k: env.get(k, "") for k in ENV_FIELDS}, **res}
                write_row(out_dir / "collective.csv", row)
                if "skew_us" in res:
                    _write_skew(out_dir / "collective_skew.csv", {"id": p.id, "impl": p.impl, "n_bytes": p.n_bytes,
                                                                 **res})
                print(f"[{time.time() - t0:6.1f}s] {p.id}: {res.get('median_us', '-')} us "
                      f"skew {res.get('skew_us', '-')} {res['status']}", flush=True)
    finally:
        try:
            dist.barrier()
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - the rows are written; a teardown error must not fail the run
            traceback.print_exc()
    return 0


def _measure_point(p: Any, torch: Any, dist: Any, device: Any, timer: Callable, unsupported: dict, world: int,
                   worked: set) -> dict:
    """One point on every rank; all ranks agree (MIN of an ok flag) after set-up and after timing, so
    they skip or go on together. A symm impl that fails before it has ever worked is marked unsupported
    for the rest of the run; any other failure is that point's error."""
    if p.P != world:
        return {"status": f"error: point wants P={p.P} ranks, running on {world}"}
    if p.impl in unsupported:
        return {"status": f"unsupported: {unsupported[p.impl]}"[:300]}
    err, op, times = None, None, None
    try:
        op = make_op(p.impl, torch, dist, p.n_bytes, device)
    except Exception as exc:  # noqa: BLE001
        if not isinstance(exc, Unsupported):
            traceback.print_exc()
        err = str(exc) if isinstance(exc, Unsupported) else f"{type(exc).__name__}: {exc}"
    if _agree(torch, dist, device, err is None):
        try:
            times = timer(torch, dist, op)
        except Exception as exc:  # noqa: BLE001
            traceback.print_exc()
            err = f"{type(exc).__name__}: {exc}"
        if not _agree(torch, dist, device, times is not None):
            err = err or "another rank failed while timing"
    else:
        err = err or "another rank failed to set this point up"
    if err is not None:
        if p.impl in SYMM_IMPLS and p.impl not in worked:
            unsupported[p.impl] = err
            return {"status": f"unsupported: {err}"[:300]}
        return {"status": f"error: {err}"[:300]}
    worked.add(p.impl)
    mine = torch.tensor([statistics.median(times), _percentile(times, 0.1), _percentile(times, 0.9)],
                        dtype=torch.float64, device=device)
    gathered = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(gathered, mine)
    res = summarise([g.tolist() for g in gathered])
    res.update(status="ok", launches=1)
    return res


def _environment(torch: Any, cuda: bool) -> dict:
    if cuda:
        from harness import environment
        return environment(torch)
    return {"gpu": "cpu (gloo test)", "driver": "", "torch": torch.__version__, "triton": ""}
