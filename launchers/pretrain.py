"""Pretrain a decoder with positional-LSH attention (DeepSpeed engine).

    deepspeed --num_gpus 2 --master_port 29511 launchers/pretrain.py --config configs/quickstart.toml \
        [--section.key=value ...]

An override is ``--section.key=value`` or ``--section.key value`` (both work:
``--run.max_steps=3`` and ``--run.max_steps 3`` are the same). On CPU set DS_ACCELERATOR=cpu (gloo backend). Plain ``python launchers/pretrain.py``
runs one process. The launcher's ``--local_rank`` is accepted (LOCAL_RANK env wins).
Also runs under torchrun (``torchrun --nproc_per_node 2 launchers/pretrain.py ...``,
multi-node with ``--nnodes/--node_rank/--master_addr``).

Exit codes (docs/training.md): 0 done; 1 this rank failed, a bug or a crash
(``rank R failed: ...`` with the traceback on stderr and in
``<out_dir>/failures/rank_R.txt``); 2 the input was refused (``config error:``,
``data error:``, ``resume error:`` or ``checkpoint error:`` and one message, no
traceback, nothing written: plsh_dist/train/refusal.py); 3 stopped because a peer
rank failed or a collective timed out ([parallel].timeout_s); 75 preempted: SIGTERM or
SIGUSR1 reached a rank, every rank finished the current step and the checkpoint
of that step was written (``preempted at step N ...``; run the same command again,
``--resume auto`` is the default; [checkpoint].save_on_signal, plsh_dist/train/preemption.py);
130 interrupted (Ctrl-C).
"""

from __future__ import annotations

import argparse
import os
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="Any --section.key=value or --section.key value (the same) overrides the "
                                            "config file, e.g. --run.max_steps=3 or --run.max_steps 3.\n\n"
                                            "Config sections: [run] [model] [attention] [data] [tokenizer] [optim] "
                                            "[memory] [deepspeed] [parallel] [checkpoint] [logging].\nEvery key, its "
                                            "type, default, accepted values and meaning: docs/config.md\n(written "
                                            "from the schema: python -m plsh_dist.config.reference).")
    parser.add_argument("--config", required=True, help="TOML run config (configs/*.toml)")
    parser.add_argument("--local_rank", "--local-rank", type=int, default=None, help="set by the deepspeed launcher")
    parser.add_argument("--resume", default=None, help="auto | never | checkpoint dir (= --checkpoint.resume)")
    args, overrides = parser.parse_known_args(argv)
    if args.local_rank is not None:
        os.environ.setdefault("LOCAL_RANK", str(args.local_rank))

    from plsh_dist.config import load_config, parse_overrides
    from plsh_dist.plan.checkpoint_space import check_checkpoint_space
    from plsh_dist.train import train
    from plsh_dist.train.failure import run_reporting_failures
    from plsh_dist.train.loop import resolve_device
    from plsh_dist.train.preemption import EXIT_PREEMPTED, ignore_stop_signals, mark_preempted
    from plsh_dist.train.refusal import EXIT_REFUSED
    from plsh_dist.writable import check_writable_dir

    try:
        if args.resume is not None:
            given = parse_overrides(overrides).get("checkpoint", {}).get("resume")
            if given is not None and str(given) != args.resume:  # both name [checkpoint].resume: neither may win
                raise ValueError(f"--resume {args.resume} and --checkpoint.resume={given} disagree (--resume sets "
                                 f"[checkpoint].resume); give only one of them")
            overrides.append(f"--checkpoint.resume={args.resume}")
        cfg = load_config(args.config, overrides)  # the checks that need no process group, before any work
        check_writable_dir(cfg.run.out_dir, "[run].out_dir")
        check_checkpoint_space(cfg, device=resolve_device(cfg.run.device).type)  # room for the checkpoints kept
    except ValueError as exc:
        # Every rank reads the same config and refuses alike: one message per node, from its first rank.
        if int(os.environ.get("LOCAL_RANK", "0")) == 0:
            print(f"config error: {exc}", file=sys.stderr)
        return EXIT_REFUSED

    def run() -> int:
        result = train(cfg)
        if result.preempted_at is None:
            return 0
        ignore_stop_signals()  # checkpoint written: the launcher's SIGTERM to leaving ranks must not make it -15
        mark_preempted()  # for a launcher that reports our 75 as 1 (torchrun under slurm_pretrain.sh)
        return EXIT_PREEMPTED

    # A failing rank prints "rank R failed: ..." and writes <out_dir>/failures/rank_R.txt;
    # ranks that only lost a peer print one line; both exit non-zero (failure.py). A refusal
    # found once the world is known (layout, data, resume, checkpoint) exits 2 with one message.
    return run_reporting_failures(run, rank=int(os.environ.get("RANK", "0")), out_dir=cfg.run.out_dir)


if __name__ == "__main__":
    sys.exit(main())
