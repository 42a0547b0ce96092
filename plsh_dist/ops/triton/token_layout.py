"""The tokens of one row as the fused kernel reads them (:class:`TokenLayout`), and the two places a
layout is built, side by side:

- :meth:`TokenLayout.build`, on the host: from the positions (and the host's
  :class:`~plsh_dist.ops.documents.Documents`, laid out and checked there), copied to the device;
  every caller but the one below;
- :meth:`TokenLayout.build_on_device`, on the device: packed documents straight from transformers'
  ``position_ids`` and offsets there, in one launch of
  :func:`~plsh_dist.ops.triton.table_kernels.document_layout_kernel`, nothing read back (the ops'
  device layout, :func:`plsh_dist.ops.layout.device_layout`).

Two doors, not one with a form argument: the host's takes documents already laid out and checked,
the device's the raw offsets it lays out and checks itself. The tests hold the two equal
(``tests/ops/triton_kernel/test_device_tables.py``).

Legend: n tokens (the flat row: batch * seqlen with documents).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from plsh_dist.ops.triton.runtime import table_kernels as launch

_DOC_BLOCK = 1024


@dataclass(frozen=True)
class TokenLayout:
    """The tokens of one row, on the kernel's device.

    Attributes:
        positions: LongTensor[n], the hash's positions (restarting per document allowed).
        virtual: LongTensor[n], strictly increasing: positions plus a per-document constant
            (:attr:`plsh_dist.ops.documents.Documents.virtual_positions`), so a position
            maps to a token by ``searchsorted``.
        kernel_positions: IntTensor[n], the positions as the kernels read them (int32).
        doc: IntTensor[n] document index of every token, or None (one document).
        doc_first, doc_end: LongTensor[n], first token and one past the last of each
            token's document, or None.
    """

    positions: torch.Tensor
    virtual: torch.Tensor
    kernel_positions: torch.Tensor
    doc: torch.Tensor | None = None
    doc_first: torch.Tensor | None = None
    doc_end: torch.Tensor | None = None

    @classmethod
    def build(cls, positions: torch.Tensor, device: torch.device, docs=None) -> "TokenLayout":
        """The host's form: from positions (LongTensor[n], increasing within each document, below 2^31;
        CPU, checked here, or already on ``device`` without documents, checked where they were made:
        :func:`~plsh_dist.ops.layout.device_positions`) and optional
        :class:`~plsh_dist.ops.documents.Documents` of the same row (CPU)."""
        put = lambda x: x.to(device, torch.int64, non_blocking=True)  # noqa: E731
        pos = positions if docs is None else docs.positions
        if pos.device.type == "cpu" and pos.numel() and int(pos.max()) >= 2**31:  # no device sync
            raise ValueError(f"positions must be below 2^31 for the Triton kernel, got {int(pos.max())}")
        if docs is None:
            pos = put(positions)
            return cls(pos, pos, pos.to(torch.int32))
        pos = put(docs.positions)
        return cls(pos, put(docs.virtual_positions), pos.to(torch.int32), put(docs.ids).to(torch.int32),
                   put(docs.first), put(docs.end))

    @classmethod
    def build_on_device(cls, position_ids: torch.Tensor, cu_seqlens: torch.Tensor, batch: int,
                        seqlen: int) -> "TokenLayout":
        """The device's form: the layout of a packed (batch, seqlen) call's flat row, from transformers'
        ``position_ids`` ((batch or 1), seqlen) and document offsets ``cu_seqlens`` (``cu_seq_lens_q``, int32
        or int64) on the device: one allocation and one launch of ``document_layout_kernel``, nothing read
        back. What the host checks (:func:`~plsh_dist.ops.documents.flat_documents`) is checked on the device
        (``torch._assert_async``: a bad layout stops the step at its next sync). Equal to :meth:`build`'s
        layout of the same documents but for its virtual positions, another constant per document
        (``first token * 2^31 - first position``)."""
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
        launch(rows.device).document_layout_kernel[(-(-max(n, num_cu) // _DOC_BLOCK),)](
            rows, cu_seqlens, positions, virtual, first, end, kernel_positions, doc, bad, n, seqlen,
            rows.stride(0) if rows.shape[0] > 1 else 0, rows.stride(1), num_cu, BLOCK=_DOC_BLOCK)
        torch._assert_async(bad == 0, "cu_seq_lens / position_ids: offsets must run from 0 to B * T, strictly "
                                      "increasing, with every row start among them, and positions must increase "
                                      "strictly within each document, in [0, 2^31)")
        return cls(positions, virtual, kernel_positions, doc, first, end)

    @property
    def n(self) -> int:
        return self.positions.numel()

    def token_at(self, virtual: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """First token whose virtual position is >= ``virtual`` (positions of ``tokens``' own
        documents, shape like ``tokens`` or broadcasting with it), clamped to ``tokens``' document."""
        t = torch.searchsorted(self.virtual, virtual.contiguous())
        return t if self.doc_first is None else torch.maximum(t, self.doc_first[tokens])

    def clamp_end(self, end: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        return end if self.doc_end is None else torch.minimum(end, self.doc_end[tokens])

    def shift(self, tokens: torch.Tensor) -> torch.Tensor:
        """Virtual minus real position of ``tokens`` (their document's constant)."""
        return self.virtual[tokens] - self.positions[tokens]
