"""LM head + cross-entropy over chunks of tokens, never holding (N, V) logits.

The plain loss materialises the logits of every token, ``(B, T_local, V)``,
upcasts them to fp32 and keeps them (and the log-softmax) for backward: at
16k tokens and a 152k vocabulary that is ~10 GB per rank. Here the LM head
matmul and the cross-entropy are one autograd Function:

- forward loops over chunks of ``chunk_tokens`` tokens: ``logits = h_c @ W^T
  (+ b)`` upcast to fp32, the per-token log-sum-exp ``lse`` and the target
  logit; returns ``sum over counted tokens of (lse - logit[label])``. It saves
  ``h``, ``W``, ``b``, the labels and ``lse`` (N floats) only.
- backward recomputes each chunk's logits, forms ``softmax - onehot =
  exp(logits - lse) - onehot`` (zero rows for ignored tokens), scaled by the
  incoming gradient, and accumulates ``dh_c = g_c @ W``, ``dW += g_c^T h_c``
  and ``db += sum g_c``.

Peak memory of the loss is then O(chunk_tokens x V) instead of O(N x V);
the price is one extra logits matmul (the recompute): 4 head matmuls per
step instead of 3. Results equal ``F.cross_entropy(h @ W^T + b, labels,
reduction="sum")`` to rounding (equal in fp64, tested). A tied LM head is
simply the embedding's Parameter passed as ``weight``: autograd adds this
gradient to the embedding's own.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100


def loss_dtype(dtype: torch.dtype) -> torch.dtype:
    """Dtype the loss is computed in: fp32 for 16-bit logits, else their own (fp32, fp64)."""
    return torch.promote_types(dtype, torch.float32)


def _check(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, labels: torch.Tensor,
           chunk_tokens: int) -> None:
    if isinstance(chunk_tokens, bool) or not isinstance(chunk_tokens, int) or chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be an int >= 1, got {chunk_tokens!r}")
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(f"hidden must be (N, D) and weight (V, D) with the same D; got hidden "
                         f"{tuple(hidden.shape)}, weight {tuple(weight.shape)}")
    if labels.shape != hidden.shape[:1] or labels.dtype != torch.long:
        raise ValueError(f"labels must be a LongTensor of shape ({hidden.shape[0]},), got "
                         f"{labels.dtype} {tuple(labels.shape)}")
    if bias is not None and bias.shape != weight.shape[:1]:
        raise ValueError(f"bias must be ({weight.shape[0]},), got {tuple(bias.shape)}")
    vocab = weight.shape[0]
    bad = ((labels < 0) & (labels != IGNORE_INDEX)) | (labels >= vocab)
    if bool(bad.any()):
        value = int(labels[bad][0])
        raise ValueError(f"labels must be in [0, {vocab}) or {IGNORE_INDEX} (ignored); found {value}")


def _chunk_logits(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """(c, D) -> (c, V) logits in the loss dtype (the head's matmul, then the upcast the plain loss does)."""
    logits = F.linear(h, weight, bias)
    return logits.to(loss_dtype(logits.dtype))


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    """``sum_i [lse_i - logit_i[y_i]]`` over counted tokens; see the module doc."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, chunk_tokens):
        n = hidden.shape[0]
        out_dtype = loss_dtype(torch.promote_types(hidden.dtype, weight.dtype))
        lse = torch.empty(n, dtype=out_dtype, device=hidden.device)
        total = torch.zeros((), dtype=out_dtype, device=hidden.device)
        for start in range(0, n, chunk_tokens):
            end = min(start + chunk_tokens, n)
            logits = _chunk_logits(hidden[start:end], weight, bias)
            y = labels[start:end]
            counted = y != IGNORE_INDEX
            lse_c = torch.logsumexp(logits, dim=-1)
            target = logits.gather(1, y.clamp(min=0)[:, None]).squeeze(1)
            total += torch.where(counted, lse_c - target, 0.0).sum()
            lse[start:end] = lse_c
            del logits
        ctx.save_for_backward(hidden, weight, bias, labels, lse)
        ctx.chunk_tokens = chunk_tokens
        return total

    @staticmethod
    def backward(ctx, grad_total):
        hidden, weight, bias, labels, lse = ctx.saved_tensors
        chunk = ctx.chunk_tokens
        n = hidden.shape[0]
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        # dW / db accumulate in fp32 at least (a bf16 head's gradient summed over chunks).
        acc_dtype = loss_dtype(weight.dtype)
        dh = torch.empty_like(hidden) if need_h else None
        dw = torch.zeros(weight.shape, dtype=acc_dtype, device=weight.device) if need_w else None
        db = torch.zeros(bias.shape, dtype=acc_dtype, device=bias.device) if need_b else None
        rows = torch.arange(min(chunk, n), device=hidden.device)
        for start in range(0, n, chunk):
            end = min(start + chunk, n)
            h = hidden[start:end]
            y = labels[start:end]
            counted = y != IGNORE_INDEX
            g = _chunk_logits(h, weight, bias)
            g.sub_(lse[start:end, None]).exp_()                       # softmax
            g[rows[: end - start], y.clamp(min=0)] -= 1.0              # - onehot
            g.mul_(torch.where(counted, grad_total.to(g.dtype), 0.0)[:, None])  # ignored rows -> 0
            if need_b:
                db += g.sum(0)
            g = g.to(hidden.dtype)
            if need_h:
                torch.mm(g, weight.to(hidden.dtype), out=dh[start:end])
            if need_w:
                if dw.dtype == h.dtype:
                    dw.addmm_(g.t(), h)
                else:
                    dw += (g.t() @ h).to(acc_dtype)
            del g
        dw = dw.to(weight.dtype) if need_w else None
        db = db.to(bias.dtype) if need_b else None
        return dh, dw, db, None, None


def chunked_cross_entropy_sums(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, *,
                               bias: torch.Tensor | None = None,
                               chunk_tokens: int = 4096) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum of token cross-entropies of the LM head ``hidden @ weight^T + bias``, and the counted tokens.

    Args:
        hidden: (B, T_local, D) or (N, D) final hidden states (after the final norm).
        weight: (V, D) LM head weight (the embedding's Parameter when tied).
        labels: (B, T_local) or (N,) target ids, ``-100`` = ignored.
        bias: (V,) LM head bias, or None.
        chunk_tokens: tokens per chunk; the loss holds at most (chunk_tokens, V) logits.
    Returns:
        ``(loss_sum, n_counted)``: a 0-d tensor in fp32 (fp64 for fp64 inputs),
        differentiable in ``hidden``, ``weight`` and ``bias``; and the number of
        labels != -100 (0-d long). Same values as
        ``plsh_dist.train.losses.token_loss_sums(F.linear(hidden, weight, bias), labels)``.
    """
    flat_h = hidden.reshape(-1, hidden.shape[-1])
    flat_y = labels.reshape(-1)
    _check(flat_h, weight, bias, flat_y, chunk_tokens)
    loss_sum = _ChunkedLinearCrossEntropy.apply(flat_h, weight, bias, flat_y, chunk_tokens)
    return loss_sum, (flat_y != IGNORE_INDEX).sum()
