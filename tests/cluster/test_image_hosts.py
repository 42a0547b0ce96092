"""DeepSpeed's hostfile runner across two hosts that run from the CPU image's root filesystem.

What a user's cluster does with the image: every node runs the image's Python,
DeepSpeed and package (tools/cluster/image_hosts.py: each host mounts the exported
image, its sshd chroots every session into it), the runner on node-0 starts
the ranks on both hosts through pdsh and ssh, and the out_dir is a directory
both hosts share. ``make test-cluster`` exports the image first (``make
image-rootfs``, or reuses what ``make image-check`` left) and names it in
``PLSH_IMAGE_ROOTFS``; without it the module skips, naming the missing
rootfs, except under CI (``CI=true``), where that is a failure.

- two hosts, one rank each, SP = 2 across them: the image's interpreter
  runs on both hosts (pdsh's command and each host's ranks name /opt/venv/bin/python3),
  each step logged once, and the losses equal those of the same layout on
  node-0 alone, bit for bit.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.cluster.conftest import unavailable
from tools.cluster.deepspeed_hostfile import RANK_ENV, write_deepspeed_env, write_hostfile
from tools.cluster.hosts import ClusterUnavailable
from tools.cluster.image_hosts import IMAGE_ENV, SHARED, image_command, image_hosts

pytestmark = pytest.mark.cluster

STEPS = 4
BOUND_S = 300
PORT = 29500
LAYOUT = ["--config", "configs/debug.toml", "--parallel.sp_size=2", f"--run.max_steps={STEPS}",
          "--parallel.timeout_s=60", "--checkpoint.every_steps=0", "--checkpoint.keep_last=0",
          f"--data.cache_dir={SHARED}/data_cache", f"--data.corpus_dir={SHARED}/data_cache/stdlib_corpus",
          f"--tokenizer.model_path={SHARED}/data_cache/tokenizer_bpe2k.model"]


@pytest.fixture(scope="module")
def image(tmp_path_factory):
    rootfs = os.environ.get("PLSH_IMAGE_ROOTFS")
    try:
        with image_hosts(2, tmp_path_factory.mktemp("image_cluster"), Path(rootfs) if rootfs else None) as both:
            yield both
    except ClusterUnavailable as err:
        unavailable(f"from the image: {err}")


def _run(host, argv: list[str], log: Path, timeout_s: float = BOUND_S):
    t0 = time.monotonic()
    with open(log, "w") as out:
        res = subprocess.run(host.command(image_command(argv)), env=IMAGE_ENV | {"DS_ENV_FILE": f"{SHARED}/env"},
                             stdout=out, stderr=subprocess.STDOUT, text=True, timeout=timeout_s)
    return res.returncode, log.read_text(), time.monotonic() - t0


def _steps(out_dir: Path) -> dict[int, tuple[float, float]]:
    records = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: (r["loss"], r["grad_norm"]) for r in records if "loss" in r}


def test_hostfile_run_from_the_image_equals_one_host(image, tmp_path):
    (hosts, shared) = image
    write_deepspeed_env(shared / "env", RANK_ENV)
    write_hostfile(shared / "hostfile", hosts.names, slots=1)

    rc, one_log, _ = _run(hosts[0], ["deepspeed", "--num_gpus", "2", "--master_port", str(PORT),
                                     "launchers/pretrain.py", *LAYOUT, f"--run.out_dir={SHARED}/one"],
                          tmp_path / "one.log")
    assert rc == 0, one_log[-3000:]

    rc, log, wall = _run(hosts[0], ["deepspeed", "--hostfile", f"{SHARED}/hostfile", "--master_port", str(PORT),
                                    "launchers/pretrain.py", *LAYOUT, f"--run.out_dir={SHARED}/two"],
                         tmp_path / "two.log")
    assert rc == 0, log[-3000:]
    assert "Running on the following workers: node-0,node-1" in log
    assert "node-0: " in log and "node-1: " in log  # pdsh ran the launch on both hosts
    assert "; /opt/venv/bin/python3 -u -m deepspeed.launcher.launch" in log  # pdsh runs the image's interpreter
    for name in hosts.names:  # and so do the ranks on both hosts
        assert any(line.startswith(f"{name}: ") and "spawned with command: ['/opt/venv/bin/python3'" in line
                   for line in log.splitlines()), name
    assert any(line.startswith("node-0: ") and "world_size=2 = dp_size=1 x sp_size=2" in line
               for line in log.splitlines())
    two = _steps(shared / "two")
    assert sorted(two) == list(range(1, STEPS + 1))
    assert two == _steps(shared / "one")  # bit for bit: same ranks, same arithmetic, only the wire differs
    print(f"two hosts from the image: {wall:.0f} s")
