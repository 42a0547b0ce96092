"""Preemption through the real launchers, signals sent from outside mid-run, then resume (slow).

Two CPU ranks (gloo, SP = 2), 60 steps of ~0.1 s, no periodic checkpoint.
An uninterrupted run is the reference. Each preempted run is signalled once
its metrics show step 2:

- deepspeed launcher, SIGTERM to both ranks (the tasks, as a scheduler
  signals them): the launcher exits 75, the ranks' exit code;
- torchrun started with SIGUSR1 ignored (as ``launchers/slurm_pretrain.sh``
  starts it on every node), SIGUSR1 to torchrun and rank 1 only (Slurm's step
  signal reaches every process of the step): torchrun survives it, rank 0
  stops at the same step through the step's all-reduce, and torchrun reports
  75 for both ranks (its own status is 1 for any failed rank).

Both print the one ``preempted at step N ...`` line, publish ``step_N`` as the
only checkpoint, and the relaunch with ``--resume auto`` logs steps N+1..60
with exactly the reference's loss, grad_norm and lr.
"""

from __future__ import annotations

import json
import re
import signal
import time
from pathlib import Path

import psutil
import pytest

from plsh_dist.checkpoint.line import complete_tags, tag_for_step
from plsh_dist.train.preemption import EXIT_PREEMPTED
from tests.train.conftest import base_overrides
from tests.train.launcher_runs import Launch, deepspeed_cmd, empty_config, launcher_env, run, torchrun_cmd

_STEPS = 60
_LAUNCH_TIMEOUT_S = 240  # a launch takes ~35 s on 2 busy cores; a hang must fail the test, not block CI
_LINE = re.compile(r"preempted at step (\d+) \((.+?)\): checkpoint (\S+) written; resume with")


def _overrides(tiny_data, out_dir: Path, *extra: str) -> list[str]:
    return base_overrides(
        tiny_data, out_dir, "--attention.bias=plsh", "--attention.num_samples=2", "--parallel.sp_size=2",
        "--deepspeed.zero_stage=1", f"--run.max_steps={_STEPS}", "--checkpoint.every_steps=0",
        "--checkpoint.keep_last=0", "--logging.every_steps=1", "--logging.eval_batches=0",
        "--parallel.timeout_s=60", *extra)


def _cmd(launcher: str, tiny_data, out_dir: Path, *extra: str) -> list[str]:
    overrides = _overrides(tiny_data, out_dir, *extra)
    if launcher == "deepspeed":
        return deepspeed_cmd(2, empty_config(out_dir.parent), overrides)
    # Like slurm_pretrain.sh: an ignored signal stays ignored across exec, so torchrun (which
    # has no SIGUSR1 handler) survives the step-wide SIGUSR1; the ranks install their own.
    return ["bash", "-c", 'trap "" USR1; exec "$0" "$@"', *torchrun_cmd(2, empty_config(out_dir.parent), overrides)]


def _step_metrics(out_dir: Path) -> dict[int, tuple]:
    path = out_dir / "metrics.jsonl"
    if not path.is_file():
        return {}
    records = [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]
    return {r["step"]: (r["loss"], r["grad_norm"], r["lr"]) for r in records if "loss" in r}


def _ranks(launch: Launch) -> dict[int, psutil.Process]:
    """The training processes under the launcher, by global rank (their RANK variable)."""
    found = {}
    for proc in psutil.Process(launch.proc.pid).children(recursive=True):
        try:
            cmd = proc.cmdline()
            if any(a.endswith("pretrain.py") for a in cmd) and not any(
                    "deepspeed" in a or "torchrun" in a or "torch.distributed.run" in a for a in cmd[:4]):
                found[int(proc.environ()["RANK"])] = proc
        except (psutil.NoSuchProcess, KeyError):
            continue
    return found


def _signal_mid_run(launch: Launch, out_dir: Path, sig: int, targets) -> None:
    """Wait until step 2 is logged, then send ``sig`` to ``targets(launch, ranks)``."""
    deadline = time.monotonic() + _LAUNCH_TIMEOUT_S
    while len(_step_metrics(out_dir)) < 2:
        assert launch.proc.poll() is None, f"{launch.name}: the launcher exited before step 2"
        assert time.monotonic() < deadline, f"{launch.name}: no step 2 after {_LAUNCH_TIMEOUT_S} s"
        time.sleep(0.02)
    ranks = _ranks(launch)
    assert sorted(ranks) == [0, 1], ranks
    for proc in targets(launch, ranks):
        proc.send_signal(sig)


@pytest.fixture(scope="module")
def reference(tiny_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("preempt_launcher") / "full"
    proc = run(_cmd("deepspeed", tiny_data, out), launcher_env(), out.parent / "logs", "full", _LAUNCH_TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    metrics = _step_metrics(out)
    assert sorted(metrics) == list(range(1, _STEPS + 1))
    return metrics


CASES = {
    "deepspeed-SIGTERM-all-ranks": ("deepspeed", signal.SIGTERM, lambda launch, ranks: ranks.values()),
    "torchrun-SIGUSR1-launcher-and-rank1": ("torchrun", signal.SIGUSR1,
                                            lambda launch, ranks: [psutil.Process(launch.proc.pid), ranks[1]]),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_signal_mid_run_checkpoints_exits_75_and_resumes_exactly(tiny_data, tmp_path, reference, case):
    launcher, sig, targets = CASES[case]
    out = tmp_path / "cut"
    launch = Launch(_cmd(launcher, tiny_data, out), launcher_env(), tmp_path / "logs", "cut")
    _signal_mid_run(launch, out, sig, targets)
    cut = launch.wait(_LAUNCH_TIMEOUT_S)
    text = cut.stdout + cut.stderr
    if launcher == "deepspeed":
        assert cut.returncode == EXIT_PREEMPTED, text[-3000:]
    else:  # torchrun survived the signal and names the ranks' exit code
        assert cut.returncode == 1, text[-3000:]
        codes = re.findall(r"exitcode\s*:\s*(-?\d+)", cut.stderr)
        # Both ranks 75: a rank still shutting down when the other left ignores torchrun's SIGTERM.
        assert codes and set(codes) == {str(EXIT_PREEMPTED)}, cut.stderr[-3000:]

    (match,) = _LINE.findall(text)  # one line, from rank 0
    step, who, tag_dir = int(match[0]), match[1], Path(match[2])
    assert 2 <= step < _STEPS, text[-3000:]
    if sig == signal.SIGTERM:
        assert who == "SIGTERM on 2 of 2 rank(s)"
    else:
        assert who == "a stop signal on 1 of 2 rank(s)"  # rank 0 was not signalled
    assert tag_dir == out / "checkpoints" / tag_for_step(step)
    assert complete_tags(out / "checkpoints") == [tag_for_step(step)]
    assert (out / "checkpoints" / "latest").read_text() == tag_for_step(step)
    assert sorted(_step_metrics(out)) == list(range(1, step + 1))  # it stopped right after that step
    assert not (out / "run.lock").exists()  # exit 75 released the run directory's lock

    resumed = run(_cmd(launcher, tiny_data, out, "--checkpoint.resume=auto"), launcher_env(), tmp_path / "logs",
                  "resumed", _LAUNCH_TIMEOUT_S)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "resumed from" in resumed.stdout + resumed.stderr
    assert _step_metrics(out) == reference  # every step, exactly: the cut and the resumed pieces
