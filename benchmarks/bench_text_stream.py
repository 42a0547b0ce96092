"""Peak memory of reading and tokenising a large plain-text file, by how it is cut into documents.

    python benchmarks/bench_text_stream.py                    # 50 MB and 500 MB files
    python benchmarks/bench_text_stream.py --sizes-mb 50 1000 --stages read

Writes synthetic files (about 4 KB documents of made-up words) to a temporary
directory, removed at the end, in three layouts: ``separator`` (one line,
documents joined by ``<|endoftext|>``, read with ``doc_separator``), ``line``
(a document per line, ``sample_by="line"``) and ``document`` (one line with
no separator: the file is one document). Each case runs in a fresh process
that reports its peak resident memory (``VmHWM``) and its memory before
reading (after imports; the tokenizer loaded): the difference is what the
reading took. ``read`` only iterates over the documents (``iter_documents``);
``tokenize`` writes the token cache as training does (``build_token_stream``).
``datasets`` runs the ``datasets`` text builder, the reader used before, for
comparison (it has no separator mode). The target: peak RSS of the largest
file within 1.2x that of the smallest, for ``line`` and ``separator``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SEP = "<|endoftext|>"
LAYOUTS = ("separator", "line", "document")


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def _block(rng: random.Random, n_docs: int = 256) -> list[str]:
    """About 1 MB of documents (~4 KB each) of made-up words."""
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9))) for _ in range(2000)]
    docs = []
    for _ in range(n_docs):
        n = rng.randint(500, 900)
        docs.append(" ".join(rng.choice(words) for _ in range(n)).capitalize() + ".")
    return docs


def write_file(path: Path, layout: str, size_mb: int, seed: int = 0) -> None:
    """``size_mb`` MB (10^6 bytes) of documents in ``layout``; one line unless ``layout == "line"``."""
    docs = _block(random.Random(seed))
    joiner = {"separator": SEP, "line": "\n", "document": " "}[layout]
    block = (joiner.join(docs) + joiner).encode()
    target = size_mb * 1_000_000
    with open(path, "wb") as f:
        written = 0
        while written < target:
            piece = block[: target - written]
            f.write(piece)
            written += len(piece)


def run_case(layout: str, stage: str, path: str, tokenizer: str, out: str) -> dict:
    """One case, in this process: returns peak and before-reading RSS in MiB, seconds, documents."""
    from plsh_dist.data.sources import iter_documents
    from plsh_dist.data.token_cache import build_token_stream
    from plsh_dist.data.tokenizer import Tokenizer

    tok = Tokenizer.load(tokenizer)
    import datasets  # noqa: F401  (imported before the baseline: iter_documents imports it too)

    kwargs = {"separator": {"doc_separator": SEP}, "line": {"sample_by": "line"}, "document": {}}[layout]
    before = _status_kb("VmRSS")
    start = time.perf_counter()
    if stage == "datasets":
        docs = (r["text"] for r in datasets.load_dataset("text", data_files=[path], split="train", streaming=True,
                                                          sample_by=kwargs.get("sample_by", "document")))
        n = sum(1 for _ in docs)
    elif stage == "read":
        n = sum(1 for _ in iter_documents(path, **kwargs))
    else:
        stream = build_token_stream(iter_documents(path, with_location=True, **kwargs), tok, out, "bench", 1)
        n = stream.num_docs
    seconds = time.perf_counter() - start
    return {"peak_mib": _status_kb("VmHWM") / 1024, "before_mib": before / 1024, "seconds": seconds, "docs": n}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes-mb", type=int, nargs="+", default=[50, 500])
    parser.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=LAYOUTS)
    parser.add_argument("--stages", nargs="+", default=["read", "tokenize", "datasets"],
                        choices=["read", "tokenize", "datasets"])
    parser.add_argument("--skip", nargs="*", default=["document/tokenize"],
                        help="LAYOUT/STAGE cases left out (default: tokenising one huge document, "
                             "which SentencePiece does in memory, gigabytes for 500 MB)")
    parser.add_argument("--dir", default=None, help="where the files go (default: a new temporary directory)")
    parser.add_argument("--case", nargs=5, metavar=("LAYOUT", "STAGE", "PATH", "TOKENIZER", "OUT"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.case:
        print(json.dumps(run_case(*args.case)))
        return

    work = Path(tempfile.mkdtemp(prefix="bench_text_stream_", dir=args.dir))
    try:
        from plsh_dist.data.tokenizer import train_tokenizer

        sample = work / "sample.txt"
        sample.write_text("\n".join(_block(random.Random(1), 64)))
        tok = train_tokenizer(str(sample), work / "tok", 1000, input_sentence_size=2000)
        rows = []
        for layout in args.layouts:
            for stage in args.stages:
                if f"{layout}/{stage}" in args.skip or (stage == "datasets" and layout == "separator"):
                    continue
                for size in args.sizes_mb:
                    path = work / f"{layout}_{size}mb.txt"
                    if not path.exists():
                        write_file(path, layout, size)
                    cmd = [sys.executable, __file__, "--case", layout, stage, str(path), str(tok.path),
                           str(work / "cache")]
                    res = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True,
                                                    env={**os.environ, "HF_DATASETS_OFFLINE": "1"}).stdout)
                    shutil.rmtree(work / "cache", ignore_errors=True)
                    rows.append({"layout": layout, "stage": stage, "size_mb": size, **res})
                    print(f"{layout:9s} {stage:8s} {size:5d} MB: peak {res['peak_mib']:7.0f} MiB "
                          f"(before reading {res['before_mib']:4.0f} MiB), {res['seconds']:6.1f} s, "
                          f"{size / res['seconds']:5.1f} MB/s, {res['docs']} documents", flush=True)
            for path in work.glob(f"{layout}_*.txt"):
                path.unlink()
        lo, hi = min(args.sizes_mb), max(args.sizes_mb)
        if lo == hi:
            return
        print(f"\npeak RSS at {hi} MB / at {lo} MB (target for line and separator: <= 1.2x)")
        for layout in args.layouts:
            for stage in args.stages:
                peaks = {r["size_mb"]: r["peak_mib"] for r in rows if (r["layout"], r["stage"]) == (layout, stage)}
                if lo in peaks and hi in peaks:
                    print(f"  {layout:9s} {stage:8s} {peaks[hi] / peaks[lo]:5.2f}x")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    main()
