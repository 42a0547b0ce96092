"""The training loop's view of the data package: prepare once, then batches per rank."""

from __future__ import annotations

import os
from typing import Iterator

import torch
import torch.distributed as dist

from plsh_dist.data import DataConfig, PreparedData, TokenizerConfig, build_loader
from plsh_dist.train.data_wait import prepare_collectively, prepare_locked
from plsh_dist.train.refusal import refusing


def prepare(data: DataConfig, tokenizer: TokenizerConfig) -> PreparedData:
    """Corpus, tokenizer and token caches; the first rank of each node builds them (on every core,
    holding the cache directory's lock, so nodes sharing it build once) and rank 0 logs their
    reports, the others wait for them outside any collective (no ``[parallel].timeout_s`` while a
    build lives; a dead builder ends the job) and then only open the caches: data_wait.py.

    Bad data (an empty file, no usable document: the data package's
    ``ValueError``) refuses the run on every rank alike: the builders share their
    verdict with the others, so the message is printed once (refusal.py).
    """
    threads = len(os.sched_getaffinity(0))
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        with refusing("data"):
            return prepare_locked(data, tokenizer, threads=threads)
    rank = dist.get_rank()
    local_rank = int(os.environ.get("LOCAL_RANK", rank))  # unset: one node
    return prepare_collectively(data, tokenizer, rank=rank, local_rank=local_rank, threads=threads)


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
        self.train = build_loader(self._training(), cfg, train=True, **self.layout)

    def _training(self):
        """What the training batches are drawn from: the training stream, or a mixture's sources."""
        return self.prepared if self.prepared.mixture else self.prepared.train

    def skip_to(self, position: int) -> None:
        """Start the training stream at global position ``position``: the sequences every DP rank
        together has read (resume; the same at any DP size, data/sampler.py)."""
        self.train = build_loader(self._training(), self.cfg, train=True, start=position, **self.layout)

    def source_progress(self) -> dict[str, dict]:
        """A mixture's sources at the training stream's position: name -> ``{"sequences", "epochs"}``
        (data/mixture.py); empty without ``[data].sources``."""
        if not self.prepared.mixture:
            return {}
        return {m[0]: p for m, p in zip(self.prepared.mixture, self.train.sampler.source_progress())}

    @property
    def global_position(self) -> int:
        """The training stream's global position after the batches read so far (saved with a
        checkpoint as ``consumed_sequences``)."""
        return self.train.position

    def next_train(self) -> dict[str, torch.Tensor]:
        return self.train.next_batch()

    def val_batches(self, n: int) -> Iterator[dict[str, torch.Tensor]]:
        """The first ``n`` validation batches (stream order, same every call);
        the training split's first batches if the data has no validation split.
        A mixture: the first ``n`` of each source's (``val_sets``), one source after the other."""
        for batches in self.val_sets(n).values():
            yield from batches

    def val_sets(self, n: int) -> dict[str, Iterator[dict[str, torch.Tensor]]]:
        """``{"": the first n validation batches}``; a mixture: ``{source name: the first n of its
        validation split (its training split's when it has none)}``."""
        if not self.prepared.mixture:
            streams = {"": self.prepared.val if self.prepared.val is not None else self.prepared.train}
        else:
            streams = {name: val if val is not None else train for name, _, train, val in self.prepared.mixture}
        return {name: self._first(stream, n) for name, stream in streams.items()}

    def _first(self, stream, n: int) -> Iterator[dict[str, torch.Tensor]]:
        loader = build_loader(stream, self.cfg, train=False, **self.layout)
        for i, batch in enumerate(loader):
            if i >= n:
                return
            yield batch
