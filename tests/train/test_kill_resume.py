"""kill -9 of one rank, then ``--resume auto``, through the real deepspeed launcher (slow).

Two CPU processes (gloo, SP = 2). An uninterrupted 4-step run is the
reference. Each faulty run dies by SIGKILL of one rank (``PLSH_FAULT``): the
launcher must exit non-zero; the relaunch with ``--resume auto`` must start
from the checkpoint at step 2 and log steps 3..4 with exactly the reference's
loss, grad_norm and lr (no tolerance: same data order, same hash seeds,
restored optimizer and scheduler, same arithmetic). No launch, killed or not,
leaves DeepSpeed's CPU all-reduce buffers in /dev/shm (cpu_shm.py).

- ``kill:1:2``: rank 1 dies right after step 2's checkpoint was published;
- ``kill:0:4:in_checkpoint``: rank 0 dies after DeepSpeed wrote the final checkpoint's (step 4)
  shards but before publishing it, so step 2 is still the latest checkpoint.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from plsh_dist.distributed.cpu_shm import allreduce_buffer
from plsh_dist.distributed.ports import free_port
from tests.train.conftest import base_overrides
from tests.train.launcher_runs import Finished, deepspeed_cmd, empty_config, launcher_env, run

_LAUNCH_TIMEOUT_S = 240  # a launch takes ~30 s on 2 busy cores; a hang must fail the test, not block CI
_STEPS = 4


def _launch(tiny_data, out_dir: Path, *extra: str, fault: str | None = None) -> Finished:
    overrides = base_overrides(
        tiny_data, out_dir, "--attention.bias=plsh", "--attention.num_samples=2", "--parallel.sp_size=2",
        "--deepspeed.zero_stage=1", f"--run.max_steps={_STEPS}", "--checkpoint.every_steps=2",
        "--checkpoint.keep_last=0", "--logging.every_steps=1", "--logging.eval_batches=0",
        "--parallel.timeout_s=60", *extra)
    env = launcher_env(**({"PLSH_FAULT": fault} if fault else {}))
    port = free_port()
    cmd = deepspeed_cmd(2, empty_config(out_dir.parent), overrides, port=port)
    name = f"{out_dir.name}_{(fault or 'clean').replace(':', '_')}"
    finished = run(cmd, env, out_dir.parent / "logs", name, _LAUNCH_TIMEOUT_S)
    rendezvous = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}  # the runner's, for local ranks
    assert not [p for p in (allreduce_buffer(r, rendezvous) for r in range(2)) if p.exists()]
    return finished


def _step_metrics(out_dir: Path) -> dict[int, tuple]:
    records = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: (r["loss"], r["grad_norm"], r["lr"]) for r in records if "loss" in r}


@pytest.fixture(scope="module")
def reference(tiny_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("kill_resume") / "full"
    proc = _launch(tiny_data, out)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    metrics = _step_metrics(out)
    assert sorted(metrics) == list(range(1, _STEPS + 1))
    return metrics


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["kill:1:2", "kill:0:4:in_checkpoint"])
def test_kill9_then_resume_auto_matches_uninterrupted_run(tiny_data, tmp_path, reference, fault):
    out = tmp_path / "cut"
    killed = _launch(tiny_data, out, fault=fault)
    assert killed.returncode != 0, "the launcher must report a killed rank"
    tags = sorted(p.name for p in (out / "checkpoints").iterdir() if p.is_dir())
    if fault.endswith("in_checkpoint"):
        assert tags == ["step_00000002", "step_00000004.partial"]  # step 4 never published
    else:
        assert tags == ["step_00000002"]
    assert (out / "checkpoints" / "latest").read_text() == "step_00000002"

    resumed = _launch(tiny_data, out, "--checkpoint.resume=auto")
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "resumed from" in resumed.stdout + resumed.stderr
    metrics = _step_metrics(out)
    assert sorted(metrics) == list(range(1, _STEPS + 1))  # steps 3..4 once, after the kept 1..2
    for step in range(3, _STEPS + 1):
        assert metrics[step] == reference[step], f"step {step}: resumed {metrics[step]} != uninterrupted"
    for step in (1, 2):  # logged by the killed run before its checkpoint, kept
        assert metrics[step] == reference[step]
