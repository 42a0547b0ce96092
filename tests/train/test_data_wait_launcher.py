"""Launches whose rank 0 must tokenize: a build longer than [parallel].timeout_s succeeds, and a
builder killed midway leaves no cache and no lock that blocks the next launch (data_wait.py)."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from tests.train.conftest import base_overrides
from tests.train.launcher_runs import Launch, empty_config, launcher_env, run, torchrun_cmd

pytestmark = pytest.mark.slow


def _overrides(tiny_data, tmp_path, *extra):
    # A cache of its own: the session's tiny_data cache may be warm already.
    return [*base_overrides(tiny_data, tmp_path / "out"), f"--data.cache_dir={tmp_path / 'cache'}",
            "--run.max_steps=2", *extra]


def test_a_build_longer_than_the_collective_timeout_succeeds(tiny_data, tmp_path):
    overrides = _overrides(tiny_data, tmp_path, "--parallel.timeout_s=5")
    # Each split waits 8 s before it is tokenized: rank 1 waits 16 s, three times the timeout.
    env = launcher_env(PLSH_SLOW_TOKENIZE_S="8")
    done = run(torchrun_cmd(2, empty_config(tmp_path), overrides), env, tmp_path, "slow", timeout_s=240)
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-3000:]
    assert "waiting 0 s for rank 0" in log and "to prepare the data (no timeout while its heartbeat lives)" in log
    assert "tokenizing train" in log and "built token cache" in log
    assert "a peer rank failed or timed out" not in log


def test_a_killed_builder_leaves_no_cache_and_no_lock_that_blocks_the_next_launch(tiny_data, tmp_path):
    overrides = _overrides(tiny_data, tmp_path)
    cache, lock = tmp_path / "cache", tmp_path / "cache" / "prepare.lock"
    launch = Launch(torchrun_cmd(2, empty_config(tmp_path), overrides), launcher_env(PLSH_SLOW_TOKENIZE_S="600"),
                    tmp_path, "killed")
    deadline = time.time() + 120
    while not lock.exists() and time.time() < deadline:
        time.sleep(0.5)
    builder = json.loads(lock.read_text())["pid"]
    time.sleep(2)  # into the (slowed) tokenizing
    os.kill(builder, signal.SIGKILL)
    killed = launch.wait(timeout_s=180)
    assert killed.returncode != 0
    assert not list(cache.rglob("meta.json")) and not list(cache.rglob("tokens.bin"))  # nothing taken for a cache
    assert lock.exists()  # the killed builder's, left behind: the next launch takes it over

    again = run(torchrun_cmd(2, empty_config(tmp_path), overrides), launcher_env(), tmp_path, "again", timeout_s=240)
    log = again.stdout + again.stderr
    assert again.returncode == 0, log[-3000:]
    assert "is stale (its process is gone); taking it over" in log
    assert list(cache.rglob("meta.json")) and not lock.exists()
