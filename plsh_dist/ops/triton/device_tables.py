"""The fused kernel's tables built on the device in a few launches, with no host read.

:func:`draw_on_device` gives a hash's pitch and shift on the attention's device from a
seed that may itself live there (a graph input), for every sampler with a device form
(:mod:`plsh_dist.ops.triton.device_draws`); :func:`device_documents` the layout of packed
documents in one launch. Both equal their host forms (:class:`~plsh_dist.hashing.PositionalLSH`'s
numpy draws, :meth:`~plsh_dist.ops.triton.tile_bands.TokenLayout.build`) bit for bit under
Triton's interpreter; compiled, the hash's ``log`` is CUDA's (libdevice), which may differ from
the CPU's in its last bit (docs/gpu.md). A kernel bias's band tables and the near runs are built
on the device beside their torch forms (``KernelBias.of(..., by="kernels")``,
``NearBlocks.of(..., by="kernels")``).

Legend: n tokens, s samples, Hh bias heads.
"""

from __future__ import annotations

import torch

from plsh_dist.hashing import FixedBlocks, PositionalLSH, get_device_draw
from plsh_dist.ops.triton import device_draws  # noqa: F401  registers the package's samplers' device forms
from plsh_dist.ops.triton.cache import on_device
from plsh_dist.ops.triton.tile_bands import CountBias, TokenLayout, num_tiles
from plsh_dist.ops.triton.runtime import launcher

_HASH_BLOCK = 256
_DOC_BLOCK = 1024


def launch(device: torch.device):
    """The table kernels' module for tensors on ``device`` (tests wrap it to count host ops)."""
    return launcher("table_kernels", device)


def draw_on_device(lsh: PositionalLSH, device: torch.device) -> CountBias:
    """``lsh``'s pitch and shift, float64 (s, Hh) on ``device``, as a :class:`CountBias`, reading the seed
    (:attr:`PositionalLSH.seed_tensor`) and sigma on the device, nothing read back; a host sigma is copied
    by the first call only, so a later call (a CUDA graph's capture) copies nothing.

    Fixed blocks and the "iid" sampler: one launch of ``hash_draw_kernel``. Other samplers: their device
    form's unit draws (:func:`plsh_dist.hashing.register_sampler`) times sigma, the host's products.
    A sampler registered without a device form: its host draws on a CPU; elsewhere a ValueError."""
    device = torch.device(device)
    fixed = isinstance(lsh, FixedBlocks)
    # a host sigma is copied once, so a later call (a CUDA graph's capture) copies nothing
    sigma = on_device(lsh.given[1], device).reshape(-1).to(torch.float64)
    if not fixed and lsh.sampler != "iid":
        device_draw = get_device_draw(lsh.sampler)
        if device_draw is None:
            if device.type == "cpu":
                return CountBias.of(lsh, device)
            raise ValueError(
                f"sampler {lsh.sampler!r} has no device form, and the fused kernel draws its masks on {device}: "
                f"register one with it (register_sampler(name, draw, device_draw), see "
                f"plsh_dist.hashing.SamplerDeviceDraw), or run another backend than the fused kernel")
        gamma, unit_shift = device_draw(lsh, device)
        pitch = gamma * sigma  # the host's products (PositionalLSH._draw), exact on every device
        return CountBias(pitch, unit_shift * pitch)
    s, H = lsh.num_samples, lsh.num_heads
    draws = torch.empty(2, s, H, dtype=torch.float64, device=device)
    seed = sigma if fixed else lsh.seed_tensor.to(device, non_blocking=True)  # FIXED reads no seed
    launch(device).hash_draw_kernel[(num_tiles(s * H, _HASH_BLOCK),)](
        seed, sigma, draws[0], draws[1], s, H, FIXED=fixed, BLOCK=_HASH_BLOCK)
    return CountBias(draws[0], draws[1])


def device_documents(position_ids: torch.Tensor, cu_seqlens: torch.Tensor, batch: int, seqlen: int) -> TokenLayout:
    """The :class:`TokenLayout` of a packed (batch, seqlen) call's flat row, from transformers' ``position_ids``
    ((batch or 1), seqlen) and document offsets ``cu_seqlens`` (``cu_seq_lens_q``, int32 or int64) on the
    device: one allocation and one launch of ``document_layout_kernel``, nothing read back. What the host
    checks (:func:`~plsh_dist.ops.documents.flat_documents`) is checked on the device
    (``torch._assert_async``: a bad layout stops the step at its next sync). Equal to the host's layout but
    for its virtual positions, another constant per document (``first token * 2^31 - first position``)."""
    rows = position_ids if position_ids.dim() == 2 else position_ids[None]
    if rows.shape[-1] != seqlen or rows.shape[0] not in (1, batch) or rows.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"position_ids must be integer (B={batch}, T={seqlen}) or (1, T), got {rows.dtype} of "
                         f"shape {tuple(position_ids.shape)}")
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2 or cu_seqlens.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"cu_seqlens must be an integer tensor (num_docs + 1,) of document offsets, got "
                         f"{cu_seqlens.dtype} of shape {tuple(cu_seqlens.shape)}")
    n, num_cu = batch * seqlen, cu_seqlens.numel()
    wide = torch.zeros(4 * n + n + 1, dtype=torch.int64, device=rows.device)
    positions, virtual, first, end = wide[:4 * n].view(4, n)
    narrow = wide[4 * n:].view(torch.int32)
    kernel_positions, doc, bad = narrow[:n], narrow[n:2 * n], narrow[2 * n:2 * n + 1]
    launch(rows.device).document_layout_kernel[(num_tiles(max(n, num_cu), _DOC_BLOCK),)](
        rows, cu_seqlens, positions, virtual, first, end, kernel_positions, doc, bad, n, seqlen,
        rows.stride(0) if rows.shape[0] > 1 else 0, rows.stride(1), num_cu, BLOCK=_DOC_BLOCK)
    torch._assert_async(bad == 0, "cu_seq_lens / position_ids: offsets must run from 0 to B * T, strictly "
                                  "increasing, with every row start among them, and positions must increase "
                                  "strictly within each document, in [0, 2^31)")
    return TokenLayout(positions, virtual, kernel_positions, doc, first, end)
