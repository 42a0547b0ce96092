"""Write the English-prose corpus (the Jargon File, Debian package jargon-text).

    apt-get install jargon-text          # once per machine (root; 650 kB, no dependencies)
    python launchers/prepare_prose_corpus.py --out data_cache/jargon_corpus

Writes train.jsonl / val.jsonl ({"text", "source"} per line) and manifest.json,
read like any local data: --data.train_files='["data_cache/jargon_corpus/train.jsonl"]'
--data.val_files='["data_cache/jargon_corpus/val.jsonl"]' for training, or
launchers/evaluate.py --data data_cache/jargon_corpus/val.jsonl. A second run
with the same file and options reuses the output. Exit code 2 when the
package's file is missing (the message says how to get it).
"""

from __future__ import annotations

import argparse
import logging
import sys


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="data_cache/jargon_corpus", help="output directory")
    p.add_argument("--source", default=None, help="jargon.txt(.gz) (default: where jargon-text installs it)")
    p.add_argument("--val-fraction", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--chunk-chars", type=int, default=16_000, help="characters per lexicon document")
    args = p.parse_args(argv)
    from plsh_dist.data.corpus import write_prose_corpus

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        corpus = write_prose_corpus(args.out, args.source, args.val_fraction, args.seed, args.chunk_chars)
    except ValueError as exc:
        print(f"prepare_prose_corpus: error: {exc}", file=sys.stderr)
        return 2
    s = corpus.stats
    print(f"train: {corpus.train} ({s.train_docs} documents, {s.train_chars} characters)")
    print(f"val:   {corpus.val} ({s.val_docs} documents, {s.val_chars} characters)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
