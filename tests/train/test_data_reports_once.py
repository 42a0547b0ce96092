"""The data reports (files read, documents kept, skips) are logged by rank 0 only.

Every rank prepares the data, rank 0 first; the others reopen its caches.
On several hosts each rank's stderr is a separate stream (pdsh prints them
all), so a report repeated by every rank reads as several runs' worth.
"""

from __future__ import annotations

import logging
import os

import torch.distributed as dist
import torch.multiprocessing as mp

from plsh_dist.distributed.ports import free_port
from tests.train.conftest import base_overrides

WORLD = 2


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _worker(rank: int, port: int, overrides: list[str], out) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), DS_ACCELERATOR="cpu")
    from plsh_dist.config import load_config
    from plsh_dist.train.data_setup import prepare

    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        collect = _Collect()
        reports = logging.getLogger("plsh_dist.data.dataset")
        reports.addHandler(collect)
        reports.setLevel(logging.DEBUG)
        cfg = load_config(None, overrides)
        prepare(cfg.data, cfg.tokenizer)
        out[rank] = collect.messages
    finally:
        dist.destroy_process_group()


def test_only_rank_0_logs_the_data_reports(tiny_data, tmp_path):
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_worker, args=(free_port(), base_overrides(tiny_data, tmp_path / "out"), out), nprocs=WORLD)
        logged = dict(out)
    assert [m.split(" (")[0] for m in logged[0]] == ["train", "val"]
    assert logged[1] == []
