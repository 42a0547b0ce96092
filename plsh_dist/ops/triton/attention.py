"""The one-pass estimator as one fused Triton kernel, forward and backward.

``out = softmax(q k^T scale + bias) v`` over banded tiles
(:mod:`plsh_dist.ops.triton.kernels`), with the bias

- ``log c_ij`` of a :class:`~plsh_dist.hashing.PositionalLSH` (PLSH one pass,
  docs/design.md, section 1, "The one-pass form"; fixed blocks are the one-sample hash of pitch ``2 sigma``),
  counted inside each tile from the hash's pitch and shift: no count table,
  no host synchronisation (beyond ``UNROLLED_SAMPLES`` samples the launcher
  adds one table per call, the hash's blocks as runs of tokens for the tiles
  that meet their rows, :class:`~plsh_dist.ops.triton.near_runs.NearBlocks`, built on the device);
- or exact ALiBi inside a per-head window (:class:`~plsh_dist.ops.triton.tile_bands.WindowBias`).

Each query tile visits only the key tiles of its band
(:func:`~plsh_dist.ops.triton.tile_bands.query_tile_bands`), each key tile in backward
only the query tiles whose band meets it. Backward: one kernel for dK/dV
(each program sums the query heads of its GQA group, so no atomics: the
result is deterministic) and one for dQ, from the saved ``out`` and ``lse``
as flash attention's backward.

On CUDA tensors the kernels are compiled; on CPU tensors they run under
Triton's interpreter (numpy; fp32 and fp16 inputs: its ``tl.dot`` is wrong
for bf16), which needs ``TRITON_INTERPRET=1`` set before ``triton`` is
imported (Triton decorates its own library at import).

Legend: B batch, n tokens, Hq / Hkv query / key-value heads, D head dim,
s samples, Hh bias heads (1 shared, Hq per head).
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

import torch

from plsh_dist.hashing import PositionalLSH
from plsh_dist.ops.documents import Documents
from plsh_dist.ops.triton.kernel_bias import KernelBias
from plsh_dist.ops.triton.call_tables import cached_kernel_bias, near_args
from plsh_dist.ops.strategy import Strategy
from plsh_dist.ops.triton.tile_bands import TileConfig, WindowBias, num_tiles, tiles_for
from plsh_dist.ops.triton.token_layout import TokenLayout
from plsh_dist.ops.triton.runtime import interpreting, kernels_module, launcher, triton_status  # noqa: F401

LOG2E = 1.4426950408889634
_log = logging.getLogger(__name__)


def kernels():
    """The kernels module (compiled, or interpreted when :func:`interpreting`)."""
    return kernels_module("kernels")


def _launch(device: torch.device):
    """The kernels module for tensors on ``device``; CPU tensors need the interpreter."""
    return launcher("kernels", device)


def _padded(head_dim: int) -> int:
    """The head dim the kernels tile: a power of two >= 16 (``tl.dot``'s smallest)."""
    return max(16, 1 << (head_dim - 1).bit_length())


def _arch(device: torch.device) -> int:
    """Compute capability major of ``device`` (9, Hopper's tiles, on the CPU interpreter)."""
    return torch.cuda.get_device_capability(device)[0] if device.type == "cuda" else 9


def kernel_tiles(q: torch.Tensor) -> tuple[TileConfig, TileConfig, TileConfig]:
    """The (forward, dK/dV, dQ) tiles of the kernels for ``q``'s head dim on its device."""
    return tiles_for(q.shape[-1], _arch(q.device))


def _check(q, k, v, layout: TokenLayout, bias):
    B, n, Hq, D = q.shape
    if layout.n != n:
        raise ValueError(f"positions must have one entry per token: {layout.n} for n={n}")
    if layout.doc is not None and B != 1:
        raise ValueError(f"documents run as one flat row (B=1), got B={B}: flatten the rows first "
                         "(plsh_dist.ops.documents.flatten_rows)")
    if bias.num_heads not in (1, Hq):
        raise ValueError(f"the bias has {bias.num_heads} heads; it needs 1 (shared) or Hq={Hq}")
    if not 1 <= D <= 128:
        raise ValueError(f"head_dim must be at most 128 for the Triton kernel, got {D}; use method='per_sample' "
                         "or backend='torch'")
    if any(x.stride(-1) != 1 for x in (q, k, v)):
        raise ValueError("q, k, v need a unit stride on the head dim (call .contiguous())")


def banded_forward(q, k, v, bias, layout: TokenLayout, *, causal: bool, scale: float,
                   kernel_bias: KernelBias | None = None, emulate_bf16: bool = False):
    """Forward of ``softmax(q k^T scale + bias) v``.

    q: (B, n, Hq, D); k, v: (B, n, Hkv, D); bias: CountBias or WindowBias on q's device;
    kernel_bias: its :class:`KernelBias` when the caller keeps one for the backward.
    emulate_bf16 (tests, fp32 inputs holding bf16 values): p rounded to bf16 before its
    product, as the compiled bf16 kernel does.
    Returns out (B, n, Hq, D) in q's dtype and lse (B, Hq, n) fp32 (flash-attn's layout).
    """
    _check(q, k, v, layout, bias)
    B, n, Hq, D = q.shape
    Hkv = k.shape[2]
    tiles = kernel_tiles(q)
    cfg = tiles[0]
    out = torch.empty_like(q)
    lse = torch.empty(B, Hq, n, dtype=torch.float32, device=q.device)
    mod = _launch(q.device)
    grid = (num_tiles(n, cfg.block_m), B * Hq)
    kb = kernel_bias if kernel_bias is not None else KernelBias.of(bias, layout, causal, tiles)
    t = kb.fwd
    mod.onepass_fwd_kernel[grid](
        q, k, v, out, lse, layout.kernel_positions, _doc(layout), *t.args, t.lo, t.hi, *near_args(kb, q.device),
        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *out.stride()[:3],
        n, Hq, Hq // Hkv, grid[0], scale * LOG2E,
        HEAD_DIM=_padded(D), D_REAL=D, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, CAUSAL=causal,
        HAS_DOCS=layout.doc is not None, PER_HEAD=bias.num_heads > 1, IEEE=q.dtype == torch.float32,
        EMULATE_BF16=emulate_bf16, num_warps=cfg.num_warps, num_stages=cfg.num_stages, **t.consts,
    )
    return out, lse


def banded_backward(dout, q, k, v, out, lse, bias, layout: TokenLayout, *, causal: bool, scale: float,
                    kernel_bias: KernelBias | None = None, emulate_bf16: bool = False):
    """Gradients of :func:`banded_forward` from its ``out`` and ``lse`` (a row that saw no key,
    lse = -inf, gets zero gradients).

    Returns dq (B, n, Hq, D), dk, dv (B, n, Hkv, D) in the inputs' dtypes.
    """
    _check(q, k, v, layout, bias)
    B, n, Hq, D = q.shape
    Hkv = k.shape[2]
    tiles = kernel_tiles(q)
    _, kv_cfg, q_cfg = tiles
    kb = kernel_bias if kernel_bias is not None else KernelBias.of(bias, layout, causal, tiles)
    dout = dout.contiguous() if dout.stride(-1) != 1 else dout
    # D_i = rowsum(dO o O), fp32 (B, Hq, n) like lse: one fp32 temporary of dout's shape
    delta = dout.to(torch.float32, copy=True).mul_(out).sum(-1).transpose(1, 2).contiguous()
    lse = lse.float().contiguous()
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    mod = _launch(q.device)
    common = dict(HEAD_DIM=_padded(D), D_REAL=D, CAUSAL=causal, HAS_DOCS=layout.doc is not None,
                  PER_HEAD=bias.num_heads > 1, IEEE=q.dtype == torch.float32, EMULATE_BF16=emulate_bf16)
    strides = (*q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *dout.stride()[:3])
    near = near_args(kb, q.device)
    t = kb.dkdv
    nk, nq = num_tiles(n, kv_cfg.block_n), num_tiles(n, kv_cfg.block_m)
    mod.onepass_bwd_dkdv_kernel[(nk, B * Hkv)](
        q, k, v, dout, lse, delta, dk, dv, layout.kernel_positions, _doc(layout), *t.args,
        t.lo, t.hi, *near, *strides, *dk.stride()[:3], *dv.stride()[:3],
        n, Hq, Hkv, Hq // Hkv, nk, nq, scale, scale * LOG2E, **common, **t.consts, **_launch_shape(kv_cfg),
    )
    t = kb.dq
    nq = num_tiles(n, q_cfg.block_m)
    mod.onepass_bwd_dq_kernel[(nq, B * Hq)](
        q, k, v, dout, lse, delta, dq, layout.kernel_positions, _doc(layout), *t.args,
        t.lo, t.hi, *near, *strides, *dq.stride()[:3],
        n, Hq, Hq // Hkv, nq, scale, scale * LOG2E, **common, **t.consts, **_launch_shape(q_cfg),
    )
    return dq, dk, dv


def _launch_shape(cfg) -> dict:
    return dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, num_warps=cfg.num_warps, num_stages=cfg.num_stages)


def _doc(layout: TokenLayout) -> torch.Tensor:
    """Document ids for the kernel (a dummy when there are none: never read)."""
    return layout.doc if layout.doc is not None else layout.kernel_positions


# -- PLSH: the contract of plsh_dist.ops.cpu.onepass, and the dispatch table's strategy -----


def triton_onepass_forward(q, k, v, lsh: PositionalLSH, positions: torch.Tensor, *, causal: bool, scale: float,
                           docs: Documents | TokenLayout | None = None):
    """One-pass PLSH forward on the Triton kernel (contract of ``onepass_forward``).

    q: (B, n, Hq, D); k, v: (B, n, Hkv, D); positions CPU LongTensor[n] (within each
    document of ``docs``, a batch-1 call's documents; or their layout built on the device,
    :meth:`~plsh_dist.ops.triton.token_layout.TokenLayout.build_on_device`, with its positions). Returns out
    (B, n, Hq, D) in q's dtype, lse (B, Hq, n) fp32.
    """
    return _plsh_forward(q, k, v, lsh, positions, causal=causal, scale=scale, docs=docs)[:2]


def _plsh_forward(q, k, v, lsh, positions, *, causal, scale, docs=None):
    """(out, lse, the call's :class:`KernelBias`, kept for the backward)."""
    kb = cached_kernel_bias(lsh, positions, docs, causal, q.device, kernel_tiles(q))
    return (*banded_forward(q, k, v, kb.bias, kb.layout, causal=causal, scale=scale, kernel_bias=kb), kb)


def triton_onepass_backward(dout, q, k, v, out, lse, lsh: PositionalLSH, positions: torch.Tensor, *, causal: bool,
                            scale: float, docs: Documents | TokenLayout | None = None,
                            kernel_bias: KernelBias | None = None):
    """Gradients of :func:`triton_onepass_forward`: dq (B, n, Hq, D), dk, dv (B, n, Hkv, D).
    ``kernel_bias``: the forward's (what :meth:`TritonOnePass.forward` saved), else rebuilt."""
    if kernel_bias is None:
        kernel_bias = cached_kernel_bias(lsh, positions, docs, causal, q.device, kernel_tiles(q))
    return banded_backward(dout, q, k, v, out, lse, kernel_bias.bias, kernel_bias.layout, causal=causal,
                           scale=scale, kernel_bias=kernel_bias)


@dataclass(frozen=True)
class TritonOnePass(Strategy):
    """Strategy (:mod:`plsh_dist.ops.backends`): the one-pass estimator on the fused Triton kernel."""

    onepass = keeps_host_state = device_positions = True
    cost_model = "fused"

    def forward(self, q, k, v, lsh, positions, *, causal, scale, docs=None):
        """``(out, lse, saved)``; ``saved`` is the call's :class:`KernelBias` (block bounds, shared with
        the backward, which recomputes the counts from them)."""
        return _plsh_forward(q, k, v, lsh, positions, causal=causal, scale=scale, docs=docs)

    def backward(self, dout, q, k, v, out, lse, lsh, positions, *, causal, scale, docs=None, saved=None):
        """``(dq, dk, dv)``."""
        return triton_onepass_backward(dout, q, k, v, out, lse, lsh, positions, causal=causal, scale=scale,
                                       docs=docs, kernel_bias=saved)


#: dtypes the kernel takes (fp32 accumulation; fp32 inputs use IEEE fp32 products).
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def triton_cuda(device: torch.device, dtype: torch.dtype) -> bool:
    """Where the compiled kernel runs: CUDA tensors, Triton importable, compute capability
    >= 8.0 (not checked without a CUDA runtime: a plan for a GPU machine made elsewhere).
    Says once in the log why not, where the kernel is what is missing."""
    if device.type != "cuda" or dtype not in _DTYPES:
        return False
    why = triton_status()
    if why is not None:
        _say_once(f"PLSH on CUDA runs without the fused Triton kernel: {why}")
        return False
    if torch.cuda.is_available() and torch.cuda.get_device_capability(device)[0] < 8:
        _say_once("PLSH on CUDA runs without the fused Triton kernel: it needs compute capability >= 8.0")
        return False
    return True


def triton_interpreter(device: torch.device, dtype: torch.dtype) -> bool:
    """Where the kernel runs under Triton's CPU interpreter (tests: ``backend="triton"`` only)."""
    return device.type == "cpu" and dtype in (torch.float16, torch.float32) and triton_status() is None \
        and interpreting()


@functools.lru_cache(maxsize=8)
def _say_once(message: str) -> None:
    _log.warning(message)


class BandedAttentionFunction(torch.autograd.Function):
    """Autograd over :func:`banded_forward`: saves q, k, v, out, lse. Returns (out, lse);
    lse is not differentiable."""

    @staticmethod
    def forward(ctx, q, k, v, bias, layout, causal, scale):
        kb = KernelBias.of(bias, layout, causal, kernel_tiles(q))
        out, lse = banded_forward(q, k, v, bias, layout, causal=causal, scale=scale, kernel_bias=kb)
        ctx.mark_non_differentiable(lse)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.bias, ctx.layout, ctx.causal, ctx.scale, ctx.kernel_bias = bias, layout, causal, scale, kb
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = banded_backward(dout, q, k, v, out, lse, ctx.bias, ctx.layout, causal=ctx.causal,
                                     scale=ctx.scale, kernel_bias=ctx.kernel_bias)
        return dq, dk, dv, None, None, None, None


def alibi_window_attention(q, k, v, *, sigma, window, positions: torch.Tensor | None = None, causal: bool = True,
                           softmax_scale: float | None = None, docs: Documents | None = None):
    """Exact ALiBi inside a per-head window on the banded kernel, differentiable.

    ``out_i = softmax_j(q_i . k_j scale - |p_i - p_j| / sigma_h) v`` over keys with
    ``|p_i - p_j| < window_h`` (and ``j <= i`` when causal); each head visits only
    the key tiles of its own window.

    Args:
        q: (B, n, Hq, D); k, v: (B, n, Hkv, D).
        sigma: float or Tensor[Hq] (``1 / slope_h``); window: int or Tensor[Hq] >= 1.
        positions: CPU LongTensor[n] increasing (default arange(n)).
        docs: documents of a batch-1 call (keys of other documents are hidden).
    Returns:
        out (B, n, Hq, D) in q's dtype, lse (B, Hq, n) fp32.
    """
    n = q.shape[1]
    positions = torch.arange(n) if positions is None else positions
    sig = torch.as_tensor(sigma, dtype=torch.float32).reshape(-1)
    win = torch.as_tensor(window, dtype=torch.int64).reshape(-1)
    if sig.numel() != win.numel():  # one of them shared: repeat it to the other's heads
        H = max(sig.numel(), win.numel())
        sig, win = sig.expand(H).contiguous(), win.expand(H).contiguous()
    bias = WindowBias.of(sig, win, q.device)
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    layout = TokenLayout.build(positions, q.device, docs)
    return BandedAttentionFunction.apply(q, k, v, bias, layout, causal, scale)
