"""Start ``launchers/pretrain.py`` through the real launchers (deepspeed, torchrun) in tests.

Every run gets its own free port, one thread per rank (2 busy cores), offline
Hugging Face, and a wall-clock bound: a launcher still running at the bound is
killed with its whole process group and the test fails, so a hang can never
block CI.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from plsh_dist.distributed.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
PRETRAIN = ROOT / "launchers" / "pretrain.py"
_BIN = Path(sys.executable).parent


def launcher_env(**extra: str) -> dict[str, str]:
    """The environment every rank needs on a CPU test machine."""
    env = dict(os.environ, DS_ACCELERATOR="cpu", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               OMP_NUM_THREADS="1", PLSH_PROGRESS="0",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    env.pop("PLSH_FAULT", None)
    env.update(extra)
    return env


def empty_config(directory: Path) -> Path:
    """A config file with no tables: the tests pass everything as overrides."""
    path = Path(directory) / "run.toml"
    path.write_text("# all settings come from --section.key=value overrides\n")
    return path


def deepspeed_cmd(nproc: int, config: Path, overrides: list[str], *, hostfile: Path | None = None,
                  port: int | None = None) -> list[str]:
    """``nproc`` local ranks, or with ``hostfile`` its hosts' slots through pdsh/ssh (nproc unused)."""
    script = _BIN / "deepspeed"
    runner = [str(script)] if script.is_file() else [sys.executable, "-m", "deepspeed.launcher.runner"]
    where = ["--hostfile", str(hostfile)] if hostfile is not None else ["--num_gpus", str(nproc)]
    return [*runner, *where, "--master_port", str(port or free_port()), str(PRETRAIN),
            "--config", str(config), *overrides]


def torchrun_cmd(nproc: int, config: Path, overrides: list[str], *, nnodes: int = 1, node_rank: int = 0,
                 port: int | None = None) -> list[str]:
    script = _BIN / "torchrun"
    runner = [str(script)] if script.is_file() else [sys.executable, "-m", "torch.distributed.run"]
    return [*runner, "--nnodes", str(nnodes), "--node_rank", str(node_rank), "--nproc_per_node", str(nproc),
            "--master_addr", "127.0.0.1", "--master_port", str(port or free_port()), str(PRETRAIN),
            "--config", str(config), *overrides]


@dataclass
class Finished:
    returncode: int
    stdout: str
    stderr: str
    wall_s: float


class Launch:
    """A launcher started in its own process group (so a timeout can kill every rank)."""

    def __init__(self, cmd: list[str], env: dict[str, str], log_dir: Path, name: str):
        self.log_dir, self.name = Path(log_dir), name
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._out = (self.log_dir / f"{name}.out").open("w")
        self._err = (self.log_dir / f"{name}.err").open("w")
        self.t0 = time.time()
        self.proc = subprocess.Popen(cmd, env=env, cwd=str(ROOT), stdout=self._out, stderr=self._err,
                                     start_new_session=True)

    def wait(self, timeout_s: float) -> Finished:
        try:
            rc = self.proc.wait(timeout=max(1.0, timeout_s - (time.time() - self.t0)))
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            raise AssertionError(f"{self.name}: launcher still running after {timeout_s:.0f} s (killed); "
                                 f"stderr tail:\n{self._tail()}") from None
        finally:
            self._out.close()
            self._err.close()
        return Finished(rc, (self.log_dir / f"{self.name}.out").read_text(),
                        (self.log_dir / f"{self.name}.err").read_text(), time.time() - self.t0)

    def _tail(self) -> str:
        self._err.flush()
        return (self.log_dir / f"{self.name}.err").read_text()[-3000:]


def run(cmd: list[str], env: dict[str, str], log_dir: Path, name: str, timeout_s: float) -> Finished:
    return Launch(cmd, env, log_dir, name).wait(timeout_s)


def logged_losses(out_dir: Path) -> list[float]:
    """Per-step training losses that rank 0 wrote to metrics.jsonl."""
    records = [json.loads(line) for line in (Path(out_dir) / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in records if "loss" in r]
