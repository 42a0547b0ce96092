"""Varlen flash-attention kernels on CUDA (no padding), behind one signature.

The rows and ``cu_seqlens`` of a call come from :mod:`plsh_dist.ops.varlen.calls`:
every block is one "sequence" of a varlen call. Kernels (:class:`VarlenKernel`):

- the ``flash_attn`` package (``_flash_attn_varlen_forward/_backward``);
  argument lists differ between 2.5 and 2.6-2.8 (``window_size`` tuple vs
  ``window_size_left/right``, ``softcap``, returned tuple length): handled by
  reading the installed function's signature;
- ``ATEN``: PyTorch's own ``aten::_flash_attention_forward/_backward``
  (fp16/bf16 on CUDA), used by ``backend="torch"`` on CUDA;
- ``REFERENCE``: the same calls on padded explicit matmuls, any device
  (:mod:`plsh_dist.ops.varlen.reference`), so the CPU tests check everything
  around the kernels.

LSE layout: older builds of both libraries return the varlen LSE padded,
(nseq, H, max_seqlen), newer ones (H, total). :func:`varlen_fwd` always
returns (H, total) and says which layout the kernel gave; the strategy keeps that
in what it saves for the backward and hands it to :func:`varlen_bwd`, which gives the kernel back
the layout its forward produced (each library's backward wants its own
forward's).

Nothing here touches CUDA at import time.
Legend: R rows (tokens of all sequences), Hc query heads of the call, Hkc
key/value heads (Hc % Hkc == 0), D head dim.
"""

from __future__ import annotations

import enum
import functools
import inspect

import torch

from plsh_dist.ops.varlen.reference import reference_bwd, reference_fwd


class VarlenKernel(str, enum.Enum):
    """What computes one varlen call."""

    FLASH_ATTN = "flash_attn"
    """flash-attn's ``_flash_attn_varlen_forward/_backward``."""
    ATEN = "aten"
    """PyTorch's ``_flash_attention_forward/_backward`` (CUDA fp16/bf16)."""
    REFERENCE = "reference"
    """Padded explicit matmuls, any device: lets the CPU tests run everything around the CUDA kernels."""


@functools.lru_cache(maxsize=1)
def flash_attn_module():
    """flash-attn's ``flash_attn_interface`` module, or None when it cannot be imported."""
    try:
        from flash_attn import flash_attn_interface  # noqa: PLC0415 (optional GPU extra)
    except Exception:  # ImportError, or a CUDA build mismatch raising at import
        return None
    return flash_attn_interface


def cuda_half(device: torch.device, dtype: torch.dtype) -> bool:
    """CUDA tensors in fp16/bf16: what the varlen flash kernels accept."""
    return device.type == "cuda" and dtype in (torch.float16, torch.bfloat16)


def flash_attn_available(device: torch.device, dtype: torch.dtype) -> bool:
    """True when flash-attn is installed and supports tensors of this device/dtype."""
    return cuda_half(device, dtype) and flash_attn_module() is not None


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


def varlen_fwd(q_RHD, k_RHD, v_RHD, cu_seqlens, max_len: int, *, causal: bool, scale: float, kernel: VarlenKernel):
    """Varlen attention over the sequences ``cu_seqlens`` cuts the rows into.

    Args:
        q_RHD: (R, Hc, D); k_RHD, v_RHD: (R, Hkc, D), Hc % Hkc == 0.
        cu_seqlens: int32 (nseq + 1,) on q's device, ``[0, ..., R]``.
        max_len: longest sequence (host int: no device sync).
        kernel: ``FLASH_ATTN``, ``ATEN`` (PyTorch's CUDA flash kernels) or
            ``REFERENCE`` (padded explicit matmuls on any device; for the CPU tests
            of the row layouts, chunking and merging around the kernels).
    Returns out (R, Hc, D) in q's dtype, lse (Hc, R) fp32, and whether the kernel gave
    its LSE padded (:func:`varlen_bwd` then wants it so).
    """
    q, k, v = q_RHD, k_RHD, v_RHD
    cu = cu_seqlens
    if kernel == VarlenKernel.REFERENCE:
        return (*reference_fwd(q, k, v, cu, causal=causal, scale=scale), False)
    if kernel == VarlenKernel.FLASH_ATTN:
        values = dict(
            q=q, k=k, v=v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=max_len, max_seqlen_k=max_len,
            dropout_p=0.0, softmax_scale=scale, causal=causal, window_size=(-1, -1), window_size_left=-1,
            window_size_right=-1, softcap=0.0, alibi_slopes=None, return_softmax=False,
        )
        res = _call(flash_attn_module()._flash_attn_varlen_forward, values)
        out, lse = (res[0], res[5]) if len(res) == 8 else (res[0], res[1])
    else:
        out, lse, *_ = torch.ops.aten._flash_attention_forward(
            q, k, v, cu, cu, max_len, max_len, 0.0, causal, False, scale=scale
        )
    return out, _unpad_lse(lse, cu, q.shape[0]), lse.dim() == 3


def varlen_bwd(dout_RHD, q_RHD, k_RHD, v_RHD, out_RHD, lse_HR, cu_seqlens, max_len: int,
               *, causal: bool, scale: float, kernel: VarlenKernel, lse_padded: bool = False):
    """Backward of :func:`varlen_fwd` given the merged ``out`` (R, Hc, D) and ``lse`` (Hc, R).

    ``lse_padded``: what :func:`varlen_fwd` returned for this kernel (the kernel gets its LSE
    back in that layout).

    Returns dq (R, Hc, D), dk, dv (R, Hkc, D) in the inputs' dtype.
    """
    cu = cu_seqlens
    dout, q, k, v, out = (x.contiguous() for x in (dout_RHD, q_RHD, k_RHD, v_RHD, out_RHD))
    if kernel == VarlenKernel.REFERENCE:
        return reference_bwd(dout, q, k, v, out, lse_HR.contiguous(), cu, causal=causal, scale=scale)
    lse = lse_HR.float().contiguous()
    if lse_padded:
        lse = _repad_lse(lse, cu, max_len)
    if kernel == VarlenKernel.FLASH_ATTN:
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        values = dict(
            dout=dout, q=q, k=k, v=v, out=out, softmax_lse=lse, dq=dq, dk=dk, dv=dv, cu_seqlens_q=cu,
            cu_seqlens_k=cu, max_seqlen_q=max_len, max_seqlen_k=max_len, dropout_p=0.0, softmax_scale=scale,
            causal=causal, window_size=(-1, -1), window_size_left=-1, window_size_right=-1, softcap=0.0,
            alibi_slopes=None, deterministic=False, rng_state=None,
        )
        _call(flash_attn_module()._flash_attn_varlen_backward, values)
    else:
        seed = torch.zeros((), dtype=torch.int64, device=q.device)
        dq, dk, dv = torch.ops.aten._flash_attention_backward(
            dout, q, k, v, out, lse, cu, cu, max_len, max_len, 0.0, causal, seed, seed, scale=scale
        )
    return dq, dk, dv


def _repad_lse(lse_H_total: torch.Tensor, cu: torch.Tensor, max_len: int) -> torch.Tensor:
    """(H, total) -> the padded (nseq, H, max_seqlen) varlen LSE layout."""
    nseq, H = cu.numel() - 1, lse_H_total.shape[0]
    padded = lse_H_total.new_zeros(nseq, H, max_len)
    lengths = (cu[1:] - cu[:-1]).long()
    idx = torch.arange(max_len, device=lse_H_total.device)[None, :] < lengths[:, None]
    padded.permute(1, 0, 2)[:, idx] = lse_H_total
    return padded
