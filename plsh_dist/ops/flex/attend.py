"""FlexAttention forms of the project's biases: the attention a PyTorch user would write instead.

PyTorch's FlexAttention (``torch.nn.attention.flex_attention``) compiles a
``score_mod`` (a bias added to each score) and a block-sparse mask (the key
blocks each query block visits, and a ``mask_mod`` inside the blocks it only
partly sees) into one fused attention. Here are the pieces every user of it in
this project shares (the CPU strategy :mod:`plsh_dist.ops.flex.strategy`, the GPU
benchmark, the CPU comparison in ``experiments/flex_cpu.py``):

- :func:`band_block_mask`: the block mask of a *band*, each query row ``i``
  seeing the keys ``[start_i, end_i)`` (non-decreasing in ``i``): exact ALiBi
  (``[0, i + 1)``), truncated ALiBi (``[i - w_h + 1, i + 1)``), PLSH's one-pass
  band (from the earliest block start of the s blocks holding ``i``);
- score mods: ALiBi's ``-m_h |i - j|`` (:func:`alibi_score_mod`) and PLSH's
  ``log c_ij`` in two forms, from per-token block bounds
  (:func:`count_score_mod`: integer compares, what the CPU strategy runs) and
  straight from the hash's pitch and shift tables (:func:`hash_count_score_mod`:
  ``s`` float64 bucket pairs per score, the form a user would write from the
  paper; the GPU benchmark's);
- :func:`compiled_flex`: ``torch.compile(flex_attention)`` once per process, static shapes.

How it is compiled and cached, what CPU FlexAttention lacks, and which positions each mod
accepts: docs/design.md, section 4, "The strategy table" (``backend="flex"``).

Legend: Hb heads of a table (1: shared by every head, else one per query head),
T tokens, s samples, BS the block size of the sparse mask.
"""

from __future__ import annotations

import functools

import torch

from plsh_dist.hashing import bucket

#: Block size of the sparse masks: FlexAttention's default (against 64 on CPU: results/flex/README.md).
BLOCK_SIZE = 128


@functools.lru_cache(maxsize=2)
def flex_status(device_type: str) -> str | None:
    """None when the compiled FlexAttention can run on ``device_type`` ("cpu" / "cuda"), else one
    line saying why not."""
    try:
        import torch.nn.attention.flex_attention  # noqa: F401, PLC0415
    except ImportError as err:
        return f"torch {torch.__version__} has no FlexAttention ({err}); it needs torch >= 2.5"
    if device_type != "cpu":
        return None
    try:  # what inductor's CPU FlexAttention template asks for, and a C++ compiler to build it
        from torch._inductor.cpp_builder import get_cpp_compiler  # noqa: PLC0415
        from torch._inductor.kernel.flex.flex_cpu import check_cpu_supported  # noqa: PLC0415

        if not check_cpu_supported():
            return "inductor's CPU FlexAttention needs an x86 CPU with AVX2 (not macOS)"
        get_cpp_compiler()
    except Exception as err:  # an older torch's layout, or no compiler
        return f"inductor cannot build FlexAttention for this CPU ({type(err).__name__}: {err})"
    return None


@functools.cache
def compiled_flex():
    """``torch.compile(flex_attention)``, one for the process (see the module doc)."""
    from torch.nn.attention.flex_attention import flex_attention  # noqa: PLC0415

    return torch.compile(flex_attention, dynamic=False)


def _index(table: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """Row ``h`` of a per-head table, or its only row when it is shared (Hb = 1)."""
    return table[0] if table.shape[0] == 1 else table[h]


def band_block_mask(start: torch.Tensor, end: torch.Tensor):
    """The BlockMask of a band: row ``i`` of head ``h`` sees keys ``[start[h, i], end[h, i])``.

    ``start``, ``end``: integer (Hb, T) on the attention's device, each non-decreasing in ``i``,
    ``start <= i < end`` (every row sees itself). A key block is *full* for a query block when
    every row of it sees every key of the block (no ``mask_mod`` there), *partial* when some
    do. Memory: the (Hb, T / BS, T / BS) index tables of any BlockMask.
    """
    from torch.nn.attention.flex_attention import BlockMask  # noqa: PLC0415

    T = start.shape[1]
    nb, first_row, last_row, lo, hi = _block_range(start, end)
    j = torch.arange(nb, device=start.device)
    block_start = j * BLOCK_SIZE
    block_end = torch.clamp(block_start + BLOCK_SIZE, max=T)
    visible = (j >= lo[..., None]) & (j <= hi[..., None])  # (Hb, nb, nb)
    full = (start[:, last_row, None] <= block_start) & (end[:, first_row, None] >= block_end) & visible
    partial = visible & ~full

    def mask_mod(b, h, q_idx, kv_idx):
        return (kv_idx >= _index(start, h)[q_idx]) & (kv_idx < _index(end, h)[q_idx])

    num_p, idx_p = _ordered(partial)
    num_f, idx_f = _ordered(full)
    return BlockMask.from_kv_blocks(num_p[None], idx_p[None], num_f[None], idx_f[None], BLOCK_SIZE=BLOCK_SIZE,
                                    mask_mod=mask_mod, seq_lengths=(T, T))


def _block_range(start: torch.Tensor, end: torch.Tensor):
    """``(nb, first_row, last_row, lo, hi)``: the number of blocks, each query block's first and
    last row (nb,), and the key blocks ``[lo, hi]`` (Hb, nb) it visits."""
    T = start.shape[1]
    nb = -(-T // BLOCK_SIZE)
    first_row = torch.arange(nb, device=start.device) * BLOCK_SIZE
    last_row = torch.clamp(first_row + BLOCK_SIZE, max=T) - 1
    # the rows of a query block are monotone: its first row starts and ends first
    lo = start[:, first_row] // BLOCK_SIZE
    hi = (end[:, last_row] - 1) // BLOCK_SIZE
    return nb, first_row, last_row, lo, hi


def visited_blocks(start: torch.Tensor, end: torch.Tensor) -> int:
    """(query block, key block) pairs the band's mask visits, summed over its Hb heads."""
    _, _, _, lo, hi = _block_range(start, end)
    return int((hi - lo + 1).sum())


def _ordered(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Bool (Hb, nq, nk) -> (count (Hb, nq), indices (Hb, nq, nk)) int32, the marked key blocks
    first and in order (the BlockMask layout)."""
    num = blocks.sum(-1, dtype=torch.int32)
    idx = torch.argsort((~blocks).to(torch.int8), dim=-1, stable=True).to(torch.int32)
    return num, idx


def alibi_band(T: int, window: torch.Tensor | None, causal: bool, device) -> tuple[torch.Tensor, torch.Tensor]:
    """``(start, end)`` (Hb, T) of exact ALiBi (``window`` None: Hb = 1) or ALiBi inside per-head
    windows (LongTensor[H], ``|i - j| < w_h``) on contiguous positions."""
    i = torch.arange(T, device=device)[None]
    if window is None:
        return torch.zeros_like(i), (i + 1) if causal else torch.full_like(i, T)
    w = window.to(device).reshape(-1, 1)
    start = torch.clamp(i - w + 1, min=0)
    return start, (i + 1).expand_as(start).contiguous() if causal else torch.clamp(i + w, max=T)


def alibi_score_mod(slopes: torch.Tensor):
    """ALiBi's ``score - m_h |i - j|`` (``slopes`` Tensor[H] on the attention's device)."""
    m = slopes.to(torch.float32)

    def score_mod(score, b, h, q_idx, kv_idx):
        return score - m[h] * (q_idx - kv_idx).abs()

    return score_mod


def count_score_mod(first: torch.Tensor, end: torch.Tensor | None):
    """PLSH's ``score + log c_ij`` from block bounds: ``first[t, h, i]`` the first token of the
    block holding ``i`` in sample ``t`` and ``end`` one past its last (None: causal, every block
    is cut after the query, so ``c_ij = #{t : first_t(i) <= j}``). Integer (s, Hb, T) tables.
    Inside the band ``c >= 1``; the mask hides the rest."""
    s = first.shape[0]

    def score_mod(score, b, h, q_idx, kv_idx):
        c = 0
        for t in range(s):
            seen = _index(first[t], h)[q_idx] <= kv_idx
            if end is not None:
                seen = seen & (kv_idx < _index(end[t], h)[q_idx])
            c = c + seen.to(score.dtype)
        return score + torch.log(c)

    return score_mod


def hash_count_score_mod(pitch: torch.Tensor, shift: torch.Tensor, positions: torch.Tensor):
    """PLSH's ``score + log c_ij`` straight from the hash: ``c_ij`` counts the samples ``t`` with
    ``floor((p_i - u_t) / delta_t) == floor((p_j - u_t) / delta_t)`` in float64, the hash's own
    bucket formula (:func:`plsh_dist.hashing.bucket`, torch ops only: traceable), ``s`` bucket pairs per score.

    ``pitch``, ``shift``: the hash's float64 (s, Hb) tables, ``positions`` (T,), all on the
    attention's device. Causal or not is the mask's (``c_ii = s``: the band holds the row).
    """
    s = pitch.shape[0]
    p = positions.to(torch.float64)

    def score_mod(score, b, h, q_idx, kv_idx):
        c = 0
        for t in range(s):
            u, delta = _index(shift[t], h), _index(pitch[t], h)
            same = bucket(p[q_idx], delta, u) == bucket(p[kv_idx], delta, u)
            c = c + same.to(score.dtype)
        return score + torch.log(c)

    return score_mod


def flex_attend(q, k, v, score_mod, block_mask, scale: float | None = None, compiled=None) -> torch.Tensor:
    """The compiled FlexAttention on (B, T, H, D) tensors (k, v may have fewer heads: GQA);
    out (B, T, Hq, D). Differentiable where FlexAttention has a backward (CUDA).

    ``compiled``: a ``torch.compile`` of a function with FlexAttention's arguments (default
    :func:`compiled_flex`). A caller that must know what dynamo has compiled (its recompile
    limit counts the graphs of one function) passes a function of its own."""
    if q.device.type == "cpu":  # forward only there: it refuses inputs that require grad, even under no_grad
        q, k, v = q.detach(), k.detach(), v.detach()
    out = (compiled or compiled_flex())(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), score_mod=score_mod,
                                        block_mask=block_mask, scale=scale, enable_gqa=q.shape[2] != k.shape[2])
    return out.transpose(1, 2)
