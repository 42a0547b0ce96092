"""Data preparation at launch that waits as long as the data needs, and never for a dead rank.

Who prepares: the first rank of every node (``LOCAL_RANK`` 0, a *builder*) runs ``prepare_data``
(corpus, tokenizer, token caches) holding the lock of the cache directory,
``<[data].cache_dir>/prepare.lock``; the node's other ranks wait. Whether nodes share the cache
directory is never configured, the lock tells: over a shared filesystem the builders meet at the one
lock, the first builds and the others wait for the lock, then find the caches and only open them;
on local disks each node's lock is its own and each node builds its own caches. The same lock keeps
``launchers/prepare_data.py`` and a training job (or two jobs) from building one cache twice. It is
a ``run_lock.py`` lock (hard-linked record with host, pid and start; a heartbeat; taken over at once
on the same machine when its process is gone, from another machine after 180 s without heartbeat),
so a killed build leaves no lock that blocks the next run, and its chunks are resumed
(token_cache.py).

How the others wait: not in a collective, which would give up after ``[parallel].timeout_s`` and
blame a dead peer, but on the process group's key-value store (the TCPStore every launcher sets up;
no gloo or NCCL): each builder publishes what it does and how far it is (its progress line) and a
heartbeat every ``HEARTBEAT_S``, then its verdict (the tokenizer's fingerprint, or the data refusal).
Every rank waits for every builder's verdict, however long the data takes; the first waiting rank
of each node prints its builders' status every ``REPORT_S``. A builder whose heartbeat stops for
``STALE_AFTER_S`` (killed on another node, or hung), or a store that is gone (rank 0 hosts it and
died), ends the waiting ranks with ``PeerGone``: exit 3 naming the builder and what it was doing.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import socket
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from plsh_dist.data import DataConfig, PreparedData, TokenizerConfig, prepare_data
from plsh_dist.train.failure import PeerGone
from plsh_dist.train.refusal import RunRefused, refusing
from plsh_dist.train.run_lock import HeldLock, Holder, take_or_see_holder

LOCK_NAME = "prepare.lock"
HEARTBEAT_S = 5.0
"""Seconds between two heartbeats of a builder (store) and touches of its lock file."""
STALE_AFTER_S = 120.0
"""A builder whose heartbeat has not moved for this long is taken for dead."""
REPORT_S = 30.0
"""Seconds between two status lines of a waiting node."""
POLL_S = 0.5
READ_WAIT_S = 10.0
"""How long a builder that failed waits for the other ranks to read its verdict before it exits."""

_calls = itertools.count()  # every rank prepares the same number of times: the n-th call's keys are its own


def _notice(text: str) -> None:
    print(f"plsh_dist: {text}", file=sys.stderr, flush=True)


class PrepareLock(HeldLock):
    """The lock of a cache directory, held by this process from ``acquire`` to ``release``."""

    @classmethod
    def acquire(cls, cache_dir: str | Path, say: Callable[[str], None] = _notice) -> PrepareLock | None:
        """Take ``cache_dir``'s lock, waiting (``say`` each ``REPORT_S``) while another live process
        holds it, taking over a stale one with a notice. None when the directory cannot be written:
        a read-only cache is only read (and a build there fails on its own, naming the directory)."""
        path = Path(cache_dir) / LOCK_NAME
        me, said = Holder.this_process(), 0.0
        while True:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                taken, holder, age = take_or_see_holder(path, me)
            except OSError:
                return None
            if taken:
                return cls(path, me, HEARTBEAT_S)
            if holder is None:
                continue  # released, or a stale one taken over: try again
            if time.monotonic() - said >= REPORT_S:
                say(f"waiting for {holder.describe()}, which prepares data in {path.parent} (lock {path}, "
                    f"heartbeat {max(age, 0):.0f} s ago)")
                said = time.monotonic()
            time.sleep(1.0)


def prepare_locked(data: DataConfig, tokenizer: TokenizerConfig, *, threads: int, log_reports: bool = True,
                   status: Callable[[str], None] | None = None) -> PreparedData:
    """``prepare_data`` holding the cache directory's lock (module doc). ``status``: told what is
    done and how far it is (the wait for another holder of the lock too); None: that wait is printed."""
    lock = PrepareLock.acquire(data.cache_dir, status or _notice)
    try:
        with _cache_log_shown(log_reports):
            return prepare_data(data, tokenizer, log_reports=log_reports, threads=threads, status=status)
    finally:
        if lock is not None:
            lock.release()


@contextmanager
def _cache_log_shown(show: bool) -> Iterator[None]:
    """The token cache's log (found, built, resumed) on stderr for the block, where no logging is
    configured (training): a run's log says whether it tokenized."""
    log = logging.getLogger("plsh_dist.data.token_cache")
    if not show or log.hasHandlers():
        yield
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("plsh_dist: %(message)s"))
    level = log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        yield
    finally:
        log.removeHandler(handler)
        log.setLevel(level)


class _Beacon:
    """A builder's status and heartbeat in the store, refreshed by a thread until ``stop``."""

    def __init__(self, store, prefix: str):
        self.store, self.prefix = store, prefix
        self.text = "starting"
        self._stop = threading.Event()
        self._publish()
        self._thread = threading.Thread(target=self._run, name="data-prepare-heartbeat", daemon=True)
        self._thread.start()

    def say(self, text: str) -> None:
        self.text = text

    def _publish(self) -> None:
        self.store.set(f"{self.prefix}/status", self.text)
        self.store.add(f"{self.prefix}/beat", 1)

    def _run(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                self._publish()
            except Exception:  # noqa: BLE001 - the store is gone: the waiting ranks see it themselves
                return

    def finish(self, verdict: dict) -> None:
        self._stop.set()
        self._thread.join()
        self.store.set(f"{self.prefix}/verdict", json.dumps(verdict))


def builders_of(local_ranks: list[int]) -> list[int]:
    """The builder ranks: those with local rank 0 (the first rank of each node)."""
    return [r for r, local in enumerate(local_ranks) if local == 0]


def await_builders(store, prefix: str, builders: dict[int, str], *, report: bool,
                   clock: Callable[[], float] = time.monotonic, stale_after_s: float = STALE_AFTER_S) -> dict:
    """Wait until every builder (rank -> its host and pid, for messages) has published its verdict;
    ``{rank: verdict}``. ``report``: print their status every ``REPORT_S``. ``PeerGone`` when a
    builder's heartbeat stops for ``stale_after_s`` or the store cannot be reached."""
    verdicts: dict[int, dict] = {}
    seen = {b: (-1, clock()) for b in builders}  # builder -> (last heartbeat count, when it moved)
    status = {b: "starting" for b in builders}
    start = clock()
    reported = start - REPORT_S  # the first status at once, then every REPORT_S
    while True:
        try:
            for b in builders:
                if b not in verdicts and store.check([f"{prefix}/{b}/verdict"]):
                    verdicts[b] = json.loads(store.get(f"{prefix}/{b}/verdict"))
                    store.add(f"{prefix}/{b}/read", 1)  # a crashed builder waits for this (prepare_collectively)
            if len(verdicts) == len(builders):
                return verdicts
            now = clock()
            for b in builders:
                if b in verdicts:
                    continue
                status[b] = store.get(f"{prefix}/{b}/status").decode()
                beat = store.add(f"{prefix}/{b}/beat", 0)
                if beat != seen[b][0]:
                    seen[b] = (beat, now)
                elif now - seen[b][1] > stale_after_s:
                    raise PeerGone(f"rank {b} ({builders[b]}), which prepares the data, sent no heartbeat for "
                                   f"{now - seen[b][1]:.0f} s (killed or hung?); it was: {status[b]}")
        except PeerGone:
            raise
        except Exception as exc:  # noqa: BLE001 - any store error: the rank hosting it is gone
            late = "; ".join(f"rank {b} ({builders[b]}) was: {status[b]}" for b in builders if b not in verdicts)
            raise PeerGone(f"lost the rendezvous store while waiting for the data ({type(exc).__name__}: "
                           f"{str(exc).splitlines()[0] if str(exc) else ''}): rank 0, which hosts it, is gone; "
                           f"{late}") from exc
        if report and now - reported >= REPORT_S:
            for b in builders:
                if b not in verdicts:
                    _notice(f"waiting {now - start:.0f} s for rank {b} ({builders[b]}) to prepare the data "
                            f"(no timeout while its heartbeat lives): {status[b]}")
            reported = now
        time.sleep(POLL_S)


def prepare_collectively(data: DataConfig, tokenizer: TokenizerConfig, *, rank: int, local_rank: int,
                         threads: int) -> PreparedData:
    """Collective: the builders prepare (the cache directory's lock held), every rank waits for
    every builder without a collective, then the others open the caches (module doc). A refusal of
    the data (or tokenizers that differ between nodes) refuses on every rank alike."""
    import torch.distributed as dist

    local_ranks: list = [None] * dist.get_world_size()
    dist.all_gather_object(local_ranks, (local_rank, f"host {socket.gethostname()}, pid {os.getpid()}"))
    # Every rank is here: the collective cannot time out. From now on nothing collective until all are done.
    builders = {r: who for r, (local, who) in enumerate(local_ranks) if local == 0}
    if 0 not in builders:
        raise RuntimeError(f"rank 0 has local rank {local_ranks[0][0]}, not 0: ranks must be numbered node by node")
    store = dist.distributed_c10d._get_default_store()  # the rendezvous store of init_process_group
    prefix = f"plsh_dist/data/{next(_calls)}"
    prepared = None
    if rank in builders:
        beacon = _Beacon(store, f"{prefix}/{rank}")
        try:
            prepared = prepare_locked(data, tokenizer, threads=threads, log_reports=rank == 0, status=beacon.say)
            beacon.finish({"fingerprint": prepared.tokenizer.fingerprint})
        except ValueError as exc:  # the data package's refusal of the data: every rank refuses it
            beacon.finish({"refused": str(exc)})
        except BaseException as exc:  # a crash or Ctrl-C: the waiting ranks stop at once, not at a stale heartbeat
            try:
                beacon.finish({"failed": f"{type(exc).__name__}: {exc}"})
                # The store lives in rank 0: were it to exit first, the others would see the store gone
                # and report that, not this error. Wait (briefly: they may be dead) until they have read it.
                deadline = time.monotonic() + READ_WAIT_S
                while store.add(f"{prefix}/{rank}/read", 0) < len(local_ranks) - 1 and time.monotonic() < deadline:
                    time.sleep(POLL_S / 5)
            except Exception:  # noqa: BLE001 - the store is gone too; this rank's own error is the story
                pass
            raise
    # The node's first waiting rank says what the builders do: local rank 1, or the builder of a one-rank node.
    alone = rank in builders and (rank + 1 == len(local_ranks) or local_ranks[rank + 1][0] == 0)
    report = local_rank == 1 or alone
    verdicts = await_builders(store, prefix, builders, report=report)
    for b in sorted(verdicts):  # a crashed builder joins no collective again: stop now
        if "failed" in verdicts[b]:
            raise PeerGone(f"rank {b} ({builders[b]}) failed while preparing the data: {verdicts[b]['failed']}")
    # Every rank has every verdict within a poll of the others: a collective again, and the store's host
    # (rank 0) stays until all have read it.
    dist.all_gather_object([None] * len(local_ranks), None)
    for b in sorted(verdicts):
        if "refused" in verdicts[b]:
            raise RunRefused("data", verdicts[b]["refused"])
    prints = {v["fingerprint"] for v in verdicts.values()}
    if len(prints) > 1:
        raise RunRefused("data", f"the nodes prepared different tokenizers at [tokenizer].model_path = "
                                 f"{tokenizer.model_path!r} (each trained its own: the path is not on a shared "
                                 f"filesystem); train it once (launchers/prepare_data.py or train_tokenizer.py) and "
                                 f"copy it to every node, or put it on a shared filesystem")
    if prepared is not None:
        return prepared
    # The builders have logged the data reports; the others reopen the caches without repeating them.
    with refusing("data", every_rank=False):  # only this rank fails to open the caches its builder made
        return prepare_data(data, tokenizer, log_reports=False)
