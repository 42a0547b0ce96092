"""``sbatch launchers/slurm_pretrain.sh`` on a real Slurm (22.05) across two namespace hosts.

slurmctld on node-0, munged and slurmd on both (tools/cluster/slurm.py). The job
asks for 2 nodes, one CPU rank each (GPUS_PER_NODE=1; the header's GPU and
CPU counts overridden on the sbatch line, as a user would on another
cluster), so its SP = 2 group spans both hosts through torchrun's c10d
rendezvous on node-0. The script's promises, each checked on the real thing:

- it trains on both hosts, and the losses equal those of DeepSpeed's
  hostfile runner for the same layout (test_deepspeed_hostfile.py);
- USR1 to the batch shell (what ``--signal=B:USR1@300`` delivers;
  ``scancel --batch --signal=USR1`` here): the ranks checkpoint and exit 75,
  the script requeues the job, and the requeued job resumes from that
  checkpoint with the uninterrupted run's losses;

A test that signals a job, or starts a second one, while the first trains
makes it hold rank 0 after step 1 (``PLSH_FAULT=pause:0:1``, plsh_dist/faults.py:
``PAUSE_S`` seconds) and acts once step 1 is logged: a 4-step run would
otherwise be over before the signal on a fast machine. The requeued job
resumes after step 1 and does not pause again.
- a failing rank ends the job as FAILED with a non-zero exit code, no hang;
- a second job on the same out_dir is refused (the run lock) while the
  first trains, and the first finishes untouched.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest

from tests.cluster.conftest import unavailable
from tests.train.launcher_runs import ROOT, launcher_env
from tools.cluster.hosts import ClusterUnavailable
from tools.cluster.slurm import slurm_hosts

pytestmark = pytest.mark.cluster

SCRIPT = "launchers/slurm_pretrain.sh"
STEPS = 4
TRAIN = ["--config", "configs/debug.toml", "--parallel.sp_size=2", f"--run.max_steps={STEPS}",
         "--checkpoint.every_steps=0", "--checkpoint.keep_last=0"]
# the header asks for 8 GPUs and 96 CPUs per node: a CPU cluster overrides both on the sbatch line
RESOURCES = ["--nodes=2", "--gpus-per-node=0", "--cpus-per-task=1"]
BOUND_S = 300  # a job takes ~30 s on 2 busy cores; a requeued one waits ~150 s more (Slurm's requeue delay)
LONG_STEPS = 150  # ~0.3 s a step
PAUSE = "pause:0:1"  # rank 0 holds PAUSE_S after step 1: the job still trains when the test acts
_BIN = Path(os.sys.executable).parent


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    try:
        with slurm_hosts(2, tmp_path_factory.mktemp("slurm")) as hosts:
            yield hosts
    except ClusterUnavailable as err:
        unavailable(str(err))


def _env(**extra: str) -> dict[str, str]:
    return launcher_env(PATH=f"{_BIN}{os.pathsep}{os.environ['PATH']}", TORCHRUN=str(_BIN / "torchrun"),
                        GPUS_PER_NODE="1", PLSH_TIMEOUT_S="60", **extra)


def _submit(slurm, log_dir: Path, out_dir: Path, *extra: str, env: dict | None = None) -> str:
    res = slurm[0].run(["sbatch", "--parsable", f"--output={log_dir}/job-%j.out", *RESOURCES, SCRIPT, *TRAIN,
                        f"--run.out_dir={out_dir}", *extra], env=env or _env(), cwd=ROOT)
    return res.stdout.strip().split(";")[0]


def _job(slurm, job: str) -> dict[str, str]:
    text = slurm[0].run(["scontrol", "show", "job", "--oneliner", job]).stdout
    return dict(kv.split("=", 1) for kv in text.split() if "=" in kv)


def _wait_done(slurm, job: str, timeout_s: float = BOUND_S) -> dict[str, str]:
    deadline = time.monotonic() + timeout_s
    while True:
        info = _job(slurm, job)
        if info["JobState"] in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"):
            return info
        if time.monotonic() > deadline:
            slurm[0].run(["scancel", job], check=False)
            raise AssertionError(f"job {job} still {info['JobState']} after {timeout_s:.0f} s (cancelled)")
        time.sleep(1)


def _wait_for_step(out_dir: Path, step: int, timeout_s: float = BOUND_S) -> None:
    deadline = time.monotonic() + timeout_s
    metrics = out_dir / "metrics.jsonl"
    while not (metrics.is_file() and any(json.loads(x).get("step", 0) >= step and "loss" in json.loads(x)
                                         for x in metrics.read_text().splitlines())):
        assert time.monotonic() < deadline, f"no step {step} in {metrics} after {timeout_s:.0f} s"
        time.sleep(0.5)


def _steps(out_dir: Path) -> dict[int, tuple[float, float]]:
    records = [json.loads(x) for x in (out_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: (r["loss"], r["grad_norm"]) for r in records if "loss" in r}


def _log(log_dir: Path, job: str) -> str:
    return (log_dir / f"job-{job}.out").read_text()


@pytest.fixture(scope="module")
def uninterrupted(slurm, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("uninterrupted")
    job = _submit(slurm, tmp, tmp / "out")
    info = _wait_done(slurm, job)
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", _log(tmp, job)[-3000:]
    return job, tmp, _steps(tmp / "out")


def test_sbatch_trains_on_both_hosts(slurm, uninterrupted):
    job, tmp, steps = uninterrupted
    log = _log(tmp, job)
    assert "2 node(s) x 1 GPU(s), rendezvous node-0:" in log
    assert "world_size=2 = dp_size=1 x sp_size=2" in log
    assert re.search(r"^1: ", log, re.M)  # srun --label: task 1 (node-1) ran and wrote
    assert _job(slurm, job)["NodeList"] == "node-[0-1]"
    assert sorted(steps) == list(range(1, STEPS + 1))
    banner = [line for line in log.splitlines() if "plsh_dist pretraining" in line]
    assert banner == ["0: plsh_dist pretraining"]  # logged once, by global rank 0


def _assert_paused_once_and_stopped_at_step_2(log: str) -> None:
    """The signal landed in the pause after step 1: the ranks stopped after step 2 and the requeued
    job, resumed there, did not pause again."""
    assert log.count(f"PLSH_FAULT={PAUSE}: rank 0 pauses") == 1, log[-3000:]
    assert re.search(r"^0: preempted at step 2 ", log, re.M), log[-3000:]


def test_usr1_to_the_batch_shell_checkpoints_requeues_and_resumes_exactly(slurm, uninterrupted, tmp_path):
    out = tmp_path / "out"
    job = _submit(slurm, tmp_path, out, env=_env(PLSH_FAULT=PAUSE))
    _wait_for_step(out, 1)
    slurm[0].run(["scancel", "--batch", "--signal=USR1", job])
    info = _wait_done(slurm, job)
    log = _log(tmp_path, job)
    assert "requeueing job" in log, log[-3000:]
    assert int(info["Restarts"]) == 1
    assert info["JobState"] == "COMPLETED", log[-3000:]
    assert "preempted at step" in log and "resume auto" in log
    _assert_paused_once_and_stopped_at_step_2(log)
    assert _steps(out) == uninterrupted[2]


def test_a_failing_rank_ends_the_job_with_a_clear_exit_code(slurm, tmp_path):
    job = _submit(slurm, tmp_path, tmp_path / "out", env=_env(PLSH_FAULT="raise:1:2"))
    info = _wait_done(slurm, job)
    log = _log(tmp_path, job)
    assert info["JobState"] == "FAILED" and info["ExitCode"] != "0:0", log[-3000:]
    assert int(info["Restarts"]) == 0  # a crash is not a preemption: no requeue
    assert "PLSH_FAULT" in log  # the failing rank's error is in the job's output
    for host in slurm:
        assert "pretrain.py" not in host.run(["ps", "-eo", "args="]).stdout


def test_a_second_job_on_the_same_out_dir_is_refused_and_the_first_is_untouched(slurm, tmp_path):
    out = tmp_path / "out"
    long = f"--run.max_steps={LONG_STEPS}"  # still training when the second job has been refused
    first = _submit(slurm, tmp_path, out, long, env=_env(PLSH_FAULT=PAUSE))
    _wait_for_step(out, 1)
    second = _submit(slurm, tmp_path, out, long)
    second_info = _wait_done(slurm, second)
    assert _job(slurm, first)["JobState"] == "RUNNING"  # the refusal came while the first trained
    first_info = _wait_done(slurm, first)
    second_log = _log(tmp_path, second)
    assert second_info["JobState"] == "FAILED", second_log[-3000:]
    assert "out_dir error:" in second_log, second_log[-3000:]
    assert first_info["JobState"] == "COMPLETED", _log(tmp_path, first)[-3000:]
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r] == list(range(1, LONG_STEPS + 1))  # nothing interleaved


def test_scancel_signal_usr1_to_the_steps_checkpoints_and_requeues(slurm, uninterrupted, tmp_path):
    """Plain ``scancel --signal=USR1`` signals the job's steps (the ranks), not the batch shell."""
    out = tmp_path / "out"
    job = _submit(slurm, tmp_path, out, env=_env(PLSH_FAULT=PAUSE))
    _wait_for_step(out, 1)
    slurm[0].run(["scancel", "--signal=USR1", job])
    info = _wait_done(slurm, job)
    log = _log(tmp_path, job)
    assert "preempted at step" in log, log[-3000:]
    assert "requeueing job" in log, log[-3000:]
    assert int(info["Restarts"]) == 1 and info["JobState"] == "COMPLETED", log[-3000:]
    _assert_paused_once_and_stopped_at_step_2(log)
    assert _steps(out) == uninterrupted[2]
