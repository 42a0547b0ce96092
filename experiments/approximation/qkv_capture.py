"""Queries, keys and values of a Hugging Face decoder's layers, by forward hooks.

The approximation-error tools need the q/k/v a trained model really produces
(``T*`` and ``T~`` differ most where attention is peaked).  Hooks on each
layer's ``q_proj`` / ``k_proj`` / ``v_proj`` catch the projections; the
per-head RMSNorm of Qwen3-style models (``q_norm`` / ``k_norm``) is applied
here exactly as the module applies it.  The rotary embedding is *not*
applied: positional LSH replaces the positional term with the ALiBi bias it
approximates, so the position-free q/k are the inputs it would see (for an
ALiBi checkpoint they are exactly the attention's inputs).

Legend: B batch, T tokens, H heads (query or key/value), D head dim.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import torch


def capture_qkv(
    model: torch.nn.Module, input_ids: torch.Tensor, layers: Sequence[int] | None = None
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Run ``model(input_ids)`` once and return ``(q, k, v)`` per requested layer.

    Args:
        model: a decoder with ``model.model.layers[i].self_attn`` holding
            ``q_proj``, ``k_proj``, ``v_proj`` and ``head_dim`` (Llama, Qwen2/3,
            Mistral...); optional ``q_norm`` / ``k_norm`` are applied.
        input_ids: LongTensor (B, T).
        layers: layer indices (default: all), in the order returned.
    Returns:
        ``[(q (B, T, Hq, D), k (B, T, Hkv, D), v (B, T, Hkv, D)), ...]``, detached,
        in the model's dtype.
    """
    try:
        blocks = model.model.layers
    except AttributeError as err:
        raise ValueError(f"{type(model).__name__} has no model.layers; capture_qkv expects a "
                         "Hugging Face decoder (e.g. Qwen3ForCausalLM)") from err
    layers = list(range(len(blocks))) if layers is None else [int(i) for i in layers]
    bad = [i for i in layers if not 0 <= i < len(blocks)]
    if bad:
        raise ValueError(f"layers {bad} out of range: the model has {len(blocks)} layers")
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be (B, T), got shape {tuple(input_ids.shape)}")

    caught: dict[tuple[int, str], torch.Tensor] = {}
    handles = []

    def hook(layer: int, name: str):
        def fn(_module, _inputs, output):
            caught[(layer, name)] = output.detach()
        return fn

    try:
        for i in layers:
            attn = blocks[i].self_attn
            for name in ("q_proj", "k_proj", "v_proj"):
                handles.append(getattr(attn, name).register_forward_hook(hook(i, name)))
        with torch.no_grad():
            model(input_ids=input_ids)
    finally:
        for handle in handles:
            handle.remove()

    out = []
    with torch.no_grad():
        for i in layers:
            attn = blocks[i].self_attn
            B, T = input_ids.shape
            q, k, v = (caught[(i, n)].view(B, T, -1, attn.head_dim) for n in ("q_proj", "k_proj", "v_proj"))
            # Same order as the module: per-head norm on (B, T, H, D), before rotary.
            if getattr(attn, "q_norm", None) is not None:
                q = attn.q_norm(q)
            if getattr(attn, "k_norm", None) is not None:
                k = attn.k_norm(k)
            out.append((q, k, v))
    return out


def read_text(path: str | Path | None) -> str:
    """The text of a plain file, or of a corpus ``.jsonl`` (``{"text": ...}`` per line, documents
    joined by a blank line); None: the standard library's ``inspect.py`` (every machine has it)."""
    if path is None:
        import inspect

        return Path(inspect.getsourcefile(inspect)).read_text()
    path = Path(path)
    if path.suffix == ".jsonl":
        with path.open() as f:
            return "\n\n".join(json.loads(line)["text"] for line in f if line.strip())
    return path.read_text()


def checkpoint_qkv(
    checkpoint: str | Path, seq_len: int, layers: Sequence[int] | None = None, text_path: str | Path | None = None
) -> list[tuple[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]]:
    """``[(f"layer {i}", (q, k, v)), ...]`` of a Hugging Face checkpoint on real text, fp32.

    The first ``seq_len`` tokens of :func:`read_text` ``(text_path)``, tokenised by the
    checkpoint's own tokenizer (random token ids, with a message, when it was exported
    without one).  ``layers``: default first, middle and last.
    """
    import os

    from transformers import AutoModelForCausalLM, AutoTokenizer

    import plsh_dist.models  # noqa: F401  registers plsh_dist's exports (model_type qwen3_plsh ...) with Auto*

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    text = read_text(text_path)
    tokenizer_files = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "vocab.json")
    if any((Path(checkpoint) / f).exists() for f in tokenizer_files):
        tok = AutoTokenizer.from_pretrained(checkpoint)
        ids = tok(text, return_tensors="pt")["input_ids"][:, :seq_len]
    else:  # a checkpoint exported without its tokenizer
        print(f"no tokenizer files in {checkpoint}; feeding random token ids")
        ids = torch.randint(0, model.config.vocab_size, (1, seq_len), generator=torch.Generator().manual_seed(0))
    if ids.shape[1] < seq_len:
        raise ValueError(f"the text has only {ids.shape[1]} tokens, seq_len is {seq_len}; give a longer text")
    n_layers = len(model.model.layers)
    layers = list(layers) if layers is not None else sorted({0, n_layers // 2, n_layers - 1})
    return [(f"layer {i}", qkv) for i, qkv in zip(layers, capture_qkv(model, ids, layers))]
