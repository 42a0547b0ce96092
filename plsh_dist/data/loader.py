"""Batches for one (dp_rank, sp_rank): the piece the training loop iterates.

Shape legend: B = micro_batch_size, T = seq_len, T_local = T / sp_size.
"""

from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np
import torch

from plsh_dist.data.packing import gather_windows, num_windows, split_for_sp
from plsh_dist.data.mixture import MixtureSampler
from plsh_dist.data.sampler import ShardedSampler
from plsh_dist.data.tokenizer import EOS_ID
from plsh_dist.distributed.sp_chunks import sp_bounds


class PackedLoader:
    """Yields ``{"input_ids", "labels", "position_ids"}``, int64 tensors (B, T_local),
    and with ``document_masking`` ``"cu_seqlens"`` (int32, the whole batch's document offsets).

    Every SP rank of a group (same ``dp_rank``) reads the same windows and
    takes its own contiguous chunk; labels are shifted before the cut. The
    document layout is a pure function of the windows (``packing``), so it
    is identical on the SP ranks of a group and after a resume.

    Args:
        tokens: (N,) token stream (documents each followed by EOS), e.g. a
            ``TokenStream.tokens`` memmap; with ``weights``, one such stream per source.
        seq_len: T, tokens per sequence; must be divisible by sp_size.
        micro_batch_size: B.
        dp_rank, dp_size, sp_rank, sp_size: this process's place in the layout.
        seed: shuffling seed (same on every rank).
        shuffle: False reads windows in stream order (evaluation).
        loop: True cycles epochs forever (training); False stops after one
            epoch, the last batch possibly smaller (same size on every rank).
        start: global stream position of the first batch: sequences every DP rank together
            has read before (the resume point, at any ``dp_size``: training's
            ``DataPipeline.skip_to``; sampler.py).
        document_masking: add each batch's ``cu_seqlens`` (``[data].document_masking``).
        eos_id: the stream's end-of-document id (``TokenStream.eos_id``).
        weights: a mixture's source weights (data/mixture.py), one per stream of ``tokens``;
            None: ``tokens`` is one stream.
    """

    def __init__(self, tokens: np.ndarray | Sequence[np.ndarray], seq_len: int, micro_batch_size: int, *,
                 dp_rank: int = 0, dp_size: int = 1, sp_rank: int = 0, sp_size: int = 1, seed: int = 0,
                 shuffle: bool = True, loop: bool = True, start: int = 0, document_masking: bool = False,
                 eos_id: int = EOS_ID, weights: Sequence[float] | None = None):
        sp_bounds(seq_len, sp_rank, sp_size)  # checks the rank and divisibility before any work
        if micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
        streams = list(tokens) if weights is not None else [tokens]
        counts = [num_windows(len(t), seq_len) for t in streams]
        # Training needs one full global batch of distinct sequences (else a batch would repeat
        # sequences); a one-epoch pass (evaluation) needs one sequence per DP rank. A mixture's
        # source needs one sequence: the batch is drawn from all of them.
        need = 1 if weights is not None else micro_batch_size * dp_size if loop else dp_size
        for i, (stream, n) in enumerate(zip(streams, counts)):
            if n >= need:
                continue
            what = ("one sequence" if weights is not None else
                    f"one batch of micro_batch_size={micro_batch_size} x dp_size={dp_size} = {need} sequences"
                    if loop else f"one sequence per DP rank (dp_size={dp_size})")
            corpus = f"source {i} of [data].sources" if weights is not None else "the corpus"
            raise ValueError(
                f"{corpus} is too small: its {len(stream):,} tokens hold {n} sequences of seq_len={seq_len} "
                f"(seq_len + 1 tokens each, stride seq_len), fewer than {what}, i.e. at least "
                f"{need * seq_len + 1:,} tokens; add data, or lower [data].seq_len / [data].micro_batch_size "
                f"(or [data].min_doc_tokens if documents were dropped as short), or run fewer DP ranks"
            )
        self.streams, self.seq_len, self.micro_batch_size = streams, seq_len, micro_batch_size
        self.sp_rank, self.sp_size = sp_rank, sp_size
        self.eos_id = int(eos_id) if document_masking else None
        if weights is None:
            self.sampler = ShardedSampler(counts[0], dp_rank, dp_size, seed, shuffle=shuffle, loop=loop, start=start)
        elif not (shuffle and loop):
            raise ValueError("a mixture of sources is read for training only (shuffled, endless)")
        else:
            self.sampler = MixtureSampler(counts, weights, dp_rank, dp_size, seed, start=start)

    @property
    def num_windows(self) -> int:
        """Sequences in the whole dataset."""
        return self.sampler.num_items

    @property
    def sequences_per_epoch(self) -> int:
        """Sequences this rank reads per epoch (the same on every rank)."""
        return self.sampler.per_rank

    @property
    def consumed(self) -> int:
        """Sequences this rank has read since ``start``."""
        return self.sampler.consumed

    @property
    def position(self) -> int:
        """The global stream position after this rank's batches (every DP rank's, read in step)."""
        return self.sampler.position

    def __len__(self) -> int:
        """Batches per epoch on this rank (last one possibly partial)."""
        return -(-self.sampler.per_rank // self.micro_batch_size)

    def next_batch(self) -> dict[str, torch.Tensor] | None:
        """The next batch, or None when a one-epoch loader is exhausted."""
        idx = self.sampler.take(self.micro_batch_size)  # (B,) windows, or a mixture's (B, 2) (source, window)
        if len(idx) == 0:
            return None
        if idx.ndim == 1:
            windows = gather_windows(self.streams[0], idx, self.seq_len)  # (B, T + 1)
        else:
            windows = np.concatenate([gather_windows(self.streams[s], [w], self.seq_len) for s, w in idx])
        return split_for_sp(windows, self.sp_rank, self.sp_size, eos_id=self.eos_id)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        while (batch := self.next_batch()) is not None:
            yield batch
