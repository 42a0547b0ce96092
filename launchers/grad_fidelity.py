"""Gradient fidelity of PLSH training steps to exact ALiBi's, per (s, sampler), on a checkpoint.

    python launchers/grad_fidelity.py --checkpoint runs/quality_gap/prose/alibi_h/seed0/final \
        --samples 8,20,100,400 --samplers iid,stratified_ramp --out results/grad_fidelity

One fixed batch of the checkpoint's validation split (``--seq-len`` x
``--batch``, seeded offsets), ``--draws`` hash draws per setting (the training
seed rule at steps 0, 1, ...). See ``plsh_dist.eval.grad_fidelity``. Writes
fidelity.json and fidelity.md to --out; prints the table.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a clone without installing


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True, help="run dir, its final/ export, or a checkpoint tag")
    p.add_argument("--samples", default="8,20,100,400")
    p.add_argument("--samplers", default="iid,stratified_ramp")
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--draws", type=int, default=3, help="hash draws per setting")
    p.add_argument("--method", default="onepass", help="PLSH method (the same estimator either way)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)

    import torch

    from plsh_dist.eval.checkpoint_loading import load_for_eval
    from plsh_dist.eval.eval_data import load_eval_tokens
    from plsh_dist.eval.grad_fidelity import fixed_batch, format_fidelity, gradient_fidelity

    torch.set_num_threads(max(1, args.threads))
    ck = load_for_eval(args.checkpoint)
    tokens, desc = load_eval_tokens(ck, None)
    windows = fixed_batch(tokens, args.seq_len, args.batch)
    res = gradient_fidelity(ck.model, ck.trained_attention, windows, [int(x) for x in args.samples.split(",")],
                            [x.strip() for x in args.samplers.split(",") if x.strip()], draws=args.draws,
                            method=args.method, run_seed=ck.run_config.run.seed)
    res.update(checkpoint=str(args.checkpoint), data=desc, seq_len=args.seq_len, batch=args.batch,
               trained_attention=ck.trained_attention.to_dict(),
               command="python launchers/grad_fidelity.py " + " ".join(sys.argv[1:] if argv is None else argv))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "fidelity.json").write_text(json.dumps(res, indent=1) + "\n")
    (out / "fidelity.md").write_text(format_fidelity(res))
    print(format_fidelity(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
