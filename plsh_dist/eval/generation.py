"""Text generation from a checkpoint under any attention mode.

    ck = load_model("runs/quickstart")
    result = generate(ck, "def main(", max_new_tokens=64, mode="plsh:s=8")
    print(result.text, result.tokens_per_s)

**Decoders.** ``Cached`` (the default) keeps transformers' ``DynamicCache``:
the prompt is one forward, then each new token one forward of that token
against the cached keys (plsh_dist attention decodes with a cache in every
mode, :mod:`plsh_dist.ops.decode`, with the logits of a full forward).
``Reforward`` (``use_cache=False``, to compare) re-runs the whole sequence per
token: token ``t`` costs a forward over ``prompt + t`` tokens. Both sit behind
the same two calls (``prefill(ids)`` -> next-token logits, ``step(token)`` ->
next-token logits); ``generate(..., decoder=...)`` takes any such object.
The masks stay those of one hash seed: PLSH blocks are a pure function of
(seed, sample, head, position), so a cached step and a re-run prefix see the
same attention.

Documents: training packs documents with an EOS after each, so a document
starts after an EOS; the prompt is prefixed with one (``doc_start=True``),
which also lets an empty prompt generate from a document start.

Context limits (``context_limit``): with rope on, positions beyond
``max_position_embeddings`` were never trained; ALiBi / PLSH / window modes
without rope have no positional limit (they extrapolate). A prompt plus
``max_new_tokens`` past the limit is refused before any work, naming the fix.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import torch

from plsh_dist.biases import bias_for
from plsh_dist.checkpoint.loading import LoadedCheckpoint
from plsh_dist.eval.mode_specs import attention_for, parse_modes
from plsh_dist.models import AttentionConfig, AttentionRuntime, ModelConfig, set_attention_mode


class Reforward:
    """Next-token logits by re-running the whole sequence each step (no KV cache)."""

    description = "full re-forward per token (no KV cache: use_cache=False)"

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.ids: torch.Tensor | None = None

    @torch.no_grad()
    def _last_logits(self) -> torch.Tensor:
        n = self.ids.shape[1]
        pos = torch.arange(n, device=self.ids.device)[None]
        out = self.model(input_ids=self.ids, position_ids=pos, use_cache=False, logits_to_keep=1)
        return out.logits[0, -1].float()

    def prefill(self, ids: torch.Tensor) -> torch.Tensor:
        """``ids`` (1, n) -> logits (V,) of the token after them."""
        self.ids = ids
        return self._last_logits()

    def step(self, token: int) -> torch.Tensor:
        """Append ``token`` -> logits (V,) of the token after it."""
        tok = torch.tensor([[token]], dtype=self.ids.dtype, device=self.ids.device)
        self.ids = torch.cat([self.ids, tok], dim=1)
        return self._last_logits()


class Cached:
    """Next-token logits from transformers' KV cache: one forward per new token."""

    description = "KV cache (DynamicCache): one token per forward"

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.cache = None
        self.n = 0  # tokens in the cache
        self.device: torch.device | None = None

    @torch.no_grad()
    def _logits(self, ids: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(self.n, self.n + ids.shape[1], device=ids.device)[None]
        out = self.model(input_ids=ids, position_ids=pos, cache=self.cache, use_cache=True, logits_to_keep=1)
        self.n += ids.shape[1]
        return out.logits[0, -1].float()

    def prefill(self, ids: torch.Tensor) -> torch.Tensor:
        """``ids`` (1, n) -> logits (V,) of the token after them (a fresh cache)."""
        from transformers import DynamicCache

        self.cache, self.n = DynamicCache(config=self.model.config), 0
        self.device = ids.device
        return self._logits(ids)

    def step(self, token: int) -> torch.Tensor:
        """Append ``token`` -> logits (V,) of the token after it."""
        return self._logits(torch.tensor([[token]], dtype=torch.long, device=self.device))


def sample_next(logits: torch.Tensor, *, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                generator: torch.Generator | None = None) -> int:
    """Greedy when ``temperature == 0``, else sampling from the tempered, top-k / nucleus-filtered softmax."""
    if temperature == 0:
        return int(logits.argmax())
    logits = logits.double() / temperature
    if top_k:
        kth = torch.topk(logits, min(top_k, logits.numel())).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if top_p < 1.0:
        sorted_p, order = probs.sort(descending=True)
        keep = sorted_p.cumsum(0) - sorted_p < top_p  # the smallest prefix holding top_p of the mass
        probs = torch.zeros_like(probs).scatter_(0, order[keep], sorted_p[keep])
    return int(torch.multinomial(probs.cpu(), 1, generator=generator))


def context_limit(model_cfg: ModelConfig, attn: AttentionConfig) -> tuple[int | None, str]:
    """``(most tokens the mode supports or None, why)`` (module doc)."""
    if attn.rope:
        return model_cfg.max_position_embeddings, (
            f"rope is on and the rotary positions past [model].max_position_embeddings = "
            f"{model_cfg.max_position_embeddings} were never trained")
    return None, f"bias={attn.bias} without rope has no positional limit"


@dataclass
class GenerationResult:
    text: str
    """Prompt followed by the generated continuation."""
    completion: str
    """The generated continuation only."""
    prompt_tokens: int
    """Tokens fed before the first new one (the document-start EOS included)."""
    new_tokens: int
    seconds: float
    """Wall time of the whole generation (prefill included)."""
    prefill_seconds: float
    decoder: str
    """How the logits were computed (``Reforward.description``)."""
    attention: AttentionConfig
    stopped_at_eos: bool

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else float("inf")

    def summary(self) -> str:
        a = self.attention
        mode = f"bias={a.bias} rope={a.rope}" + bias_for(a).label()
        return (f"generated {self.new_tokens} tokens in {self.seconds:.2f} s: {self.tokens_per_s:.1f} tokens/s "
                f"(prompt {self.prompt_tokens} tokens, first token after {self.prefill_seconds:.2f} s; {mode}; "
                f"{self.decoder}{'; stopped at EOS' if self.stopped_at_eos else ''})")


def generate(ck: LoadedCheckpoint, prompt: str, *, max_new_tokens: int = 64, mode: str | None = None,
             hash_seed: int | None = None, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
             seed: int = 0, doc_start: bool = True, stop_at_eos: bool = True, max_context: int | None = None,
             decoder=None, use_cache: bool = True) -> GenerationResult:
    """Continue ``prompt`` with the checkpoint's model.

    Args:
        ck: ``load_model``'s checkpoint (model, tokenizer, trained attention).
        mode: one evaluation mode spec (``"plsh:s=16"``, ``"alibi"``, ``"window:512"``...,
            see ``plsh_dist.eval.mode_specs``); None = the trained attention.
        hash_seed: run seed of the PLSH masks; None = the checkpoint's (its seed rule).
        temperature, top_k, top_p, seed: sampling (``temperature=0``: greedy).
        doc_start: prefix the prompt with EOS (a document start, module doc).
        max_context: override the mode's context limit (``context_limit``).
        decoder: object with ``prefill``/``step``/``description``; default ``Cached(model)``
            (``Reforward(model)`` with ``use_cache=False``).
    Raises ValueError for bad arguments or a prompt longer than the mode supports.
    """
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
    if temperature < 0 or not 0 < top_p <= 1 or top_k < 0:
        raise ValueError(f"sampling needs temperature >= 0, 0 < top_p <= 1, top_k >= 0; got temperature="
                         f"{temperature}, top_p={top_p}, top_k={top_k}")
    attn = ck.trained_attention
    if mode:
        modes = parse_modes(mode)
        if len(modes) != 1:
            raise ValueError(f"--mode takes one attention mode, got {len(modes)} in {mode!r}")
        attn = attention_for(modes[0], attn)
    else:
        attn = dataclasses.replace(attn, fixed_masks=False)
    run_seed = ck.run_config.run.seed if hash_seed is None else int(hash_seed)

    tok = ck.tokenizer
    ids = ([tok.eos_id] if doc_start else []) + tok.encode(prompt)
    if not ids:
        raise ValueError("the prompt is empty and doc_start is off: nothing to condition on; give a prompt or "
                         "keep the document-start EOS")
    limit, why = context_limit(ck.model_cfg, attn)
    if max_context is not None:
        limit, why = max_context, f"--max-context {max_context}"
    if limit is not None and len(ids) + max_new_tokens > limit:
        raise ValueError(f"prompt ({len(ids)} tokens) + max_new_tokens ({max_new_tokens}) = "
                         f"{len(ids) + max_new_tokens} tokens exceeds what this mode supports ({limit}: {why}); "
                         f"shorten the prompt, lower --max-new-tokens, or pick a mode without rope "
                         f"(e.g. --mode alibi:rope=false for an ALiBi/PLSH-trained model)")

    model = ck.model
    device = next(model.parameters()).device
    set_attention_mode(model, attn, AttentionRuntime(run_seed=run_seed))
    if decoder is None:
        decoder = Cached(model) if use_cache else Reforward(model)
    gen = torch.Generator().manual_seed(seed)
    model.eval()
    new: list[int] = []
    eos = False
    try:
        t0 = time.perf_counter()
        logits = decoder.prefill(torch.tensor([ids], dtype=torch.long, device=device))
        prefill_s = time.perf_counter() - t0
        while True:
            nxt = sample_next(logits, temperature=temperature, top_k=top_k, top_p=top_p, generator=gen)
            new.append(nxt)
            if stop_at_eos and nxt == tok.eos_id:
                eos = True
                break
            if len(new) >= max_new_tokens:
                break
            logits = decoder.step(nxt)
        seconds = time.perf_counter() - t0
    finally:  # the checkpoint's model back in its trained mode and seed
        set_attention_mode(model, ck.trained_attention, AttentionRuntime(run_seed=ck.run_config.run.seed))
    completion = tok.decode(new)
    return GenerationResult(text=prompt + completion, completion=completion, prompt_tokens=len(ids),
                            new_tokens=len(new), seconds=seconds, prefill_seconds=prefill_s,
                            decoder=decoder.description, attention=attn, stopped_at_eos=eos)
