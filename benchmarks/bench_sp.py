"""Sequence-parallel attention benchmark on CPU: P processes, gloo.

Per (P, T): time of one forward + backward (median of ``--repeats``, each the
slowest rank's time) and K/V bytes moved per rank (forward + backward, the
op's own counters from ``plsh_dist.distributed.comm_stats``), for

- ``plsh``: positional LSH, per-head sigma = 1 / ALiBi slope, s samples, halo;
- ``alibi``: exact ALiBi, all-gather K/V + reduce-scatter dK/dV (O(T) per rank).

Exact ALiBi is O(T^2): above ``--alibi-time-max-len`` only its traffic is
measured, by running the op's own two collectives without the attention
compute (the bytes do not depend on the compute).

    python benchmarks/bench_sp.py --seq-lens 16384 65536 --worlds 2 4 --out runs/bench_sp.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


from plsh_dist.distributed.comm_stats import comm_stats, reset_comm_stats
from plsh_dist.distributed.sp import attention as sp_attention
from plsh_dist.distributed.sp.alibi_allgather import all_gather_kv, reduce_scatter_kv
from plsh_dist.distributed.sp_chunks import sp_positions
from plsh_dist.distributed.group_chunks import exchange_chunks
from plsh_dist.hashing import alibi_slopes

_KV = ("fwd_sent_bytes", "fwd_recv_bytes", "bwd_sent_bytes", "bwd_recv_bytes")


def _parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seq-lens", type=int, nargs="+", default=[16384, 65536], help="global sequence lengths T")
    p.add_argument("--worlds", type=int, nargs="+", default=[2, 4], help="SP group sizes (processes)")
    p.add_argument("--heads", type=int, default=8, help="query = key/value heads H")
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--samples", type=int, default=8, help="PLSH samples s")
    p.add_argument("--repeats", type=int, default=3, help="timed forward+backward runs (median reported)")
    p.add_argument("--alibi-repeats", type=int, default=None,
                   help="timed runs of exact ALiBi (default --repeats; it is O(T^2), so 1 fits slow machines)")
    p.add_argument("--alibi-time-max-len", type=int, default=16384,
                   help="time exact ALiBi only up to this T (traffic is measured for every T)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per process")
    p.add_argument("--out", type=Path, default=Path("runs/bench_sp.json"))
    args = p.parse_args(argv)
    for T in args.seq_lens:
        for P in args.worlds:
            if T % P:
                p.error(f"--seq-lens {T} is not divisible by world size {P}")
    return args


def _kv_bytes() -> dict[str, int]:
    s = comm_stats()
    return {k: s[k] for k in _KV}


def _time_op(op, q, k, v, dout, repeats, **kw) -> tuple[list[float], dict[str, int]]:
    times, traffic = [], {}
    for _ in range(repeats):
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        dist.barrier()
        reset_comm_stats()
        t0 = time.perf_counter()
        op(*leaves, **kw).backward(dout)
        elapsed = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        traffic = _kv_bytes()
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # a step waits for the slowest rank
        times.append(float(elapsed))
    return times, traffic


def _alibi_traffic_only(k, v, pos, H) -> dict[str, int]:
    """The all-gather baseline's own collectives, without its O(T^2) compute."""
    reset_comm_stats()
    chunks = exchange_chunks(dist.group.WORLD, pos, {"bench": 0})
    kv_all = all_gather_kv(chunks, k, v)
    reduce_scatter_kv(chunks, kv_all[0], kv_all[1])
    return _kv_bytes()


def _worker(rank: int, world: int, init_file: str, cfg: dict, result_file: str) -> None:
    os.environ["OMP_NUM_THREADS"] = str(cfg["threads"])
    torch.set_num_threads(cfg["threads"])
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    H, D = cfg["heads"], cfg["head_dim"]
    slopes = alibi_slopes(H)
    rows = []
    for T in cfg["seq_lens"]:
        g = torch.Generator().manual_seed(1000 * world + rank)
        q, k, v, dout = (torch.randn(1, T // world, H, D, generator=g) for _ in range(4))
        pos = sp_positions(T, rank, world)
        modes = {
            "plsh": (sp_attention.plsh_attention, dict(group=dist.group.WORLD, sigma=slopes.reciprocal(),
                                                       num_samples=cfg["samples"], seed=0)),
            "alibi": (sp_attention.alibi_attention, dict(group=dist.group.WORLD, slopes=slopes)),
        }
        for mode, (op, kw) in modes.items():
            timed = mode == "plsh" or T <= cfg["alibi_time_max_len"]
            if timed:
                repeats = cfg["repeats"] if mode == "plsh" else cfg["alibi_repeats"]
                times, traffic = _time_op(op, q, k, v, dout, repeats, positions=pos, **kw)
            else:
                times, traffic = [], _alibi_traffic_only(k, v, pos, H)
            per_rank = [None] * world
            dist.all_gather_object(per_rank, traffic)
            if rank == 0:
                rows.append({
                    "world": world, "T": T, "mode": mode, "times_s": times,
                    "median_s": statistics.median(times) if times else None,
                    "recv_bytes_per_rank": [r["fwd_recv_bytes"] + r["bwd_recv_bytes"] for r in per_rank],
                    "sent_bytes_per_rank": [r["fwd_sent_bytes"] + r["bwd_sent_bytes"] for r in per_rank],
                    "fwd_recv_bytes_per_rank": [r["fwd_recv_bytes"] for r in per_rank],
                })
                print(f"[bench_sp] P={world} T={T} {mode}: {rows[-1]['median_s']} s, "
                      f"max recv {max(rows[-1]['recv_bytes_per_rank']) / 2**20:.2f} MiB/rank", flush=True)
    if rank == 0:
        Path(result_file).write_text(json.dumps(rows))
    dist.destroy_process_group()


def _table(rows: list[dict]) -> str:
    by_key = {(r["world"], r["T"], r["mode"]): r for r in rows}
    lines = [
        "| P | T | PLSH fwd+bwd (s) | all-gather ALiBi fwd+bwd (s) | PLSH K/V moved per rank (MiB, max) "
        "| all-gather K/V moved per rank (MiB, max) | PLSH / all-gather traffic |",
        "|---|---|---|---|---|---|---|",
    ]
    for (P, T, mode), r in sorted(by_key.items()):
        if mode != "plsh":
            continue
        a = by_key[(P, T, "alibi")]
        moved = lambda x: max(s + rv for s, rv in zip(x["sent_bytes_per_rank"], x["recv_bytes_per_rank"]))  # noqa: E731
        fmt = lambda t: "not timed" if t is None else f"{t:.2f}"  # noqa: E731
        lines.append(
            f"| {P} | {T} | {fmt(r['median_s'])} | {fmt(a['median_s'])} | {moved(r) / 2**20:.2f} "
            f"| {moved(a) / 2**20:.2f} | {100 * moved(r) / moved(a):.2f}% |"
        )
    return "\n".join(lines)


def main(argv=None) -> None:
    args = _parse(argv)
    cfg = {k: getattr(args, k) for k in ("seq_lens", "heads", "head_dim", "samples", "repeats",
                                         "alibi_repeats", "alibi_time_max_len", "threads")}
    cfg["alibi_repeats"] = cfg["alibi_repeats"] or cfg["repeats"]
    print(f"[bench_sp] {cfg}, worlds {args.worlds}, fp32, batch 1, causal", flush=True)
    rows = []
    for world in args.worlds:
        with tempfile.TemporaryDirectory() as tmp:
            result = os.path.join(tmp, "rows.json")
            mp.spawn(_worker, args=(world, os.path.join(tmp, "rdzv"), cfg, result), nprocs=world, join=True)
            rows += json.loads(Path(result).read_text())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"config": cfg, "worlds": args.worlds, "rows": rows}, indent=1))
    print(_table(rows))
    print(f"[bench_sp] wrote {args.out}")


if __name__ == "__main__":
    main()
