"""Ctrl-C under the ``deepspeed`` launcher (docs/training.md, "Ctrl-C under the deepspeed launcher").

A terminal's Ctrl-C sends SIGINT to the whole foreground process group: the
``deepspeed`` runner, its ``deepspeed.launcher.launch`` and the ranks. The
ranks stop as without a launcher (``rank R: interrupted``, no failure file,
the out_dir's lock released, no half-written checkpoint), and launch.py logs
``Main process received SIGINT, exiting``; but DeepSpeed's runner
(``deepspeed/launcher/runner.py``, ``main``) waits for launch.py with
SIGINT's default action and prints a ``KeyboardInterrupt`` traceback from
``result.wait()``. Nothing of ours runs in that process, so this test pins
what our side does, and that the one traceback is the runner's own. One
rank, a tiny model; ~20 s.
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
    # The ranks stopped as a plain process does: one line each, no traceback of ours.
    assert "rank 0: interrupted" in done.stderr, done.stderr[-3000:]
    assert "Main process received SIGINT, exiting" in done.stdout + done.stderr
    tracebacks = done.stderr.split("Traceback (most recent call last):")[1:]
    assert len(tracebacks) == 1, done.stderr[-3000:]
    assert "deepspeed/launcher/runner.py" in tracebacks[0] and "result.wait()" in tracebacks[0], tracebacks[0]
    assert "plsh_dist" not in tracebacks[0] and "pretrain.py" not in tracebacks[0], tracebacks[0]
    # Nothing is left half-done: no failure record, the lock released, no partial checkpoint.
    assert not (out / "failures").exists()
    assert not (out / "run.lock").exists()
    assert not [p for p in out.rglob("*.partial")], sorted(out.rglob("*"))
