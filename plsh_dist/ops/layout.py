"""Where a call's tokens sit, its *layout*: every token's position and document, as the ops read them.

transformers hands the attention its raw ``position_ids`` (B or 1, T), and packed documents as
offsets (``cu_seq_lens_q``) or as positions that restart at 0. The ops read a layout: positions
(LongTensor[T], or the (B, T) rows) and the documents' ``cu_seqlens`` (:mod:`plsh_dist.ops.documents`).
It is made in one of two forms, side by side here:

- on the host (:func:`host_layout`, :func:`layout_of_position_ids`): read from the tensors, checked
  and laid out in Python (a device-to-host copy: a sync on a GPU), for every strategy;
- on the device (:func:`device_layout`): the positions checked there (:func:`device_positions`), and
  packed documents laid out there by the fused kernel's wing
  (:meth:`~plsh_dist.ops.triton.token_layout.TokenLayout.build_on_device`), read by no host, for the
  strategy that builds its tables there (``Strategy.device_positions``).

Legend: B batch, T tokens per row.
"""

from __future__ import annotations

import torch
from torch import Tensor

from plsh_dist.ops.documents import cu_seqlens_from_position_ids
from plsh_dist.ops.triton import TokenLayout


def host_layout(positions, cu_seqlens, q, from_position_ids: bool):
    """The ops' ``(positions, cu_seqlens)``: as given, or laid out from transformers' raw ``position_ids``."""
    if from_position_ids:
        return layout_of_position_ids(positions, cu_seqlens, q.shape[0], q.shape[1])
    return positions, cu_seqlens


def device_layout(positions, cu_seqlens, q, from_position_ids: bool) -> tuple[Tensor, TokenLayout | None] | None:
    """Raw ``position_ids`` (and packed offsets) left on the device for the fused kernel, read by no host:
    ``(positions, None)``, the positions checked there (:func:`device_positions`),
    or ``(positions, layout)`` of documents laid out there
    (:meth:`~plsh_dist.ops.triton.token_layout.TokenLayout.build_on_device`:
    the flat row's positions and its :class:`~plsh_dist.ops.triton.token_layout.TokenLayout`). None where
    they are on the host (:func:`host_layout` lays them out)."""
    if not from_position_ids or positions is None or positions.device.type == "cpu":
        return None
    if cu_seqlens is None:
        return device_positions(positions, q.shape[1]), None
    if cu_seqlens.device.type == "cpu":
        return None
    layout = TokenLayout.build_on_device(positions, cu_seqlens, q.shape[0], q.shape[1])
    return layout.positions, layout


def layout_of_position_ids(position_ids: torch.Tensor | None, cu_seqlens: torch.Tensor | None, batch: int,
                           seqlen: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """transformers' ``position_ids`` (batch or 1, seqlen) and packed offsets -> the ops'
    ``(positions, cu_seqlens)``, on the CPU (a device-to-host copy: a sync on GPU).

    - neither: ``arange(seqlen)``, no documents;
    - ``cu_seqlens`` given (transformers' ``cu_seq_lens_q/k``): passed on; positions
      are row 0 when the rows agree, else the (batch, seqlen) rows;
    - position_ids that restart at 0 inside a row (``DataCollatorWithFlattening``):
      a document starts at every 0; positions are the (batch, seqlen) rows;
    - rows that differ without restarting: each row is one document;
    - otherwise: row 0 and no documents (the plain case, one hash for the batch).

    Idempotent: a layout it returned, given again, comes back unchanged.
    """
    if position_ids is None:
        return torch.arange(seqlen), None if cu_seqlens is None else cu_seqlens.to("cpu")
    if position_ids.dim() == 1 and position_ids.shape[0] == seqlen:  # a layout already (row 0)
        return position_ids.to("cpu"), None if cu_seqlens is None else cu_seqlens.to("cpu")
    if position_ids.dim() != 2 or position_ids.shape[-1] != seqlen or position_ids.shape[0] not in (1, batch):
        raise ValueError(f"position_ids must be (B={batch}, T={seqlen}) or (1, T), "
                         f"got shape {tuple(position_ids.shape)}")
    rows = position_ids.to("cpu", torch.long).expand(batch, seqlen)
    restarts = bool((rows[:, 1:] <= rows[:, :-1]).any())
    same = bool((rows == rows[:1]).all())
    if cu_seqlens is not None:
        return (rows[0] if same and not restarts else rows), cu_seqlens.to("cpu")
    if restarts:
        return rows, cu_seqlens_from_position_ids(rows)
    if not same:
        return rows, torch.arange(batch + 1, dtype=torch.int32) * seqlen
    return rows[0], None


def device_positions(position_ids: torch.Tensor, seqlen: int) -> torch.Tensor:
    """transformers' ``position_ids`` (batch or 1, seqlen) on a device, without packed documents -> the
    ops' positions LongTensor[seqlen] (row 0), on that device, read by no host.

    What :func:`layout_of_position_ids` would find by reading them is checked on the device instead
    (``torch._assert_async``: a failure stops the step at its next sync): equal rows, strictly
    increasing, in [0, 2^31) (the fused kernel's int32 positions). Rows that restart at 0 (documents packed by ``DataCollatorWithFlattening``)
    fail it: pass their offsets (``cu_seq_lens_q``), which the host lays out."""
    rows = position_ids if position_ids.dim() == 2 else position_ids[None]
    if rows.shape[-1] != seqlen:
        raise ValueError(f"position_ids must be (B, T={seqlen}) or (1, T), got shape {tuple(position_ids.shape)}")
    pos = rows[0].long()
    ok = (rows == pos).all() & (pos[1:] > pos[:-1]).all() & (pos[0] >= 0) & (pos[-1] < 2**31)
    torch._assert_async(ok, "position_ids must be equal rows of strictly increasing positions in [0, 2^31) on the "
                            "device path (packed documents: pass cu_seq_lens_q)")
    return pos
