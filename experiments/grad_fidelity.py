"""How close is a PLSH training step to exact ALiBi's? Gradient fidelity per (s, sampler).

    python experiments/grad_fidelity.py --checkpoint runs/quality_gap/prose/alibi_h/seed0/final \
        --samples 8,20,100,400 --samplers iid,stratified_ramp --out results/grad_fidelity

An unbiased mask ``E[M~] = exp(-d / sigma)`` does not make the training
signal unbiased: attention normalises, and the loss is not linear in the
mask. What training sees is the gradient, so this measures it directly. For
one model (a checkpoint) and one fixed batch:

- ``g_ref``: the parameter gradient of the next-token loss under exact ALiBi
  with the model's own sigma (the kernel PLSH estimates);
- per PLSH setting and per hash draw ``t`` (the training seed rule at step
  ``t``): the loss and gradient ``g_t``;
- reported: the mean loss and its excess over ALiBi's, the mean of
  ``cos(g_t, g_ref)`` (one step's direction), ``cos(mean_t g_t, g_ref)``
  (the direction after averaging draws: what remains is bias, not variance),
  and ``|mean_t g_t| / |g_ref|``.

A setting with a lower variance of the training signal and the same
expectation shows a higher per-draw cosine; one whose averaged cosine stays
below 1 as draws are added carries a bias at that s.

The command uses one fixed batch of the checkpoint's validation split
(``--seq-len`` x ``--batch``, seeded offsets) and ``--draws`` hash draws per
setting (the training seed rule at steps 0, 1, ...); it writes fidelity.json
and fidelity.md to ``--out`` and prints the table.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a clone without installing
import experiments  # noqa: E402,F401  registers the lab's samplers when this file runs as a script
from plsh_dist.models import AttentionConfig, AttentionRuntime, set_attention_mode  # noqa: E402

__all__ = ["fixed_batch", "loss_and_grad", "gradient_fidelity", "format_fidelity"]


def fixed_batch(tokens: np.ndarray, seq_len: int, batch: int, seed: int = 0) -> torch.Tensor:
    """LongTensor[batch, seq_len + 1] of windows at seeded random offsets of ``tokens``."""
    if len(tokens) < seq_len + 2:
        raise ValueError(f"{len(tokens)} evaluation tokens cannot fill one window of {seq_len + 1}; "
                         "use a shorter --seq-len or more data")
    starts = np.random.default_rng(seed).integers(0, len(tokens) - seq_len - 1, batch)
    return torch.tensor(np.stack([tokens[s:s + seq_len + 1] for s in starts]), dtype=torch.long)


def loss_and_grad(model, attn: AttentionConfig, windows: torch.Tensor, step: int,
                  run_seed: int = 0) -> tuple[float, torch.Tensor]:
    """Mean next-token loss and the flat parameter gradient under ``attn`` at training ``step``."""
    runtime = AttentionRuntime(run_seed=run_seed)
    set_attention_mode(model, attn, runtime)
    runtime.set_step(step, 0)
    model.zero_grad(set_to_none=True)
    inputs, labels = windows[:, :-1], windows[:, 1:]
    positions = torch.arange(inputs.shape[1]).unsqueeze(0).expand_as(inputs)
    logits = model(input_ids=inputs, position_ids=positions).logits
    loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())
    loss.backward()
    grad = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    return loss.item(), grad


def gradient_fidelity(model, trained: AttentionConfig, windows: torch.Tensor, samples: Sequence[int],
                      samplers: Sequence[str], draws: int = 3, method: str = "onepass",
                      run_seed: int = 0) -> dict[str, Any]:
    """``{"reference": {loss}, "rows": [{s, sampler, loss, excess_loss, cos_step, cos_mean, norm_ratio}]}``.

    ``trained``: the checkpoint's attention (its sigma and rope are kept); the
    model is left in train mode under its trained attention afterwards.
    """
    model.train()
    base = dataclasses.replace(trained, bias="plsh", method=method)
    ref_loss, g_ref = loss_and_grad(model, dataclasses.replace(trained, bias="alibi"), windows, 0, run_seed)
    rows = []
    for s in samples:
        for sampler in samplers:
            t0 = time.perf_counter()
            attn = dataclasses.replace(base, num_samples=int(s), sampler=sampler)
            losses, grads = [], []
            for step in range(draws):
                loss, g = loss_and_grad(model, attn, windows, step, run_seed)
                losses.append(loss)
                grads.append(g)
            mean_g = torch.stack(grads).mean(0)
            rows.append({
                "s": int(s), "sampler": sampler, "loss": float(np.mean(losses)),
                "excess_loss": float(np.mean(losses)) - ref_loss,
                "cos_step": float(np.mean([F.cosine_similarity(g, g_ref, dim=0).item() for g in grads])),
                "cos_mean": F.cosine_similarity(mean_g, g_ref, dim=0).item(),
                "norm_ratio": (mean_g.norm() / g_ref.norm()).item(), "draws": draws,
                "seconds": round(time.perf_counter() - t0, 2)})
    set_attention_mode(model, trained, AttentionRuntime(run_seed=run_seed))
    return {"reference": {"bias": "alibi", "loss": ref_loss}, "rows": rows}


def format_fidelity(res: dict[str, Any]) -> str:
    """Markdown table of :func:`gradient_fidelity`'s rows, one line per (s, sampler)."""
    out = [f"Exact ALiBi loss {res['reference']['loss']:.4f}; per PLSH setting, over {res['rows'][0]['draws']} "
           "hash draws: excess loss, cos(one draw's gradient, ALiBi's), cos(mean gradient, ALiBi's), "
           "|mean gradient| / |ALiBi's|\n",
           "| s | sampler | excess loss | cos, one draw | cos, mean of draws | norm ratio |",
           "|---|---|---|---|---|---|"]
    for r in res["rows"]:
        out.append(f"| {r['s']} | {r['sampler']} | {r['excess_loss']:+.4f} | {r['cos_step']:.4f} | "
                   f"{r['cos_mean']:.4f} | {r['norm_ratio']:.3f} |")
    return "\n".join(out) + "\n"


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

    from plsh_dist.checkpoint.loading import load_model
    from plsh_dist.eval.eval_data import load_eval_tokens

    torch.set_num_threads(max(1, args.threads))
    ck = load_model(args.checkpoint)
    tokens, desc = load_eval_tokens(ck, None)
    windows = fixed_batch(tokens, args.seq_len, args.batch)
    res = gradient_fidelity(ck.model, ck.trained_attention, windows, [int(x) for x in args.samples.split(",")],
                            [x.strip() for x in args.samplers.split(",") if x.strip()], draws=args.draws,
                            method=args.method, run_seed=ck.run_config.run.seed)
    res.update(checkpoint=str(args.checkpoint), data=desc, seq_len=args.seq_len, batch=args.batch,
               trained_attention=ck.trained_attention.to_dict(),
               command="python experiments/grad_fidelity.py " + " ".join(sys.argv[1:] if argv is None else argv))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "fidelity.json").write_text(json.dumps(res, indent=1) + "\n")
    (out / "fidelity.md").write_text(format_fidelity(res))
    print(format_fidelity(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
