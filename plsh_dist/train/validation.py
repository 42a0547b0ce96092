"""Validation loss: of the model being trained, and of an exported checkpoint.

``validation_loss`` is what the training loop logs (periodically and at the
end); ``exported_validation`` recomputes it on the final export in one
process, without DeepSpeed (the quickstart and tests run it). The evaluation
package (``plsh_dist.eval``, ``launchers/evaluate.py``) supplies the full tool:
perplexity vs context length, per attention mode.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist

from plsh_dist.checkpoint.loading import load_model
from plsh_dist.data import build_loader, prepare_data
from plsh_dist.models import get_runtime
from plsh_dist.perplexity import perplexity
from plsh_dist.train.losses import forward_sums


def validation_loss(model, batches, runtime, device: torch.device, eval_seed_step: int = 0) -> float:
    """Mean token loss over ``batches`` (this rank's shard), all-reduced over the world.

    The attention masks of evaluation use step ``eval_seed_step`` of the seed context
    ``runtime`` so that every evaluation of a run (and of a resumed run) sees the same
    masks; the training step is restored afterwards.
    """
    loss_sum, tokens = validation_sums(model, batches, runtime, device, eval_seed_step)
    return loss_sum / max(tokens, 1.0)


def mixture_validation(model, sets: dict, runtime, device: torch.device) -> dict[str, float]:
    """``{"val_loss": over every set's batches, "val_loss/<name>": each set's}`` of a mixture's
    per-source validation batches (``DataPipeline.val_sets``); collective."""
    sums = {name: validation_sums(model, batches, runtime, device) for name, batches in sets.items()}
    out = {"val_loss": sum(s for s, _ in sums.values()) / max(sum(n for _, n in sums.values()), 1.0)}
    out.update({f"val_loss/{name}": s / max(n, 1.0) for name, (s, n) in sums.items()})
    return out


@torch.no_grad()
def validation_sums(model, batches, runtime, device: torch.device, eval_seed_step: int = 0) -> tuple[float, float]:
    """``(token-loss sum, token count)`` over ``batches``, all-reduced over the world (``validation_loss``)."""
    was_training = model.training
    model.eval()
    sums = torch.zeros(2, dtype=torch.float64, device=device)
    with runtime.at(eval_seed_step, 0):
        for batch in batches:
            loss_sum, n = forward_sums(model, batch, device)
            sums += torch.stack([loss_sum.double(), n.double()])
    if dist.is_initialized():
        dist.all_reduce(sums)
    model.train(was_training)
    return sums[0].item(), sums[1].item()


def exported_validation(directory: str | Path, *, eval_batches: int | None = None, attn_cfg=None) -> dict:
    """Validation loss and perplexity of ``directory`` (an ``export_final`` output).

    Uses the run's own data config (cached token streams) and the first
    ``eval_batches`` validation batches (default: the run's [logging].eval_batches),
    the same batches and hash seeds the training loop's final validation used.
    """
    ck = load_model(directory, attention=attn_cfg)
    if ck.run_config_file is None:
        raise ValueError(f"{ck.path} has no config.resolved.json: the run's validation data and batches are unknown; "
                         f"evaluate it on given data with launchers/evaluate.py --data PATH")
    model, cfg = ck.model, ck.run_config
    prepared = prepare_data(cfg.data, cfg.tokenizer)
    n = cfg.logging.eval_batches if eval_batches is None else eval_batches
    if prepared.mixture:  # as training validates a mixture: each source's first n batches
        sets = {name: (b for _, b in zip(range(n), build_loader(val if val is not None else train, cfg.data,
                                                                  train=False)))
                for name, _, train, val in prepared.mixture}
        loss = mixture_validation(model, sets, get_runtime(model), torch.device("cpu"))["val_loss"]
        n *= len(sets)
    else:
        stream = prepared.val if prepared.val is not None else prepared.train
        batches = (b for _, b in zip(range(n), build_loader(stream, cfg.data, train=False)))
        loss = validation_loss(model, batches, get_runtime(model), torch.device("cpu"))
    return {"val_loss": loss, "val_ppl": perplexity(loss), "batches": n,
            "tokens": n * cfg.data.micro_batch_size * cfg.data.seq_len}
