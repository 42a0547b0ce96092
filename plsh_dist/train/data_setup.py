"""The training loop's view of the data package: prepare once, then batches per rank."""

from __future__ import annotations

from typing import Iterator

import torch
import torch.distributed as dist

from plsh_dist.data import DataConfig, PreparedData, TokenizerConfig, build_loader, prepare_data
from plsh_dist.train.refusal import RunRefused, refusing


def prepare(data: DataConfig, tokenizer: TokenizerConfig) -> PreparedData:
    """Corpus, tokenizer and token caches; rank 0 builds them first and logs
    their reports, the others then only open the caches (no duplicate
    tokenizer training, tokenising or report).

    Bad data (an empty file, no usable document: the data package's
    ``ValueError``) refuses the run on every rank alike: rank 0 shares its
    verdict with the others, so the message is printed once (refusal.py).
    """
    rank = dist.get_rank() if dist.is_initialized() else 0
    prepared, refusal = None, None
    if rank == 0:
        try:
            prepared = prepare_data(data, tokenizer)
        except ValueError as exc:
            refusal = exc
    if dist.is_initialized():
        verdict = [str(refusal) if refusal is not None else None]
        dist.broadcast_object_list(verdict, src=0)  # also the barrier: the others wait for rank 0's caches
        if verdict[0] is not None and rank != 0:
            raise RunRefused("data", verdict[0])
    if refusal is not None:
        raise RunRefused("data", str(refusal)) from refusal
    if prepared is not None:
        return prepared
    # Rank 0 has logged the data reports; the others reopen its caches without repeating them
    # (on several hosts each would print them again).
    with refusing("data", every_rank=False):  # only this rank fails to open the caches rank 0 built
        return prepare_data(data, tokenizer, log_reports=False)


class DataPipeline:
    """Training batches (endless, resumable) and validation batches of one rank.

    Batches are dicts of int64 (B, seq_len / sp_size): ``input_ids``,
    ``labels``, ``position_ids`` (global positions); with
    ``[data].document_masking`` also ``cu_seqlens`` (int32 document offsets of
    the whole (B, seq_len) batch, the same on every SP rank of a group).
    """

    def __init__(self, prepared: PreparedData, cfg: DataConfig, *, dp_rank: int, dp_size: int,
                 sp_rank: int, sp_size: int):
        self.prepared, self.cfg = prepared, cfg
        self.layout = dict(dp_rank=dp_rank, dp_size=dp_size, sp_rank=sp_rank, sp_size=sp_size)
        self.train = build_loader(prepared.train, cfg, train=True, **self.layout)

    def skip_to(self, position: int) -> None:
        """Start the training stream at global position ``position``: the sequences every DP rank
        together has read (resume; the same at any DP size, data/sampler.py)."""
        self.train = build_loader(self.prepared.train, self.cfg, train=True, start=position, **self.layout)

    @property
    def global_position(self) -> int:
        """The training stream's global position after the batches read so far (saved with a
        checkpoint as ``consumed_sequences``)."""
        return self.train.position

    def next_train(self) -> dict[str, torch.Tensor]:
        return self.train.next_batch()

    def val_batches(self, n: int) -> Iterator[dict[str, torch.Tensor]]:
        """The first ``n`` validation batches (stream order, same every call);
        the training split's first batches if the data has no validation split."""
        stream = self.prepared.val if self.prepared.val is not None else self.prepared.train
        loader = build_loader(stream, self.cfg, train=False, **self.layout)
        for i, batch in enumerate(loader):
            if i >= n:
                return
            yield batch
