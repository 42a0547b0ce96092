"""Ranks wait for the data without the process group's timeout, and never for a dead builder
(plsh_dist/train/data_wait.py): the store-side wait, and the cache directory's lock."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta
from types import SimpleNamespace

import pytest
from torch.distributed import TCPStore

from plsh_dist.distributed.ports import free_port
from plsh_dist.train.data_wait import LOCK_NAME, PrepareLock, await_builders
from plsh_dist.train.failure import PeerGone, is_peer_failure

BUILDER = {0: "host h, pid 1"}


def _store() -> TCPStore:
    return TCPStore("127.0.0.1", free_port(), is_master=True, timeout=timedelta(seconds=10), wait_for_workers=False)


def test_the_wait_lasts_while_the_builder_beats_and_ends_with_its_verdict():
    store = _store()
    store.set("p/0/status", "tokenizing train: 1.0MB/4.0MB")

    def builder():
        for _ in range(6):  # 1.5 s of heartbeats: longer than the stale bound below
            store.add("p/0/beat", 1)
            time.sleep(0.25)
        store.set("p/0/verdict", json.dumps({"fingerprint": "abc"}))

    thread = threading.Thread(target=builder)
    thread.start()
    assert await_builders(store, "p", BUILDER, report=False, stale_after_s=1.0) == {0: {"fingerprint": "abc"}}
    thread.join()


def test_a_builder_whose_heartbeat_stops_ends_the_wait_naming_it():
    store = _store()
    store.set("p/0/status", "tokenizing train: 1.0MB/4.0MB")
    store.add("p/0/beat", 1)
    start = time.monotonic()
    with pytest.raises(PeerGone, match=r"rank 0 \(host h, pid 1\).*no heartbeat.*tokenizing train: 1.0MB/4.0MB"):
        await_builders(store, "p", BUILDER, report=False, stale_after_s=1.0)
    assert time.monotonic() - start < 5
    assert is_peer_failure(PeerGone("x"))  # exit 3 with one line (failure.py)


def test_a_lost_store_ends_the_wait():
    port = free_port()
    host = subprocess.Popen([sys.executable, "-c", f"""
import time
from datetime import timedelta
from types import SimpleNamespace
from torch.distributed import TCPStore
s = TCPStore("127.0.0.1", {port}, is_master=True, timeout=timedelta(seconds=10), wait_for_workers=False)
s.set("p/0/status", "training the tokenizer")
s.add("p/0/beat", 1)
print("up", flush=True)
time.sleep(600)
"""], stdout=subprocess.PIPE, text=True)
    try:
        assert host.stdout.readline().strip() == "up"
        store = TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=5))
        threading.Timer(1.0, host.kill).start()  # the store's host (rank 0) dies while the others wait
        with pytest.raises(PeerGone, match="lost the rendezvous store.*training the tokenizer"):
            await_builders(store, "p", BUILDER, report=False)
    finally:
        host.kill()
        host.wait()


_HOLD = """
import sys, time
from plsh_dist.train.data_wait import PrepareLock
PrepareLock.acquire(sys.argv[1])
print("held", flush=True)
time.sleep(float(sys.argv[2]))
"""


def test_a_killed_holders_lock_is_taken_over(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(tmp_path), "600"], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert (tmp_path / LOCK_NAME).exists()  # left behind by the killed build
    start = time.monotonic()
    lock = PrepareLock.acquire(tmp_path)
    assert time.monotonic() - start < 5
    lock.release()
    assert not (tmp_path / LOCK_NAME).exists()


def test_a_live_holders_lock_is_waited_for(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(tmp_path), "2"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        said = []
        start = time.monotonic()
        lock = PrepareLock.acquire(tmp_path, said.append)
        assert time.monotonic() - start > 1.0  # waited for the holder to end
        assert said and "waiting for pid" in said[0] and "prepares data" in said[0]
        lock.release()
    finally:
        holder.kill()
        holder.wait()


def _ranks(rank: int, port: int, mode: str, out) -> None:
    import torch.distributed as dist

    import plsh_dist.train.data_wait as data_wait
    from plsh_dist.data import DataConfig, TokenizerConfig

    def builder(*args, **kwargs):
        if mode == "crash":
            raise RuntimeError("injected crash while tokenizing")
        kwargs["status"]("tokenizing train: 1.0MB/4.0MB")
        time.sleep(4)  # twice the process group's timeout
        return SimpleNamespace(tokenizer=SimpleNamespace(fingerprint="f"), built="built")

    data_wait.prepare_locked = builder
    data_wait.prepare_data = lambda *args, **kwargs: "opened"  # what a waiting rank does once the data is ready
    # The ranks meet with time to spare (a spawn on a loaded machine can take seconds); then the store and
    # the process group get the short timeout the waiting must outlast.
    store = TCPStore("127.0.0.1", port, world_size=2, is_master=rank == 0, timeout=timedelta(seconds=60))
    store.set_timeout(timedelta(seconds=2))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2, timeout=timedelta(seconds=2))
    try:
        prepared = data_wait.prepare_collectively(DataConfig(), TokenizerConfig(), rank=rank, local_rank=rank,
                                                  threads=1)
        out[rank] = getattr(prepared, "built", prepared)
    except Exception as exc:  # noqa: BLE001 - the test reads what each rank raised
        out[rank] = f"{type(exc).__name__}: {exc}"
    if mode != "crash" or rank != 0:
        dist.destroy_process_group()


@pytest.mark.parametrize("mode", ["slow", "crash"])
def test_ranks_wait_past_the_collective_timeout_and_stop_at_a_crash(mode):
    """A build twice as long as the process group's timeout is waited for; a builder that crashes
    stops the waiting rank at once with PeerGone (it never joins the last collective)."""
    import torch.multiprocessing as mp

    with mp.Manager() as manager:
        out = manager.dict()
        start = time.monotonic()
        mp.spawn(_ranks, args=(free_port(), mode, out), nprocs=2)
        results = dict(out)
    if mode == "slow":
        assert results == {0: "built", 1: "opened"}
    else:
        assert results[0] == "RuntimeError: injected crash while tokenizing"
        assert results[1].startswith("PeerGone: rank 0 (host ") and "failed while preparing the data" in results[1]
        assert time.monotonic() - start < 30
