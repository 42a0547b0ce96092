"""An unreachable rendezvous ends ``launchers/pretrain.py`` in seconds; SIGTERM and Ctrl-C end it before training.

Each launch runs in a fresh network namespace (root: ``unshare --net``), so
nothing here touches the machine's network: one whose loopback is down (what
a container started without its loopback sees: errno 101 on 127.0.0.1), or
one with only its loopback up and nothing listening there.

- loopback down, one process (plain ``python`` and the deepspeed launcher):
  exit 1 within 30 s, one line naming 127.0.0.1:PORT and "network unreachable",
  no traceback; before, the rank retried for [parallel].timeout_s (600 s);
- an unknown host: exit 1 within 30 s naming it;
- a refused port (rank 1 whose rank 0 never starts): retried for
  [parallel].rendezvous_timeout_s, then exit 1 naming the port;
- SIGTERM / Ctrl-C while a rank waits for its rendezvous, and while it waits
  inside the process-group join (C++, rank 0 of 2 whose peer never comes):
  the rank ends within seconds; before, SIGTERM was held until the first step.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.train.launcher_runs import ROOT, Launch, deepspeed_cmd, launcher_env

pytestmark = pytest.mark.slow

CONFIG = ROOT / "configs" / "debug.toml"
BOUND_S = 30  # the bound for an unreachable rendezvous, start-up included
LOOPBACK_UP = ["sh", "-c", 'ip link set lo up && exec "$0" "$@"']


@pytest.fixture(scope="module", autouse=True)
def netns():
    try:
        res = subprocess.run(["unshare", "--net", "ip", "link", "set", "lo", "up"], capture_output=True, text=True,
                             timeout=30)
    except (OSError, subprocess.TimeoutExpired) as err:
        pytest.skip(f"no network namespaces: {err}")
    if res.returncode != 0:
        pytest.skip(f"unshare --net refused (root needed): {res.stderr.strip()}")


def _pretrain(tmp_path: Path, *extra: str) -> list[str]:
    return ["python", str(ROOT / "launchers" / "pretrain.py"), "--config", str(CONFIG),
            f"--run.out_dir={tmp_path / 'out'}", *extra]


def _launch(argv: list[str], tmp_path: Path, name: str, loopback: bool, **env: str) -> Launch:
    argv = [sys.executable if a == "python" else a for a in argv]
    cmd = ["unshare", "--net", *(LOOPBACK_UP if loopback else []), *argv]
    return Launch(cmd, launcher_env(**env), tmp_path, name)


def _wait_for(predicate, what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"{what} not seen within {timeout_s:.0f} s"
        time.sleep(0.2)


def _listening(pid: int, port: int) -> bool:
    """A LISTEN socket on ``port`` in the network namespace of ``pid`` (the store's server is up)."""
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        if any(f.split()[1].endswith(f":{port:04X}") and f.split()[3] == "0A" for f in lines):
            return True
    return False


def _one_line_failure(stderr: str, *needles: str) -> None:
    assert "Traceback" not in stderr, stderr[-3000:]
    lines = [line for line in stderr.splitlines() if "failed: rendezvous" in line]
    assert len(lines) == 1, stderr[-3000:]
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_loopback_down_fails_within_30_s_naming_the_address(tmp_path):
    done = _launch(_pretrain(tmp_path), tmp_path, "python", loopback=False).wait(120)
    assert done.returncode == 1, done.stderr[-3000:]
    assert done.wall_s < BOUND_S, f"{done.wall_s:.1f} s"
    _one_line_failure(done.stderr, "rank 0 failed: rendezvous 127.0.0.1:", "network unreachable (errno 101")


def test_loopback_down_under_the_deepspeed_launcher(tmp_path):
    cmd = deepspeed_cmd(1, CONFIG, [f"--run.out_dir={tmp_path / 'out'}"], port=29500)
    done = _launch(cmd, tmp_path, "deepspeed", loopback=False).wait(120)
    assert done.returncode == 1, done.stderr[-3000:]
    assert done.wall_s < BOUND_S + 15, f"{done.wall_s:.1f} s"  # the runner's own start-up on top
    assert "rendezvous 127.0.0.1:29500" in done.stdout + done.stderr
    assert "network unreachable" in done.stdout + done.stderr


def test_an_unknown_host_fails_within_30_s(tmp_path):
    env = dict(MASTER_ADDR="no-such-host.invalid", MASTER_PORT="29500", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    done = _launch(_pretrain(tmp_path), tmp_path, "unknown", loopback=False, **env).wait(120)
    assert done.returncode == 1 and done.wall_s < BOUND_S, (done.wall_s, done.stderr[-3000:])
    _one_line_failure(done.stderr, "rendezvous no-such-host.invalid:29500", "unknown host")


def test_a_refused_port_is_retried_then_fails_naming_it(tmp_path):
    env = dict(MASTER_ADDR="127.0.0.1", MASTER_PORT="29500", RANK="1", WORLD_SIZE="2", LOCAL_RANK="0")
    done = _launch(_pretrain(tmp_path, "--parallel.rendezvous_timeout_s=5"), tmp_path, "refused", loopback=True,
                   **env).wait(120)
    assert done.returncode == 1 and done.wall_s < BOUND_S, (done.wall_s, done.stderr[-3000:])
    _one_line_failure(done.stderr, "rank 1 failed: rendezvous 127.0.0.1:29500", "connection refused",
                      "rendezvous_timeout_s = 5 s")


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, -signal.SIGTERM), (signal.SIGINT, 130)],
                         ids=["SIGTERM", "SIGINT"])
def test_a_signal_ends_a_rank_waiting_for_its_rendezvous(tmp_path, sig, code):
    env = dict(MASTER_ADDR="127.0.0.1", MASTER_PORT="29500", RANK="1", WORLD_SIZE="2", LOCAL_RANK="0")
    launch = _launch(_pretrain(tmp_path, "--parallel.rendezvous_timeout_s=600"), tmp_path, "waiting", loopback=True,
                     **env)
    err = tmp_path / "waiting.err"
    _wait_for(lambda: "retrying for up to 600 s" in err.read_text(), "the rank's waiting line")
    t0 = time.monotonic()
    launch.proc.send_signal(sig)
    done = launch.wait(120)
    assert time.monotonic() - t0 < 10
    assert done.returncode == code, done.stderr[-3000:]
    if sig == signal.SIGINT:
        assert "rank 1: interrupted" in done.stderr


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_ends_a_rank_inside_the_process_group_join(tmp_path, sig):
    """Rank 0 of 2 serves the store and waits in C++ for a rank 1 that never comes (600 s timeout)."""
    env = dict(MASTER_ADDR="127.0.0.1", MASTER_PORT="29500", RANK="0", WORLD_SIZE="2", LOCAL_RANK="0")
    launch = _launch(_pretrain(tmp_path), tmp_path, "joining", loopback=True, **env)
    _wait_for(lambda: _listening(launch.proc.pid, 29500), "the store's listening socket")
    time.sleep(1)  # inside the join: the store is up, the peer never connects
    t0 = time.monotonic()
    launch.proc.send_signal(sig)
    done = launch.wait(120)
    assert time.monotonic() - t0 < 10
    assert done.returncode == -sig, done.stderr[-3000:]
