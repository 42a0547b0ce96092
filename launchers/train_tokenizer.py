"""Train the SentencePiece BPE tokenizer on local files.

    python launchers/train_tokenizer.py --input 'data_cache/stdlib_corpus/train.jsonl' \
        --vocab-size 8192 --out data_cache/tokenizer/stdlib_bpe8k

Writes PREFIX.model. Inputs: text files (one document each), .jsonl/.json
(field --text-field) or .parquet; globs allowed (quote them). Empty and
binary files are reported and skipped; bytes that are not UTF-8 read as
U+FFFD in a text file and skip a .jsonl file.
"""

from __future__ import annotations

import argparse
import logging
import time


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input", required=True, nargs="+", help="input files or globs")
    parser.add_argument("--vocab-size", type=int, default=8192, help="vocabulary size, >= 300 (default 8192)")
    parser.add_argument("--out", required=True, help="output prefix; writes PREFIX.model")
    parser.add_argument("--text-field", default="text", help="text field of jsonl/parquet records (default 'text')")
    parser.add_argument("--input-sentence-size", type=int, default=20_000,
                        help="line chunks sampled for training; bounds the time (default 20000)")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    parser.add_argument("--threads", type=int, default=2, help="trainer threads (default 2)")
    args = parser.parse_args(argv)
    # Imported after parsing so that --help answers without loading torch.
    from plsh_dist.data.tokenizer import train_tokenizer
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    start = time.perf_counter()
    tok = train_tokenizer(args.input, args.out, args.vocab_size, text_field=args.text_field,
                          input_sentence_size=args.input_sentence_size, seed=args.seed, num_threads=args.threads)
    print(f"wrote {tok.path} (vocab {tok.vocab_size}) in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
