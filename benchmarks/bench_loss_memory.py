"""Peak memory of the LM head + loss: plain (full logits) vs chunked, on CPU.

    python benchmarks/bench_loss_memory.py --seq-len 16384 --vocab 32000 --hidden 1024 --chunks 0,1024,2048,4096

Each cell runs in its own process (one thread): final hidden states
``h (seq_len, hidden)`` and an LM head weight ``W (vocab, hidden)`` exist
first, then the loss's forward + backward runs: plain = ``F.linear(h, W)``
then ``token_loss_sums`` (the model's path without a ``ChunkedLossHead``),
chunk c = ``chunked_cross_entropy_sums(h, W, labels, chunk_tokens=c)``.
Reported: the loss's share, i.e. the peak of live torch CPU bytes allocated
during forward + backward (``peak_cpu_bytes``: logits, softmax, gradients
dh and dW included; the inputs excluded), and the growth of the process's
peak RSS over what it held before (the OS view, allocator caching included).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _measure(seq_len: int, vocab: int, hidden: int, chunk: int) -> dict:
    """One cell, in this process."""
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(1)
    from plsh_dist.plan.memory_measure import peak_cpu_bytes, peak_rss_bytes, rss_bytes
    from plsh_dist.train.chunked_ce import chunked_cross_entropy_sums
    from plsh_dist.train.losses import token_loss_sums

    def loss(h, w, y):
        if chunk == 0:
            return token_loss_sums(F.linear(h, w)[None], y[None])[0]
        return chunked_cross_entropy_sums(h, w, y, chunk_tokens=chunk)[0]

    g = torch.Generator().manual_seed(0)
    small = [torch.randn(64, hidden, generator=g, requires_grad=True),
             torch.randn(vocab, hidden, generator=g, requires_grad=True), torch.randint(0, vocab, (64,), generator=g)]
    loss(*small).backward()  # warm-up: kernels and allocator paths touched once
    del small
    h = (torch.randn(seq_len, hidden, generator=g) * 0.5).requires_grad_()
    w = (torch.randn(vocab, hidden, generator=g) * 0.02).requires_grad_()
    y = torch.randint(0, vocab, (seq_len,), generator=g)
    rss_before = rss_bytes()

    def step():
        out = loss(h, w, y)
        out.backward()
        return float(out)

    value, peak = peak_cpu_bytes(step)
    return {"chunk_tokens": chunk, "loss": value, "peak_mib": peak / 2**20,
            "rss_growth_mib": max(0, peak_rss_bytes() - rss_before) / 2**20}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seq-len", type=int, default=16384, help="tokens of one rank's micro-batch (B x T_local)")
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--chunks", default="0,1024,2048,4096", help="comma list; 0 = the plain path")
    ap.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    ap.add_argument("--cell", type=int, default=None, help=argparse.SUPPRESS)  # internal: run one cell
    args = ap.parse_args(argv)
    if args.cell is not None:
        print(json.dumps(_measure(args.seq_len, args.vocab, args.hidden, args.cell)))
        return

    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    rows = []
    for chunk in (int(c) for c in args.chunks.split(",")):
        cmd = [sys.executable, __file__, "--seq-len", str(args.seq_len), "--vocab", str(args.vocab),
               "--hidden", str(args.hidden), "--cell", str(chunk)]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    plain = next((r for r in rows if r["chunk_tokens"] == 0), None)
    print(f"seq_len {args.seq_len}, vocab {args.vocab}, hidden {args.hidden}, fp32, CPU, 1 thread")
    print("| loss | peak (MiB) | / plain | RSS growth (MiB) | loss value |")
    print("|---|---|---|---|---|")
    for r in rows:
        name = "plain (full logits)" if r["chunk_tokens"] == 0 else f"chunked, {r['chunk_tokens']} tokens"
        ratio = f"{r['peak_mib'] / plain['peak_mib']:.3f}" if plain else "-"
        print(f"| {name} | {r['peak_mib']:.0f} | {ratio} | {r['rss_growth_mib']:.0f} | {r['loss']:.4f} |")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"seq_len": args.seq_len, "vocab": args.vocab, "hidden": args.hidden,
                                        "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
