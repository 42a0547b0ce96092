"""Plain causal flash attention in Triton, for calibrating the static cost model only.

The static model (:mod:`tools.kernel_model.sass_model`) bounds a kernel's useful
throughput from its compiled code. Its yardstick is this kernel: causal
attention without bias, in the style of Triton's fused-attention tutorial
(base-2 online softmax; backward in two kernels, dK/dV per key tile with the
products transposed so the key tile is the matrix instructions' M, and dQ per
query tile, from the saved ``lse`` and ``delta = rowsum(dO * O)``). Nothing
in training calls it.

Each program's loop runs over the tiles strictly off the diagonal without a
mask; the tiles on the diagonal (``BLOCK_M // BLOCK_N`` of them, or the
other way round) come after it, unrolled, with the causal mask. So the
compiled code has one loop per kernel, the steady state the model reads.

Layouts as the project's kernels: q, k, v, out, dq, dk, dv (B, T, H, D) with
a unit last stride; lse, delta (B, H, T) fp32, lse in natural log. T must be a
multiple of the tiles (the calibration's shapes are).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from plsh_dist.ops.triton.tile_bands import TileConfig

LOG2E = 1.4426950408889634


#: (compute capability major, head dim) -> (forward, dK/dV, dQ): the tutorial's shapes (Hopper:
#: 128 x 128 forward at 8 warps, 3 stages; 128-key dK/dV and 128-query dQ tiles, so that wgmma
#: runs on 64-row warpgroup slices), smaller on Ampere for its 164 KiB of shared memory and its
#: registers (at D = 128 its backward still spills: results/triton/sass.md).
TILES = {
    (9, 64): (TileConfig(128, 128, 8, 3), TileConfig(64, 128, 8, 2), TileConfig(128, 64, 8, 2)),
    (9, 128): (TileConfig(128, 128, 8, 3), TileConfig(32, 128, 8, 2), TileConfig(128, 64, 8, 2)),
    (8, 64): (TileConfig(128, 64, 8, 3), TileConfig(64, 64, 4, 2), TileConfig(64, 64, 4, 2)),
    (8, 128): (TileConfig(64, 64, 8, 2), TileConfig(64, 64, 8, 2), TileConfig(64, 64, 8, 2)),
}


def tiles_for(head_dim: int, arch: int) -> tuple[TileConfig, TileConfig, TileConfig]:
    if head_dim not in (64, 128):
        raise ValueError(f"the calibration kernel is built for head dims 64 and 128, got {head_dim}")
    return TILES[(min(max(arch, 8), 9), head_dim)]


@triton.jit
def _fwd_tile(acc, l_i, m_i, q, K_h, V_h, start_n, offs_m, rel_n, offs_d, stride_kt, stride_vt, scale_log2,
              BLOCK_N: tl.constexpr, MASK: tl.constexpr):
    k = tl.load(K_h + (start_n + rel_n)[:, None] * stride_kt + offs_d[None, :])
    v = tl.load(V_h + (start_n + rel_n)[:, None] * stride_vt + offs_d[None, :])
    qk = tl.dot(q, tl.trans(k)) * scale_log2
    if MASK:
        qk = tl.where(offs_m[:, None] >= (start_n + rel_n)[None, :], qk, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    p = tl.exp2(qk - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return acc, l_i, m_new


@triton.jit
def flash_fwd_kernel(Q, K, V, Out, Lse, stride_qb, stride_qt, stride_qh, stride_kb, stride_kt, stride_kh,
                     stride_vb, stride_vt, stride_vh, stride_ob, stride_ot, stride_oh, n_tokens, num_heads,
                     scale_log2, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Grid (T / BLOCK_M, B * H): out and lse of one query tile."""
    m = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // num_heads).to(tl.int64)
    h = (bh % num_heads).to(tl.int64)
    offs_m = m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    rel_n = tl.arange(0, BLOCK_N)
    q = tl.load(Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qt + offs_d[None, :])
    K_h = K + b * stride_kb + h * stride_kh
    V_h = V + b * stride_vb + h * stride_vh
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    for start_n in range(0, m * BLOCK_M, BLOCK_N):  # strictly below the diagonal: no mask
        acc, l_i, m_i = _fwd_tile(acc, l_i, m_i, q, K_h, V_h, start_n, offs_m, rel_n, offs_d, stride_kt, stride_vt,
                                  scale_log2, BLOCK_N, False)
    for d in tl.static_range(BLOCK_M // BLOCK_N):  # the diagonal, masked
        acc, l_i, m_i = _fwd_tile(acc, l_i, m_i, q, K_h, V_h, m * BLOCK_M + d * BLOCK_N, offs_m, rel_n, offs_d,
                                  stride_kt, stride_vt, scale_log2, BLOCK_N, True)
    out = acc / l_i[:, None]
    tl.store(Out + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_ot + offs_d[None, :],
             out.to(Out.dtype.element_ty))
    tl.store(Lse + bh.to(tl.int64) * n_tokens + offs_m, (m_i + tl.log2(l_i)) / 1.4426950408889634)


@triton.jit
def _dkdv_tile(dk, dv, k, v, Q_h, DO_h, Lse_h, Delta_h, start_m, offs_n, rel_m, offs_d, stride_qt, stride_dot,
               scale_log2, MASK: tl.constexpr):
    offs_m = start_m + rel_m
    q = tl.load(Q_h + offs_m[:, None] * stride_qt + offs_d[None, :])
    do = tl.load(DO_h + offs_m[:, None] * stride_dot + offs_d[None, :])
    lse2 = tl.load(Lse_h + offs_m) * 1.4426950408889634
    delta = tl.load(Delta_h + offs_m)
    pT = tl.exp2(tl.dot(k, tl.trans(q)) * scale_log2 - lse2[None, :])  # (BLOCK_N, BLOCK_M)
    if MASK:
        pT = tl.where(offs_m[None, :] >= offs_n[:, None], pT, 0.0)
    dv += tl.dot(pT.to(do.dtype), do)
    dpT = tl.dot(v, tl.trans(do))
    dsT = pT * (dpT - delta[None, :])
    dk += tl.dot(dsT.to(q.dtype), q)
    return dk, dv


@triton.jit
def flash_bwd_dkdv_kernel(Q, K, V, DO, Lse, Delta, DK, DV, stride_qb, stride_qt, stride_qh, stride_kb, stride_kt,
                          stride_kh, stride_vb, stride_vt, stride_vh, stride_dob, stride_dot, stride_doh, n_tokens,
                          num_heads, scale, scale_log2, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                          BLOCK_N: tl.constexpr):
    """Grid (T / BLOCK_N, B * H): dK, dV of one key tile (dK, dV strided as K, V)."""
    nt = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // num_heads).to(tl.int64)
    h = (bh % num_heads).to(tl.int64)
    offs_n = nt * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    rel_m = tl.arange(0, BLOCK_M)
    k = tl.load(K + b * stride_kb + h * stride_kh + offs_n[:, None] * stride_kt + offs_d[None, :])
    v = tl.load(V + b * stride_vb + h * stride_vh + offs_n[:, None] * stride_vt + offs_d[None, :])
    Q_h = Q + b * stride_qb + h * stride_qh
    DO_h = DO + b * stride_dob + h * stride_doh
    Lse_h = Lse + bh.to(tl.int64) * n_tokens
    Delta_h = Delta + bh.to(tl.int64) * n_tokens
    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    for d in tl.static_range(BLOCK_N // BLOCK_M):  # the diagonal, masked
        dk, dv = _dkdv_tile(dk, dv, k, v, Q_h, DO_h, Lse_h, Delta_h, nt * BLOCK_N + d * BLOCK_M, offs_n, rel_m,
                            offs_d, stride_qt, stride_dot, scale_log2, True)
    for start_m in range((nt + 1) * BLOCK_N, n_tokens, BLOCK_M):  # strictly below it: no mask
        dk, dv = _dkdv_tile(dk, dv, k, v, Q_h, DO_h, Lse_h, Delta_h, start_m, offs_n, rel_m, offs_d, stride_qt,
                            stride_dot, scale_log2, False)
    ptr = b * stride_kb + h * stride_kh + offs_n[:, None] * stride_kt + offs_d[None, :]
    tl.store(DK + ptr, (dk * scale).to(DK.dtype.element_ty))
    tl.store(DV + b * stride_vb + h * stride_vh + offs_n[:, None] * stride_vt + offs_d[None, :],
             dv.to(DV.dtype.element_ty))


@triton.jit
def _dq_tile(dq, q, do, lse2, delta, K_h, V_h, start_n, offs_m, rel_n, offs_d, stride_kt, stride_vt, scale_log2,
             MASK: tl.constexpr):
    offs_n = start_n + rel_n
    k = tl.load(K_h + offs_n[:, None] * stride_kt + offs_d[None, :])
    v = tl.load(V_h + offs_n[:, None] * stride_vt + offs_d[None, :])
    p = tl.exp2(tl.dot(q, tl.trans(k)) * scale_log2 - lse2[:, None])
    if MASK:
        p = tl.where(offs_m[:, None] >= offs_n[None, :], p, 0.0)
    dp = tl.dot(do, tl.trans(v))
    ds = p * (dp - delta[:, None])
    dq += tl.dot(ds.to(k.dtype), k)
    return dq


@triton.jit
def flash_bwd_dq_kernel(Q, K, V, DO, Lse, Delta, DQ, stride_qb, stride_qt, stride_qh, stride_kb, stride_kt, stride_kh,
                        stride_vb, stride_vt, stride_vh, stride_dob, stride_dot, stride_doh, n_tokens, num_heads,
                        scale, scale_log2, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Grid (T / BLOCK_M, B * H): dQ of one query tile (strided as Q)."""
    m = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // num_heads).to(tl.int64)
    h = (bh % num_heads).to(tl.int64)
    offs_m = m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    rel_n = tl.arange(0, BLOCK_N)
    q_ptr = b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qt + offs_d[None, :]
    q = tl.load(Q + q_ptr)
    do = tl.load(DO + b * stride_dob + h * stride_doh + offs_m[:, None] * stride_dot + offs_d[None, :])
    lse2 = tl.load(Lse + bh.to(tl.int64) * n_tokens + offs_m) * 1.4426950408889634
    delta = tl.load(Delta + bh.to(tl.int64) * n_tokens + offs_m)
    K_h = K + b * stride_kb + h * stride_kh
    V_h = V + b * stride_vb + h * stride_vh
    dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    for start_n in range(0, m * BLOCK_M, BLOCK_N):  # strictly below the diagonal: no mask
        dq = _dq_tile(dq, q, do, lse2, delta, K_h, V_h, start_n, offs_m, rel_n, offs_d, stride_kt, stride_vt,
                      scale_log2, False)
    for d in tl.static_range(BLOCK_M // BLOCK_N):  # the diagonal, masked
        dq = _dq_tile(dq, q, do, lse2, delta, K_h, V_h, m * BLOCK_M + d * BLOCK_N, offs_m, rel_n, offs_d, stride_kt,
                      stride_vt, scale_log2, True)
    tl.store(DQ + q_ptr, (dq * scale).to(DQ.dtype.element_ty))


def _arch(device: torch.device) -> int:
    return torch.cuda.get_device_capability(device)[0] if device.type == "cuda" else 9


def _check(q, k, v, tiles):
    B, T, H, D = q.shape
    if k.shape != q.shape or v.shape != q.shape:
        raise ValueError(f"q, k, v must have one shape (no GQA here), got {q.shape}, {k.shape}, {v.shape}")
    step = max(max(t.block_m, t.block_n) for t in tiles)
    if T % step:
        raise ValueError(f"T must be a multiple of {step} for the calibration kernel, got {T}")
    if any(x.stride(-1) != 1 for x in (q, k, v)):
        raise ValueError("q, k, v need a unit stride on the head dim")


def forward(q, k, v, *, scale: float, arch: int | None = None):
    """Causal attention: out (B, T, H, D) in q's dtype and lse (B, H, T) fp32. ``arch``: compute
    capability major whose tiles to use (default: q's device's)."""
    B, T, H, D = q.shape
    tiles = tiles_for(D, arch or _arch(q.device))
    _check(q, k, v, tiles)
    cfg = tiles[0]
    out = torch.empty_like(q)
    lse = torch.empty(B, H, T, dtype=torch.float32, device=q.device)
    flash_fwd_kernel[(T // cfg.block_m, B * H)](
        q, k, v, out, lse, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *out.stride()[:3], T, H, scale * LOG2E,
        HEAD_DIM=D, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return out, lse


def backward(dout, q, k, v, out, lse, *, scale: float, arch: int | None = None):
    """Gradients of :func:`forward`: dq, dk, dv (B, T, H, D)."""
    B, T, H, D = q.shape
    tiles = tiles_for(D, arch or _arch(q.device))
    _check(q, k, v, tiles)
    _, kv_cfg, q_cfg = tiles
    dout = dout.contiguous()
    delta = (dout.float() * out.float()).sum(-1).transpose(1, 2).contiguous()  # (B, H, T)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    strides = (*q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *dout.stride()[:3])
    flash_bwd_dkdv_kernel[(T // kv_cfg.block_n, B * H)](
        q, k, v, dout, lse, delta, dk, dv, *strides, T, H, scale, scale * LOG2E, HEAD_DIM=D,
        BLOCK_M=kv_cfg.block_m, BLOCK_N=kv_cfg.block_n, num_warps=kv_cfg.num_warps, num_stages=kv_cfg.num_stages)
    flash_bwd_dq_kernel[(T // q_cfg.block_m, B * H)](
        q, k, v, dout, lse, delta, dq, *strides, T, H, scale, scale * LOG2E, HEAD_DIM=D,
        BLOCK_M=q_cfg.block_m, BLOCK_N=q_cfg.block_n, num_warps=q_cfg.num_warps, num_stages=q_cfg.num_stages)
    return dq, dk, dv
