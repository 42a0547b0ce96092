"""Ctrl-C under the ``deepspeed`` launcher (docs/training.md, "Ctrl-C under the deepspeed launcher").

A terminal's Ctrl-C sends SIGINT to the whole foreground process group: the
``deepspeed`` runner, its ``deepspeed.launcher.launch`` and the ranks. The
ranks take it as they do without a launcher (rank 0 says that every rank
finishes its step and checkpoints); launch.py sends them SIGTERM (the same
stop request) and waits up to 30 s for them; DeepSpeed's runner (``deepspeed/launcher/runner.py``, ``main``)
waits for launch.py with SIGINT's default action, so it prints a
``KeyboardInterrupt`` traceback from ``result.wait()`` and returns at once,
while the ranks still write their checkpoint. Nothing of ours runs in that
process, so this test pins what our side does: the one traceback is the
runner's own, and the ranks end with the step's checkpoint published, no
failure file, the lock released. One rank, a tiny model; ~20 s.
"""

from __future__ import annotations

import os
import signal
import time

from tests.train.conftest import base_overrides
from tests.train.launcher_runs import Launch, deepspeed_cmd, empty_config, launcher_env

_TIMEOUT_S = 180  # start-up ~15 s on 2 busy cores; a hang must fail the test


def test_ctrl_c_under_deepspeed_stops_the_ranks_cleanly(tiny_data, tmp_path):
    out = tmp_path / "run"
    overrides = base_overrides(tiny_data, out, "--run.max_steps=100000", "--logging.every_steps=1",
                               "--logging.eval_batches=0", "--checkpoint.every_steps=0")
    launch = Launch(deepspeed_cmd(1, empty_config(tmp_path), overrides), launcher_env(), tmp_path / "logs", "ctrl_c")
    metrics, t0 = out / "metrics.jsonl", time.time()
    while not (metrics.is_file() and metrics.read_text().count("\n") >= 2):
        assert launch.proc.poll() is None, (tmp_path / "logs" / "ctrl_c.err").read_text()[-3000:]
        assert time.time() - t0 < _TIMEOUT_S / 2, "no training step logged"
        time.sleep(0.2)
    os.killpg(launch.proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
    done = launch.wait(_TIMEOUT_S)

    # The runner dies of the SIGINT it does not handle (a shell shows exit 130).
    assert done.returncode == -signal.SIGINT, (done.returncode, done.stderr[-3000:])
    # The ranks took the Ctrl-C as a plain process does: finish the step, checkpoint.
    assert "Ctrl-C: every rank finishes its step and writes a checkpoint" in done.stderr, done.stderr[-3000:]
    while (out / "run.lock").exists():  # the runner returned at once; the rank is still saving
        assert time.time() - t0 < _TIMEOUT_S, "the rank did not finish after Ctrl-C"
        time.sleep(0.2)
    latest = out / "checkpoints" / "latest"
    assert latest.is_file() and (out / "checkpoints" / latest.read_text().strip()).is_dir()
    tracebacks = done.stderr.split("Traceback (most recent call last):")[1:]
    assert len(tracebacks) == 1, done.stderr[-3000:]
    assert "deepspeed/launcher/runner.py" in tracebacks[0] and "result.wait()" in tracebacks[0], tracebacks[0]
    assert "plsh_dist" not in tracebacks[0] and "pretrain.py" not in tracebacks[0], tracebacks[0]
    # Nothing is left half-done: no failure record, the lock released, no partial checkpoint.
    assert not (out / "failures").exists()
    assert not [p for p in out.rglob("*.partial")], sorted(out.rglob("*"))
