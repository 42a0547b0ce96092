"""Packed documents benchmark: attention time with and without document masking, and
the sequence-parallel halo bytes per rank with and without.

    python benchmarks/bench_documents.py --out results/documents
    python benchmarks/bench_documents.py --seq-len 4096 --repeats 1     # quick

One row of T tokens (default 16,384) packed with documents of log-normal
lengths (mean ``--mean-doc`` = 2,048, log-space std 1, seeded); H = 8 query
and key/value heads, D = 64, fp32, per-head sigma = 1 / ALiBi slope, one
thread. Time: forward + backward, the median of ``--repeats`` passes after a
warm-up, the masked and unmasked calls interleaved so load drifts hit both
alike; each figure is quoted as the ratio masked / unmasked measured side by
side. Halo: the bytes each of ``--sp`` ranks receives per layer in forward
(K and V, bf16, Hkv = 8, D = 128: Qwen3-0.6B's), from the real hash and the
halo exchange, without computing attention: for the timed layout, and averaged
over ``--layouts`` seeded layouts (a saving needs a document start within a
halo's reach of a chunk start, so one layout says little).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path


def document_lengths(seq_len: int, mean: float, seed: int) -> list[int]:
    """Log-normal lengths (log-space std 1, mean ``mean``) filling ``seq_len`` exactly (the last cut)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    mu = np.log(mean) - 0.5  # E[exp(N(mu, 1))] = exp(mu + 1/2)
    lengths, total = [], 0
    while total < seq_len:
        n = max(1, int(round(float(rng.lognormal(mu, 1.0)))))
        n = min(n, seq_len - total)
        lengths.append(n)
        total += n
    return lengths


def _offsets(lengths):
    import torch

    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)


def time_attention(seq_len: int, lengths: list[int], methods: list[str], samples: int, repeats: int) -> dict:
    """Median forward+backward seconds per (method, masked) pair, interleaved."""
    import torch

    from plsh_dist.hashing import alibi_slopes
    from plsh_dist.ops import plsh_attention

    torch.manual_seed(0)
    H, D = 8, 64
    sigma = alibi_slopes(H).reciprocal()
    q, k, v = (torch.randn(1, seq_len, H, D, requires_grad=True) for _ in range(3))
    cu = _offsets(lengths)

    def run(method, masked):
        out = plsh_attention(q, k, v, sigma=sigma, num_samples=samples, seed=0, method=method,
                             cu_seqlens=cu if masked else None)
        out.sum().backward()

    times = {(m, masked): [] for m in methods for masked in (False, True)}
    for key in times:  # warm-up
        run(*key)
    for _ in range(repeats):
        for key in times:
            t0 = time.perf_counter()
            run(*key)
            times[key].append(time.perf_counter() - t0)
    return {f"{m}/{'masked' if masked else 'plain'}": statistics.median(t) for (m, masked), t in times.items()}


def halo_bytes(seq_len: int, lengths: list[int], sp: int, samples: int, layers: int, seed: int) -> dict:
    """Forward halo bytes each rank receives per layer, mean over ``layers`` hashes, with and without documents."""
    import torch

    from plsh_dist.distributed.halo import HaloExchange, plsh_needs
    from plsh_dist.distributed.sp.documents import SPDocuments
    from plsh_dist.distributed.group_chunks import GroupChunks
    from plsh_dist.hashing import PositionalLSH, alibi_slopes
    from plsh_dist.models.runtime import hash_seed

    Hq = Hkv = 8
    per_token = 2 * 128 * 2  # K and V, D = 128, bf16
    sigma = alibi_slopes(Hq).reciprocal()
    T = seq_len // sp
    cu = _offsets(lengths)
    plain, masked = [0] * sp, [0] * sp
    for layer in range(layers):
        lsh = PositionalLSH(sigma, samples, hash_seed(seed, 0, 0, layer))
        for r in range(sp):
            chunks = GroupChunks(None, r, sp, tuple(range(sp)), tuple(i * T for i in range(sp)), T)
            docs = SPDocuments.build(cu, chunks, 1)
            plain[r] += HaloExchange.build(chunks, plsh_needs(lsh, chunks, Hq, Hkv, True)).recv_tokens(1)
            masked[r] += HaloExchange.build(chunks, plsh_needs(lsh, chunks, Hq, Hkv, True, docs)).recv_tokens(1)
    return {"plain": [x * per_token / layers for x in plain], "masked": [x * per_token / layers for x in masked],
            "chunk_starts_document": [int(r * T) in set(cu.tolist()) for r in range(sp)]}


def markdown(res: dict) -> str:
    lines = [
        f"T = {res['seq_len']:,}, {len(res['doc_lengths'])} documents (mean {res['mean_doc']:,}, log-normal, "
        f"seed {res['seed']}), PLSH s = {res['samples']}, per-head sigma, H = 8, D = 64, fp32, 1 thread; "
        f"forward + backward, median of {res['repeats']}.",
        "",
        "| method | plain (s) | document-masked (s) | masked / plain |",
        "|---|---|---|---|",
    ]
    for m in res["methods"]:
        a, b = res["time_s"][f"{m}/plain"], res["time_s"][f"{m}/masked"]
        lines.append(f"| {m} | {a:.2f} | {b:.2f} | {b / a:.2f} |")
    halo = res["halo"]
    many = res["halo_layouts"]
    lines += [
        "",
        f"SP = {res['sp']}: forward halo bytes received per rank per layer (K and V, bf16, Hkv = 8, D = 128; "
        f"mean over {res['layers']} layers' hashes):",
        "",
        f"| rank | timed layout: chunk starts a document | plain | document-masked | mean of {many['count']} "
        "layouts: plain | document-masked |",
        "|---|---|---|---|---|---|",
    ]
    for r in range(res["sp"]):
        lines.append(f"| {r} | {'yes' if halo['chunk_starts_document'][r] else 'no'} | "
                     f"{halo['plain'][r] / 1024:,.1f} KiB | {halo['masked'][r] / 1024:,.1f} KiB | "
                     f"{many['plain'][r] / 1024:,.1f} KiB | {many['masked'][r] / 1024:,.1f} KiB |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seq-len", type=int, default=16384)
    ap.add_argument("--mean-doc", type=int, default=2048)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--methods", default="onepass,per_sample")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sp", type=int, default=4)
    ap.add_argument("--layers", type=int, default=28, help="hashes (layers) averaged for the halo bytes")
    ap.add_argument("--layouts", type=int, default=50, help="seeded document layouts averaged for the halo bytes")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None, help="directory for results.json and results.md")
    args = ap.parse_args(argv)
    if args.seq_len % args.sp:
        ap.error(f"--seq-len {args.seq_len} must be divisible by --sp {args.sp}")
    import torch

    torch.set_num_threads(args.threads)
    lengths = document_lengths(args.seq_len, args.mean_doc, args.seed)
    methods = args.methods.split(",")
    res = dict(seq_len=args.seq_len, mean_doc=args.mean_doc, seed=args.seed, samples=args.samples,
               repeats=args.repeats, methods=methods, sp=args.sp, layers=args.layers, threads=args.threads,
               doc_lengths=lengths)
    print(f"{len(lengths)} documents: {lengths}", flush=True)
    res["halo"] = halo_bytes(args.seq_len, lengths, args.sp, args.samples, args.layers, args.seed)
    per_layout = [halo_bytes(args.seq_len, document_lengths(args.seq_len, args.mean_doc, seed), args.sp, args.samples,
                             args.layers, args.seed) for seed in range(args.layouts)]
    res["halo_layouts"] = {"count": args.layouts, **{
        key: [sum(h[key][r] for h in per_layout) / args.layouts for r in range(args.sp)] for key in ("plain", "masked")
    }}
    res["time_s"] = time_attention(args.seq_len, lengths, methods, args.samples, args.repeats)
    table = markdown(res)
    print(table)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps(res, indent=1))
        (args.out / "results.md").write_text(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
