"""Block attention with varlen flash-attention on CUDA (no padding).

The block boundaries of one (sample, head-group) become ``cu_seqlens``: every
block is one "sequence" of a varlen call. Two providers:

- the ``flash_attn`` package (``_flash_attn_varlen_forward/_backward``);
  argument lists differ between 2.5 and 2.6-2.8 (``window_size`` tuple vs
  ``window_size_left/right``, ``softcap``, returned tuple length) and so does
  the varlen LSE layout ((H, total) vs padded (nseq, H, max_seqlen)); both are
  handled by reading the installed function's signature;
- PyTorch's own ``aten::_flash_attention_forward/_backward`` (fp16/bf16 on
  CUDA), used by ``backend="torch"`` on CUDA.

Nothing here touches CUDA at import time.
Legend: B batch, n tokens, G query heads, Gk key/value heads (G % Gk == 0).
"""

from __future__ import annotations

import functools
import inspect

import torch

__all__ = ["flash_attn_available", "varlen_fwd", "varlen_bwd", "batched_cu_seqlens"]


@functools.lru_cache(maxsize=1)
def _flash_attn_module():
    try:
        from flash_attn import flash_attn_interface  # noqa: PLC0415 (optional GPU extra)
    except Exception:  # ImportError, or a CUDA build mismatch raising at import
        return None
    return flash_attn_interface


def flash_attn_available(device: torch.device, dtype: torch.dtype) -> bool:
    """True when flash-attn is installed and supports tensors of this device/dtype."""
    return device.type == "cuda" and dtype in (torch.float16, torch.bfloat16) and _flash_attn_module() is not None


def batched_cu_seqlens(cu_seqlens: torch.Tensor, batch: int, n: int) -> torch.Tensor:
    """Offsets of one sequence's blocks repeated for ``batch`` rows of ``n`` tokens."""
    per_row = cu_seqlens[:-1].to(torch.int32)
    rows = torch.arange(batch, device=cu_seqlens.device, dtype=torch.int32)[:, None] * n
    total = torch.tensor([batch * n], dtype=torch.int32, device=cu_seqlens.device)
    return torch.cat([(rows + per_row[None, :]).flatten(), total])


@functools.lru_cache(maxsize=8)
def _param_names(fn) -> tuple[str, ...]:
    """Parameter names of an installed flash-attn function (read once, not per call)."""
    return tuple(inspect.signature(fn).parameters)


def _call(fn, values: dict):
    """Call ``fn`` passing, by name, every parameter it has that ``values`` knows."""
    return fn(**{name: values[name] for name in _param_names(fn) if name in values})


def _unpad_lse(lse: torch.Tensor, cu: torch.Tensor, total: int) -> torch.Tensor:
    """Varlen LSE -> (H, total): new layout passes through, old padded one is unpadded."""
    if lse.dim() == 2:
        return lse
    # (nseq, H, max_seqlen) padded layout of flash-attn < 2.6 / aten.
    lengths = (cu[1:] - cu[:-1]).long()
    idx = torch.arange(lse.shape[-1], device=lse.device)[None, :] < lengths[:, None]
    return lse.permute(1, 0, 2)[:, idx]


def varlen_fwd(q_BnGD, k_BnGD, v_BnGD, cu_seqlens, max_len: int, *, causal: bool, scale: float, provider: str):
    """Returns out (B, n, G, D) and lse (B, G, n) fp32."""
    B, n, G, D = q_BnGD.shape
    cu = batched_cu_seqlens(cu_seqlens, B, n)
    q, k, v = (x.reshape(B * n, x.shape[2], D) for x in (q_BnGD, k_BnGD, v_BnGD))
    if provider == "flash_attn":
        values = dict(
            q=q, k=k, v=v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=max_len, max_seqlen_k=max_len,
            dropout_p=0.0, softmax_scale=scale, causal=causal, window_size=(-1, -1), window_size_left=-1,
            window_size_right=-1, softcap=0.0, alibi_slopes=None, return_softmax=False,
        )
        res = _call(_flash_attn_module()._flash_attn_varlen_forward, values)
        out, lse = (res[0], res[5]) if len(res) == 8 else (res[0], res[1])
    else:
        out, lse, *_ = torch.ops.aten._flash_attention_forward(
            q, k, v, cu, cu, max_len, max_len, 0.0, causal, False, scale=scale
        )
    lse = _unpad_lse(lse, cu, B * n)  # (G, B * n)
    return out.view(B, n, G, D), lse.view(G, B, n).transpose(0, 1)


def varlen_bwd(dout_BnGD, q_BnGD, k_BnGD, v_BnGD, out_BnGD, lse_BGn, cu_seqlens, max_len: int,
               *, causal: bool, scale: float, provider: str):
    """Backward with the merged out/lse. Returns dq (B, n, G, D), dk, dv (B, n, Gk, D)."""
    B, n, G, D = q_BnGD.shape
    cu = batched_cu_seqlens(cu_seqlens, B, n)
    dout, q, out = (x.reshape(B * n, G, D).contiguous() for x in (dout_BnGD, q_BnGD, out_BnGD))
    k, v = (x.reshape(B * n, x.shape[2], D).contiguous() for x in (k_BnGD, v_BnGD))
    lse = lse_BGn.transpose(0, 1).reshape(G, B * n).float().contiguous()
    if provider == "flash_attn":
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        lse = _repad_lse_if_needed(_flash_attn_module()._flash_attn_varlen_backward, lse, cu, max_len)
        values = dict(
            dout=dout, q=q, k=k, v=v, out=out, softmax_lse=lse, dq=dq, dk=dk, dv=dv, cu_seqlens_q=cu,
            cu_seqlens_k=cu, max_seqlen_q=max_len, max_seqlen_k=max_len, dropout_p=0.0, softmax_scale=scale,
            causal=causal, window_size=(-1, -1), window_size_left=-1, window_size_right=-1, softcap=0.0,
            alibi_slopes=None, deterministic=False, rng_state=None,
        )
        _call(_flash_attn_module()._flash_attn_varlen_backward, values)
    else:
        seed = torch.zeros((), dtype=torch.int64, device=q.device)
        dq, dk, dv = torch.ops.aten._flash_attention_backward(
            dout, q, k, v, out, lse, cu, cu, max_len, max_len, 0.0, causal, seed, seed, scale=scale
        )
    return dq.view(B, n, G, D), dk.view(B, n, -1, D), dv.view(B, n, -1, D)


def _repad_lse_if_needed(fn, lse_H_total: torch.Tensor, cu: torch.Tensor, max_len: int) -> torch.Tensor:
    """flash-attn < 2.6 wants the padded (nseq, H, max_seqlen) LSE in its varlen backward."""
    if "softcap" in _param_names(fn):
        return lse_H_total
    nseq, H = cu.numel() - 1, lse_H_total.shape[0]
    padded = lse_H_total.new_zeros(nseq, H, max_len)
    lengths = (cu[1:] - cu[:-1]).long()
    idx = torch.arange(max_len, device=lse_H_total.device)[None, :] < lengths[:, None]
    padded.permute(1, 0, 2)[:, idx] = lse_H_total
    return padded
