"""``launchers/slurm_pretrain.sh`` on preemption: USR1 -> the ranks checkpoint and stop -> requeue (fast).

Fake Slurm tools on PATH, as in test_docker_lint.py, but with a step that
behaves like the real one: ``srun`` starts each node's command (the
script's ``bash -c 'trap "" USR1; exec torchrun ...'``); the fake
``torchrun`` is a bash script that starts one fake rank (Python, catching
SIGUSR1 / SIGTERM and exiting 75 as pretrain.py does) and reports a failed
rank as 1, as torchrun does; the fake ``scancel --signal=SIG`` sends SIG to
every torchrun and rank (the step's processes, as slurmstepd does).

- USR1 to the batch script: it runs ``scancel --signal=USR1``, torchrun
  survives the signal (bash cannot trap a signal ignored on entry, so it
  would die with 138 without the script's ``trap ""``), the ranks exit 75,
  and once the step has ended the script runs ``scontrol requeue``;
- a step that exits 75 is requeued, also without USR1 (srun's tasks are the
  ranks, or a launcher that passes their status through);
- SIGTERM to the batch script (scancel, Slurm's own preemption): no requeue,
  even though the ranks exit 75;
- any other failure without USR1: no requeue (Slurm's --requeue handles
  node failures).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from plsh_dist.train.preemption import EXIT_PREEMPTED

ROOT = Path(__file__).resolve().parents[1]
SLURM = ROOT / "launchers" / "slurm_pretrain.sh"
TIMEOUT = 60
NODES = 2

FAKE_SCONTROL = """#!/usr/bin/env bash
if [[ $1 == show && $2 == hostnames ]]; then printf '%s\\n' node-a node-b; exit 0; fi
echo "scontrol $*" >> "$FAKE_LOG"
"""

FAKE_SCANCEL = """#!/usr/bin/env bash
echo "scancel $*" >> "$FAKE_LOG"
[[ $1 == --signal=* ]] || exit 0
while read -r pid; do kill -s "${1#--signal=}" "$pid" 2> /dev/null || true; done < "$FAKE_PIDS"
"""

FAKE_SRUN = """#!/usr/bin/env bash
echo "srun $*" >> "$FAKE_LOG"
nodes=1
while [[ $1 == -* ]]; do case $1 in --nodes=*) nodes=${1#*=} ;; esac; shift; done
pids=()
for ((n = 0; n < nodes; n++)); do SLURM_NODEID=$n "$@" & pids+=($!); done
status=0
for p in "${pids[@]}"; do wait "$p" || status=$?; done
exit "$status"
"""

FAKE_RANK = (
    "import os, signal, sys, time\n"
    "def stop(signum, frame):\n"
    "    open(sys.argv[1], 'a').write(f'rank stopped on {signal.Signals(signum).name}\\\\n')\n"
    "    marker = os.environ.get('PLSH_PREEMPTED_MARKER')  # as pretrain.py: mark_preempted()\n"
    "    if marker:\n"
    "        open(marker, 'a').close()\n"
    "    sys.exit(75)\n"
    "signal.signal(signal.SIGUSR1, stop)\n"
    "signal.signal(signal.SIGTERM, stop)\n"
    "open(sys.argv[1], 'a').write('rank ready\\n')\n"
    "time.sleep(float(sys.argv[2]))\n"
    "sys.exit(int(sys.argv[3]))\n"
)

FAKE_TORCHRUN = """#!/usr/bin/env bash
echo $$ >> "$FAKE_PIDS"
{python} -c "$FAKE_RANK_CODE" "$FAKE_LOG" "${{FAKE_RANK_SECONDS:-30}}" "${{FAKE_RANK_STATUS:-0}}" &
rank=$!
echo $rank >> "$FAKE_PIDS"
echo $rank >> "$FAKE_PIDS.ranks"
wait $rank && rc=0 || rc=$?
echo "torchrun: rank exited $rc" >> "$FAKE_LOG"
if [[ ${{FAKE_PASS_STATUS:-0}} == 1 ]]; then exit $rc; fi
exit $((rc == 0 ? 0 : 1))
"""


@pytest.fixture()
def job(tmp_path: Path):
    """start(**env) -> the batch script as a background 2-node job; and the fake tools' log."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tools = {"scontrol": FAKE_SCONTROL, "scancel": FAKE_SCANCEL, "srun": FAKE_SRUN,
             "torchrun": FAKE_TORCHRUN.format(python=sys.executable)}
    for name, text in tools.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    log, pids = tmp_path / "slurm.log", tmp_path / "step.pids"
    log.touch()
    pids.touch()
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("SLURM_", "PLSH_", "MASTER_", "GPUS_PER_NODE", "MAX_RESTARTS", "DRY_RUN", "TORCHRUN"))}
    base.update(PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", SLURM_JOB_ID="4242",
                SLURM_JOB_NODELIST="node-[a-b]", SLURM_NNODES=str(NODES), SLURM_SUBMIT_DIR=str(ROOT),
                SLURM_GPUS_ON_NODE="1", FAKE_LOG=str(log), FAKE_PIDS=str(pids), FAKE_RANK_CODE=FAKE_RANK)
    started = []

    def start(**env: str) -> subprocess.Popen:
        proc = subprocess.Popen(["bash", str(SLURM), "--config", "c.toml"], env={**base, **env},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        started.append(proc)
        deadline = time.monotonic() + TIMEOUT
        # every torchrun is up and its rank has installed its handlers
        while len(pids.read_text().split()) < 2 * NODES or log.read_text().count("rank ready") < NODES:
            assert time.monotonic() < deadline and proc.poll() is None, "the step never started"
            time.sleep(0.05)
        return proc

    yield start, log
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _finish(proc: subprocess.Popen) -> tuple[int, str, str]:
    stdout, stderr = proc.communicate(timeout=TIMEOUT)
    return proc.returncode, stdout, stderr


def test_usr1_makes_the_ranks_checkpoint_then_requeues_after_the_step(job):
    start, log = job
    proc = start()
    proc.send_signal(signal.SIGUSR1)  # what --signal=B:USR1@300 delivers
    code, stdout, stderr = _finish(proc)
    text = log.read_text()
    assert "scancel --signal=USR1 4242" in text
    assert text.count("rank stopped on SIGUSR1") == NODES
    assert text.count(f"torchrun: rank exited {EXIT_PREEMPTED}") == NODES  # torchrun survived the USR1
    assert "srun exited with status 1" in stdout  # torchrun's status for a failed rank
    assert text.rstrip().endswith("scontrol requeue 4242")  # after the step, never during it
    assert "requeueing job 4242 (step status 1)" in stderr
    assert code == 1


def test_a_step_that_exits_75_is_requeued(job):
    start, log = job
    proc = start(FAKE_PASS_STATUS="1", FAKE_RANK_SECONDS="0.5", FAKE_RANK_STATUS=str(EXIT_PREEMPTED))
    code, _, stderr = _finish(proc)
    assert code == EXIT_PREEMPTED
    assert "scontrol requeue 4242" in log.read_text()
    assert f"requeueing job 4242 (step status {EXIT_PREEMPTED})" in stderr


def test_sigterm_to_the_script_is_not_requeued_even_after_a_checkpoint(job):
    start, log = job
    proc = start(FAKE_PASS_STATUS="1")
    proc.send_signal(signal.SIGTERM)  # scancel / Slurm's preemption: the script and the step get it
    time.sleep(0.3)
    for pid in log.with_name("step.pids.ranks").read_text().split():  # Slurm (or torchrun) passes it on
        try:
            os.kill(int(pid), signal.SIGTERM)
        except ProcessLookupError:
            pass
    code, _, stderr = _finish(proc)
    assert code == EXIT_PREEMPTED  # the ranks checkpointed
    assert "no requeue from here" in stderr
    assert "scontrol requeue" not in log.read_text()


def test_other_failures_are_not_requeued(job):
    start, log = job
    proc = start(FAKE_PASS_STATUS="1", FAKE_RANK_SECONDS="0.5", FAKE_RANK_STATUS="7")
    code, _, _ = _finish(proc)
    assert code == 7
    assert "scontrol requeue" not in log.read_text()


def test_usr1_to_the_ranks_only_is_requeued_through_their_marker(job, tmp_path):
    """``scancel --signal=USR1 JOB`` (no --batch) reaches the ranks, not the script; torchrun reports 1."""
    start, log = job
    proc = start(TMPDIR=str(tmp_path))
    for pid in log.with_name("step.pids.ranks").read_text().split():
        os.kill(int(pid), signal.SIGUSR1)
    code, stdout, stderr = _finish(proc)
    assert "srun exited with status 1" in stdout  # torchrun's status for its ranks' 75
    assert log.read_text().rstrip().endswith("scontrol requeue 4242")
    assert "requeueing job 4242 (step status 1)" in stderr
    assert not (tmp_path / "plsh-preempted-4242").exists()  # read once, then removed
    assert code == 1
