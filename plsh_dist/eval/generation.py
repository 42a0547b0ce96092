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

**Batches.** ``generate_batch(ck, prompts, batch_size=8)`` runs the prompts in
batches of ``batch_size``, in input order, each batch padded on the left with
an ``attention_mask`` and positions counting each row's real tokens
(``cumsum(mask) - 1``), as transformers' batched ``generate`` does; a row's
greedy tokens equal its prompt's alone (``generate``). The decoders' batch
calls are ``prefill_batch(ids, mask)`` -> (B, V) logits and
``step_batch(tokens)`` -> (B, V); ``prefill`` / ``step`` are their one-row form.

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
from typing import Sequence

import torch

from plsh_dist.biases import bias_for
from plsh_dist.checkpoint.loading import LoadedCheckpoint
from plsh_dist.eval.mode_specs import attention_for, parse_modes
from plsh_dist.models import AttentionConfig, AttentionRuntime, ModelConfig, set_attention_mode


def _positions(mask: torch.Tensor | None, n: int, device: torch.device) -> torch.Tensor:
    """Position of each token: ``arange(n)`` unpadded, else the real tokens before it (padding: 0)."""
    if mask is None:
        return torch.arange(n, device=device)[None]
    return (mask.cumsum(-1) - 1).clamp(min=0)


class Reforward:
    """Next-token logits by re-running the whole sequence each step (no KV cache)."""

    description = "full re-forward per token (no KV cache: use_cache=False)"

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.ids: torch.Tensor | None = None
        self.mask: torch.Tensor | None = None

    @torch.no_grad()
    def _last_logits(self) -> torch.Tensor:
        pos = _positions(self.mask, self.ids.shape[1], self.ids.device)
        out = self.model(input_ids=self.ids, attention_mask=self.mask, position_ids=pos, use_cache=False,
                         logits_to_keep=1)
        return out.logits[:, -1].float()

    def prefill_batch(self, ids: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """``ids`` (B, n), left-padded where ``mask`` (B, n) is 0 -> logits (B, V) of the next tokens."""
        self.ids, self.mask = ids, mask
        return self._last_logits()

    def step_batch(self, tokens: torch.Tensor) -> torch.Tensor:
        """Append ``tokens`` (B,) -> logits (B, V) of the tokens after them."""
        self.ids = torch.cat([self.ids, tokens[:, None].to(self.ids)], dim=1)
        if self.mask is not None:
            self.mask = torch.cat([self.mask, self.mask.new_ones(len(tokens), 1)], dim=1)
        return self._last_logits()

    def prefill(self, ids: torch.Tensor) -> torch.Tensor:
        """``ids`` (1, n) -> logits (V,) of the token after them."""
        return self.prefill_batch(ids)[0]

    def step(self, token: int) -> torch.Tensor:
        """Append ``token`` -> logits (V,) of the token after it."""
        return self.step_batch(torch.tensor([token], device=self.ids.device))[0]


class Cached:
    """Next-token logits from transformers' KV cache: one forward per new token."""

    description = "KV cache (DynamicCache): one token per forward"

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.cache = None
        self.mask: torch.Tensor | None = None
        self.next_pos: torch.Tensor | None = None  # (B, 1): the position of each row's next token

    @torch.no_grad()
    def _logits(self, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        out = self.model(input_ids=ids, attention_mask=self.mask, position_ids=pos, cache=self.cache,
                         use_cache=True, logits_to_keep=1)
        self.next_pos = pos[:, -1:] + 1
        return out.logits[:, -1].float()

    def prefill_batch(self, ids: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """``ids`` (B, n), left-padded where ``mask`` (B, n) is 0 -> logits (B, V) (a fresh cache)."""
        from transformers import DynamicCache

        self.cache, self.mask = DynamicCache(config=self.model.config), mask
        return self._logits(ids, _positions(mask, ids.shape[1], ids.device).expand(len(ids), -1))

    def step_batch(self, tokens: torch.Tensor) -> torch.Tensor:
        """Append ``tokens`` (B,) -> logits (B, V) of the tokens after them."""
        if self.mask is not None:
            self.mask = torch.cat([self.mask, self.mask.new_ones(len(tokens), 1)], dim=1)
        return self._logits(tokens[:, None].to(self.next_pos), self.next_pos)

    def prefill(self, ids: torch.Tensor) -> torch.Tensor:
        """``ids`` (1, n) -> logits (V,) of the token after them (a fresh cache)."""
        return self.prefill_batch(ids)[0]

    def step(self, token: int) -> torch.Tensor:
        """Append ``token`` -> logits (V,) of the token after it."""
        return self.step_batch(torch.tensor([token], device=self.next_pos.device))[0]


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


def _checked_sampling(max_new_tokens: int, temperature: float, top_k: int, top_p: float) -> None:
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
    if temperature < 0 or not 0 < top_p <= 1 or top_k < 0:
        raise ValueError(f"sampling needs temperature >= 0, 0 < top_p <= 1, top_k >= 0; got temperature="
                         f"{temperature}, top_p={top_p}, top_k={top_k}")


def _attention(ck: LoadedCheckpoint, mode: str | None) -> AttentionConfig:
    """The attention ``mode`` names (one spec), or the checkpoint's trained one with fresh masks."""
    if mode:
        modes = parse_modes(mode)
        if len(modes) != 1:
            raise ValueError(f"--mode takes one attention mode, got {len(modes)} in {mode!r}")
        return attention_for(modes[0], ck.trained_attention)
    return dataclasses.replace(ck.trained_attention, fixed_masks=False)


def _prompt_ids(ck: LoadedCheckpoint, prompt: str, attn: AttentionConfig, *, doc_start: bool, max_new_tokens: int,
                max_context: int | None, which: str = "the prompt") -> list[int]:
    """Token ids fed for ``prompt``; ValueError when they are none, or with ``max_new_tokens`` too many."""
    tok = ck.tokenizer
    ids = ([tok.eos_id] if doc_start else []) + tok.encode(prompt)
    if not ids:
        raise ValueError(f"{which} is empty and doc_start is off: nothing to condition on; give a prompt or "
                         "keep the document-start EOS")
    limit, why = context_limit(ck.model_cfg, attn)
    if max_context is not None:
        limit, why = max_context, f"--max-context {max_context}"
    if limit is not None and len(ids) + max_new_tokens > limit:
        raise ValueError(f"{which} ({len(ids)} tokens) + max_new_tokens ({max_new_tokens}) = "
                         f"{len(ids) + max_new_tokens} tokens exceeds what this mode supports ({limit}: {why}); "
                         f"shorten the prompt, lower --max-new-tokens, or pick a mode without rope "
                         f"(e.g. --mode alibi:rope=false for an ALiBi/PLSH-trained model)")
    return ids


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
    _checked_sampling(max_new_tokens, temperature, top_k, top_p)
    attn = _attention(ck, mode)
    run_seed = ck.run_config.run.seed if hash_seed is None else int(hash_seed)
    tok = ck.tokenizer
    ids = _prompt_ids(ck, prompt, attn, doc_start=doc_start, max_new_tokens=max_new_tokens, max_context=max_context)

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


def generate_batch(ck: LoadedCheckpoint, prompts: Sequence[str], *, batch_size: int = 8, max_new_tokens: int = 64,
                   mode: str | None = None, hash_seed: int | None = None, temperature: float = 0.0, top_k: int = 0,
                   top_p: float = 1.0, seed: int = 0, doc_start: bool = True, stop_at_eos: bool = True,
                   max_context: int | None = None, use_cache: bool = True) -> list[GenerationResult]:
    """Continue each of ``prompts``, ``batch_size`` at a time (left-padded, module doc); results in
    input order, each with its batch's ``seconds`` and ``prefill_seconds``.

    Arguments as ``generate``'s. Greedy tokens equal each prompt's alone; sampled ones are drawn
    from one generator seeded with ``seed``, row after row. Every prompt is checked (empty, too
    long) before any is generated; a ValueError names the prompt by its index.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
    _checked_sampling(max_new_tokens, temperature, top_k, top_p)
    attn = _attention(ck, mode)
    run_seed = ck.run_config.run.seed if hash_seed is None else int(hash_seed)
    tok = ck.tokenizer
    all_ids = [_prompt_ids(ck, p, attn, doc_start=doc_start, max_new_tokens=max_new_tokens, max_context=max_context,
                           which=f"prompt {i}") for i, p in enumerate(prompts)]

    model = ck.model
    device = next(model.parameters()).device
    set_attention_mode(model, attn, AttentionRuntime(run_seed=run_seed))
    decoder = Cached(model) if use_cache else Reforward(model)
    gen = torch.Generator().manual_seed(seed)
    model.eval()
    results: list[GenerationResult] = []
    try:
        for first in range(0, len(prompts), batch_size):
            rows = all_ids[first:first + batch_size]
            n = max(len(r) for r in rows)
            ids_BN = torch.full((len(rows), n), tok.pad_id, dtype=torch.long, device=device)
            mask_BN = torch.zeros((len(rows), n), dtype=torch.long, device=device)
            for b, r in enumerate(rows):  # left padding: every row's last prompt token in the last column
                ids_BN[b, n - len(r):] = torch.tensor(r, dtype=torch.long)
                mask_BN[b, n - len(r):] = 1
            new: list[list[int]] = [[] for _ in rows]
            eos = [False] * len(rows)
            t0 = time.perf_counter()
            logits_BV = decoder.prefill_batch(ids_BN, None if bool(mask_BN.all()) else mask_BN)
            prefill_s = time.perf_counter() - t0
            while True:
                for b in range(len(rows)):
                    if not eos[b] and len(new[b]) < max_new_tokens:
                        nxt = sample_next(logits_BV[b], temperature=temperature, top_k=top_k, top_p=top_p,
                                          generator=gen)
                        new[b].append(nxt)
                        eos[b] = stop_at_eos and nxt == tok.eos_id
                if all(e or len(t) >= max_new_tokens for e, t in zip(eos, new)):
                    break
                # A finished row is fed its last token again; its logits are not read.
                logits_BV = decoder.step_batch(torch.tensor([t[-1] for t in new], dtype=torch.long, device=device))
            seconds = time.perf_counter() - t0
            for b, prompt in enumerate(prompts[first:first + batch_size]):
                completion = tok.decode(new[b])
                results.append(GenerationResult(
                    text=prompt + completion, completion=completion, prompt_tokens=len(rows[b]),
                    new_tokens=len(new[b]), seconds=seconds, prefill_seconds=prefill_s,
                    decoder=decoder.description, attention=attn, stopped_at_eos=eos[b]))
    finally:  # the checkpoint's model back in its trained mode and seed
        set_attention_mode(model, ck.trained_attention, AttentionRuntime(run_seed=ck.run_config.run.seed))
    return results
