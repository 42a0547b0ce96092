"""DeepSpeed's own multi-node runner across two namespace hosts: ``deepspeed --hostfile``, pdsh, ssh.

The hostfile lists node-0 and node-1 with one slot each, so the run's one
SP = 2 group spans both hosts: every step's halo exchange and loss
all-reduce crosses the veth between them (gloo over TCP). The runner starts
on node-0, asks node-0 for its address over ssh (``hostname -I``), and pdsh
starts ``deepspeed.launcher.launch`` on each host; the out_dir is one
directory both hosts see, as on a cluster's shared filesystem.

- Same layout on one host (``deepspeed --num_gpus 2`` on node-0): the same
  ranks do the same arithmetic, so losses and grad norms are equal bit for bit.
- Logged once: the run's start-up lines, data reports, validation and
  outputs come from global rank 0 (pdsh prefixes ``node-0:``), never from
  node-1; metrics.jsonl has each step once.
- A preempted run (SIGUSR1 to node-1's rank after step 1) checkpoints into
  the shared out_dir and exits 75; a relaunch from node-1 reads that
  checkpoint on both hosts and continues with the uninterrupted losses.
- Resumed on one host (``deepspeed --num_gpus 1`` on node-1, world 1, SP = 1),
  the same preempted run converts its checkpoint to DeepSpeed's universal
  checkpoint and continues with the uninterrupted losses to 2e-5 relative
  (tests/train/test_resume_shapes.py says why not bit for bit).
- A rank killed (SIGKILL) on node-1 ends the job on both hosts with a
  non-zero exit, no hang, and no process left on either host.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from plsh_dist.checkpoint.manifest import verify_manifest
from plsh_dist.checkpoint.universal import universal_path
from plsh_dist.train.preemption import EXIT_PREEMPTED
from tests.train.launcher_runs import ROOT, Launch, deepspeed_cmd, launcher_env
from tools.cluster.deepspeed_hostfile import RANK_ENV, write_deepspeed_env, write_hostfile

pytestmark = pytest.mark.cluster

CONFIG = ROOT / "configs" / "debug.toml"
STEPS = 4
LAYOUT = ["--parallel.sp_size=2", f"--run.max_steps={STEPS}", "--parallel.timeout_s=60",
          "--checkpoint.every_steps=0", "--checkpoint.keep_last=0"]
BOUND_S = 240  # a launch takes ~25 s on 2 busy cores; a hang fails the test instead of blocking
PORT = 29500  # inside node-0's own network namespace: nothing else listens there
RUN_LOG = ("plsh_dist pretraining", "validation:", "outputs:", "train (", "val (", "preempted at step")


def _metrics(out_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]


def _steps(out_dir: Path) -> dict[int, tuple[float, float]]:
    return {r["step"]: (r["loss"], r["grad_norm"]) for r in _metrics(out_dir) if "loss" in r}


def _launch(host, cmd: list[str], env_file: Path, log_dir: Path, name: str, **extra_env: str):
    write_deepspeed_env(env_file, {**RANK_ENV, **extra_env})
    env = launcher_env(DS_ENV_FILE=str(env_file), **extra_env)
    return Launch(host.command(cmd, cwd=ROOT), env, log_dir, name).wait(BOUND_S)


def _lines_of(output: str, host: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith(f"{host}: ")]


@pytest.fixture(scope="module")
def one_host(hosts, tmp_path_factory):
    """The reference: the same layout (2 ranks, SP = 2) on node-0 alone."""
    tmp = tmp_path_factory.mktemp("one_host")
    out = tmp / "out"
    res = _launch(hosts[0], deepspeed_cmd(2, CONFIG, [*LAYOUT, f"--run.out_dir={out}"], port=PORT),
                  tmp / "env", tmp, "one_host")
    assert res.returncode == 0, res.stderr[-3000:]
    return _steps(out)


@pytest.fixture(scope="module")
def hostfile(hosts, tmp_path_factory):
    return write_hostfile(tmp_path_factory.mktemp("hostfile") / "hostfile", hosts.names, slots=1)


def test_hostfile_run_equals_one_host_and_is_logged_once(hosts, hostfile, one_host, tmp_path):
    out = tmp_path / "out"
    res = _launch(hosts[0], deepspeed_cmd(0, CONFIG, [*LAYOUT, f"--run.out_dir={out}"], hostfile=hostfile,
                                          port=PORT), tmp_path / "env", tmp_path, "two_hosts")
    assert res.returncode == 0, res.stderr[-3000:]
    both = res.stdout + res.stderr
    assert "Running on the following workers: node-0,node-1" in both
    assert "node-0: " in both and "node-1: " in both  # pdsh ran the launch on both hosts
    assert any("world_size=2 = dp_size=1 x sp_size=2" in line for line in _lines_of(res.stdout, "node-0"))

    got = _steps(out)
    assert sorted(got) == list(range(1, STEPS + 1))
    assert got == one_host  # bit for bit: same ranks, same arithmetic, only the wire differs

    steps = [r["step"] for r in _metrics(out) if "loss" in r]
    assert steps == sorted(set(steps))  # each step logged once
    node1 = _lines_of(both, "node-1")
    assert not [line for line in node1 if any(mark in line for mark in RUN_LOG)], "\n".join(node1)
    for mark in ("plsh_dist pretraining", "validation:", "outputs:"):
        assert sum(mark in line for line in _lines_of(both, "node-0")) == 1, mark


def test_preempted_hostfile_run_resumes_from_the_other_host(hosts, hostfile, one_host, tmp_path):
    out = tmp_path / "out"
    overrides = [*LAYOUT, f"--run.out_dir={out}"]
    first = _launch(hosts[0], deepspeed_cmd(0, CONFIG, overrides, hostfile=hostfile, port=PORT), tmp_path / "env",
                    tmp_path, "preempted", PLSH_FAULT="sigusr1:1:1")
    assert first.returncode == EXIT_PREEMPTED, first.stderr[-3000:]
    said = [line for line in (first.stdout + first.stderr).splitlines() if "preempted at step" in line]
    assert len(said) == 1 and said[0].startswith("node-0: preempted at step "), said  # rank 0 says it, once
    # the ranks agree on the stop at the next step's all-reduce: step 1 or 2, never the last
    stopped = int(said[0].split("preempted at step ")[1].split()[0])
    assert 1 <= stopped < STEPS and sorted(_steps(out)) == list(range(1, stopped + 1))

    # Launched from node-1 this time: both hosts' ranks read the checkpoint node-0's rank 0 published.
    resumed = _launch(hosts[1], deepspeed_cmd(0, CONFIG, [*overrides, "--checkpoint.resume=auto"],
                                              hostfile=hostfile, port=PORT + 1),
                      tmp_path / "env", tmp_path, "resumed")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert _steps(out) == one_host


def test_hostfile_run_resumes_on_one_host_at_another_shape(hosts, hostfile, one_host, tmp_path):
    """A node lost: the two-host run (world 2, SP = 2, ZeRO 1), preempted, resumes on node-1 alone
    with one rank (SP = 1; DP stays 1, so the same micro-batch keeps the global batch)."""
    out = tmp_path / "out"
    overrides = [*LAYOUT, f"--run.out_dir={out}"]
    first = _launch(hosts[0], deepspeed_cmd(0, CONFIG, overrides, hostfile=hostfile, port=PORT), tmp_path / "env",
                    tmp_path, "preempted", PLSH_FAULT="sigusr1:1:1")
    assert first.returncode == EXIT_PREEMPTED, first.stderr[-3000:]
    stopped = max(_steps(out))
    assert 1 <= stopped < STEPS
    tag_dir = out / "checkpoints" / f"step_{stopped:08d}"

    resumed = _launch(hosts[1], deepspeed_cmd(1, CONFIG, [*overrides, "--parallel.sp_size=1",
                                                          "--checkpoint.resume=auto"], port=PORT + 1),
                      tmp_path / "env", tmp_path, "one_host_resumed")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    said = resumed.stdout + resumed.stderr
    assert ("resume at another shape: world 2 (DP 1 x SP 2), ZeRO 1, fp32 -> world 1 (DP 1 x SP 1), ZeRO 1, "
            "fp32") in said, said[-3000:]
    assert f": {stopped} -> {STEPS} (resumed from {tag_dir}," in said, said[-3000:]
    assert (universal_path(tag_dir) / "zero").is_dir()
    assert verify_manifest(tag_dir) == []  # the two-host tag is left as it was

    got = _steps(out)
    assert sorted(got) == list(range(1, STEPS + 1))
    assert {step: got[step] for step in range(1, stopped + 1)} == {
        step: one_host[step] for step in range(1, stopped + 1)}  # before the stop: the two-host run's own
    resumed_losses = [got[step][0] for step in range(stopped + 1, STEPS + 1)]
    assert resumed_losses == pytest.approx([one_host[step][0] for step in range(stopped + 1, STEPS + 1)], rel=2e-5)


def test_a_rank_killed_on_one_host_ends_the_job_on_both(hosts, hostfile, tmp_path):
    out = tmp_path / "out"
    res = _launch(hosts[0], deepspeed_cmd(0, CONFIG, [*LAYOUT, f"--run.out_dir={out}"], hostfile=hostfile,
                                          port=PORT), tmp_path / "env", tmp_path, "killed", PLSH_FAULT="kill:1:2")
    assert res.returncode != 0
    assert res.wall_s < BOUND_S
    for host in hosts:
        left = host.run(["ps", "-eo", "args="]).stdout
        assert "pretrain.py" not in left, f"{host.name} still runs:\n{left}"
