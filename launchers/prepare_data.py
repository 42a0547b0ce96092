"""Tokenize a corpus into the token cache that training reads: once, on every core, before the launch.

    python launchers/prepare_data.py --config configs/my_run.toml [--threads N] [--section.key=value ...]

Takes the run's config and the same overrides as launchers/pretrain.py, so it reads the same
[data] sources (files and globs, a ``datasets`` name or ``save_to_disk`` directory; jsonl, parquet,
text) and writes the same caches under [data].cache_dir, with the same keys: a launch with that
config finds them and never tokenizes (its log says ``token cache hit``). When
[tokenizer].model_path does not exist it trains the tokenizer there first, as training would.

Every split is cut into chunks of about 4 MB of consecutive documents, each tokenized by
SentencePiece's batch encode on ``--threads`` threads (default: every core this process may use;
on 2 cores it beat a pool of worker processes, docs/training.md) and joined in order: the tokens
are those of a 1-thread build, bit for bit. A progress bar shows MB read, MB/s and ETA (plain lines every 30 s
when stderr is no terminal). Interrupted (Ctrl-C, killed, out of time), it resumes from the chunks
it completed when run again; the cache is published only when whole (tmp + rename, meta.json last).
While it runs it holds ``<cache_dir>/prepare.lock``: a training launched meanwhile waits for it
instead of tokenizing the same data again.

Exit codes: 0 done (the last line is the command that trains on the data); 2 the config or the
data was refused (``config error:`` / ``data error:`` and one message, before any work); 130 interrupted.
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import sys
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="Any --section.key=value or --section.key value overrides the config "
                                            "file, as for launchers/pretrain.py; every key: docs/config.md.")
    parser.add_argument("--config", required=True, help="TOML run config (configs/*.toml), the one training will use")
    parser.add_argument("--threads", type=int, default=None,
                        help="SentencePiece encoding threads (default: every core this process may use)")
    args, overrides = parser.parse_known_args(argv)
    threads = args.threads if args.threads is not None else len(os.sched_getaffinity(0))
    if threads < 1:
        print(f"config error: --threads must be >= 1, got {threads}; leave it out to use every core", file=sys.stderr)
        return 2
    # Imported after parsing so that --help answers without loading torch.
    from plsh_dist.config import load_config
    from plsh_dist.train.data_wait import prepare_locked
    from plsh_dist.train.refusal import EXIT_REFUSED

    try:
        cfg = load_config(args.config, overrides)  # the checks training makes before any work
    except ValueError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    start = time.perf_counter()
    try:
        prepared = prepare_locked(cfg.data, cfg.tokenizer, threads=threads)
    except ValueError as exc:
        print(f"data error: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    except KeyboardInterrupt:
        print("interrupted: run the same command again to resume from the chunks already tokenized",
              file=sys.stderr)
        return 130
    print(f"prepared in {time.perf_counter() - start:.1f} s on {threads} thread(s); tokenizer "
          f"{prepared.tokenizer.path} ({prepared.tokenizer.vocab_size} pieces)")
    for name, report in prepared.reports.items():
        if name != "corpus":
            print(f"  {report.summary(name)}")
    import torch

    gpus = torch.cuda.device_count() if cfg.run.device != "cpu" else 0
    launcher = f"deepspeed --num_gpus {gpus}" if gpus else "DS_ACCELERATOR=cpu python"
    command = shlex.join(["launchers/pretrain.py", "--config", args.config, *overrides])
    print(f"train on it (the same config and overrides find these caches):\n  {launcher} {command}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
