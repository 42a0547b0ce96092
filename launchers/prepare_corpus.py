"""Write the embedded default corpus (this Python's standard library sources).

    python launchers/prepare_corpus.py --out data_cache/stdlib_corpus

Writes train.jsonl / val.jsonl ({"text", "source"} per line) and manifest.json;
a second run with the same interpreter and options reuses the files.
"""

from __future__ import annotations

import argparse
import logging


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--val-fraction", type=float, default=0.02, help="fraction of files held out (default 0.02)")
    parser.add_argument("--max-files", type=int, default=None, help="use only this many files (default: all)")
    parser.add_argument("--seed", type=int, default=0, help="selects which files go to validation (default 0)")
    args = parser.parse_args(argv)
    # Imported after parsing so that --help answers without loading torch.
    from plsh_dist.data.corpus import write_stdlib_corpus
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    corpus = write_stdlib_corpus(args.out, args.val_fraction, args.max_files, args.seed)
    s = corpus.stats
    print(f"train: {corpus.train} ({s.train_docs} documents, {s.train_chars} characters)")
    print(f"val:   {corpus.val} ({s.val_docs} documents, {s.val_chars} characters)")
    print(s.report.summary("skipped files"))


if __name__ == "__main__":
    main()
