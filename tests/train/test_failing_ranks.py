"""A failing rank ends the whole job, non-zero, with its own error in front of the user.

Slow tests run the real deepspeed launcher with 2 CPU ranks (SP = 2, so the
halo send/recv is in the path) and inject a fault into rank 1 after step 2
(``PLSH_FAULT``, see plsh_dist/faults.py). Each launch has a wall-clock
bound (``launcher_runs.run``): past it the test kills the job and fails.
The fast tests check failure.py's reports directly.
"""

from __future__ import annotations

import json

import psutil
import pytest
import torch.distributed as dist

from plsh_dist.train.failure import EXIT_OWN_ERROR, EXIT_PEER_FAILED, is_peer_failure, report_failure
from tests.train.conftest import base_overrides
from tests.train.launcher_runs import deepspeed_cmd, empty_config, launcher_env, logged_losses, run

# deepspeed start-up (~25 s on 2 idle cores) + 2 tiny steps; generous for busy CI cores.
BOUND_S = 240
# Hang case: [parallel].timeout_s for the surviving rank, then the launcher's cleanup.
HANG_TIMEOUT_S = 15
HANG_BOUND_S = 240


def _launch(tiny_data, tmp_path, fault: str, *extra: str):
    out = tmp_path / "run"
    overrides = base_overrides(tiny_data, out, "--parallel.sp_size=2", "--attention.bias=plsh",
                               "--attention.num_samples=2", "--run.max_steps=4", *extra)
    bound = HANG_BOUND_S if fault.startswith("hang") else BOUND_S
    res = run(deepspeed_cmd(2, empty_config(tmp_path), overrides), launcher_env(PLSH_FAULT=fault), tmp_path,
              fault.replace(":", "_"), timeout_s=bound)
    return res, out


def _no_rank_left(out) -> None:
    """No training process of this run survives the launcher (a hung rank must be killed)."""
    alive = []
    for p in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(p.info["cmdline"] or [])
        if "pretrain.py" in cmdline and f"--run.out_dir={out}" in cmdline:
            alive.append(p.pid)
    assert not alive, f"ranks still running after the launcher exited: {alive}"


@pytest.mark.slow
def test_raising_rank_ends_the_job_with_its_error(tiny_data, tmp_path):
    res, out = _launch(tiny_data, tmp_path, "raise:1:2")
    assert res.returncode != 0
    assert "rank 1 failed: RuntimeError: injected fault on rank 1 at step 2" in res.stderr
    report = (out / "failures" / "rank_1.txt").read_text()
    assert report.startswith("rank 1 failed: RuntimeError: injected fault") and "Traceback" in report
    assert "faults.py" in report  # the traceback points at where the error was raised
    assert not (out / "failures" / "rank_0.txt").exists()  # rank 0 did nothing wrong
    assert logged_losses(out)[:2] and len(logged_losses(out)) == 2  # it trained up to the fault
    _no_rank_left(out)


@pytest.mark.slow
def test_killed_rank_ends_the_job(tiny_data, tmp_path):
    res, out = _launch(tiny_data, tmp_path, "kill:1:2")
    assert res.returncode != 0
    assert "rank 1 failed" not in res.stderr  # SIGKILL leaves no report of its own
    assert not (out / "failures").exists() or not list((out / "failures").iterdir())
    # Rank 0's long collective traceback is replaced by one line (if it got to print
    # before the launcher stopped it).
    assert "Traceback" not in res.stderr
    _no_rank_left(out)


@pytest.mark.slow
def test_hung_rank_times_out_and_is_killed(tiny_data, tmp_path):
    res, out = _launch(tiny_data, tmp_path, "hang:1:2", f"--parallel.timeout_s={HANG_TIMEOUT_S}")
    assert res.returncode != 0
    assert "rank 0: stopping, a peer rank failed or timed out" in res.stderr
    assert f"Timed out waiting {HANG_TIMEOUT_S * 1000}ms" in res.stderr  # the configured timeout, not torch's 30 min
    assert "Traceback" not in res.stderr
    _no_rank_left(out)  # the launcher killed the hung rank once rank 0 gave up


# --- failure.py on its own (fast) -------------------------------------------------

GLOO_RESET = ("[third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:15251: "
              "Connection reset by peer. This is typically caused by a remote worker hanging")
GLOO_TIMEOUT = "[third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:129] Timed out waiting 15000ms for send"


@pytest.mark.parametrize("exc, peer", [
    (RuntimeError(GLOO_RESET), True),
    (RuntimeError(GLOO_TIMEOUT), True),
    (dist.DistBackendError("NCCL communicator was aborted on rank 0"), True),
    (RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x3 and 5x6)"), False),
    (ValueError("timed out is in this message but a ValueError is never a collective failure"), False),
    (FloatingPointError("loss is nan at step 3"), False),
])
def test_peer_failures_are_told_apart_from_own_errors(exc, peer):
    assert is_peer_failure(exc) is peer


def test_peer_failure_found_through_the_exception_chain():
    try:
        try:
            raise RuntimeError(GLOO_RESET)
        except RuntimeError as inner:
            raise KeyError("wrapped by a library") from inner
    except KeyError as outer:
        assert is_peer_failure(outer)


def test_own_error_is_printed_written_and_recorded_for_torchrun(tmp_path, capsys, monkeypatch):
    error_file = tmp_path / "torchelastic" / "error.json"
    error_file.parent.mkdir()  # torchrun makes the directory, the rank writes the file
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))
    try:
        raise RuntimeError("bad batch on purpose")
    except RuntimeError as exc:
        code = report_failure(exc, 3, tmp_path / "out")
    assert code == EXIT_OWN_ERROR
    err = capsys.readouterr().err
    assert "rank 3 failed: RuntimeError: bad batch on purpose" in err and "Traceback" in err
    written = (tmp_path / "out" / "failures" / "rank_3.txt").read_text()
    assert written.startswith("rank 3 failed: RuntimeError: bad batch on purpose")
    assert "bad batch on purpose" in json.loads(error_file.read_text())["message"]["message"]


def test_peer_failure_prints_one_line_naming_the_report(tmp_path, capsys):
    out = tmp_path / "out"
    try:
        raise ValueError("the root cause")
    except ValueError as exc:
        report_failure(exc, 1, out)
    capsys.readouterr()
    code = report_failure(RuntimeError(GLOO_RESET), 0, out)
    assert code == EXIT_PEER_FAILED
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("rank 0: stopping, a peer rank failed or timed out")
    assert str(out / "failures" / "rank_1.txt") in err
    assert not (out / "failures" / "rank_0.txt").exists()


@pytest.mark.slow
def test_torchrun_names_the_failing_rank_as_root_cause(tiny_data, tmp_path):
    """Under torchrun the failing rank records its exception (TORCHELASTIC_ERROR_FILE), so
    torchrun's summary shows the injected error rather than a bare exit code."""
    from tests.train.launcher_runs import torchrun_cmd

    out = tmp_path / "run"
    overrides = base_overrides(tiny_data, out, "--parallel.sp_size=2", "--run.max_steps=4")
    res = run(torchrun_cmd(2, empty_config(tmp_path), overrides), launcher_env(PLSH_FAULT="raise:1:2"), tmp_path,
              "torchrun_raise", timeout_s=BOUND_S)
    assert res.returncode != 0
    summary = res.stderr[res.stderr.index("Root Cause"):]
    assert "rank      : 1" in summary and "injected fault on rank 1 at step 2" in summary
    assert (out / "failures" / "rank_1.txt").is_file()
    _no_rank_left(out)


@pytest.mark.parametrize("body, code", [("raise ZeroDivisionError('on purpose')", EXIT_OWN_ERROR),
                                        ("raise KeyboardInterrupt", 130),
                                        ("return 0", 0)])
def test_run_reporting_failures_exit_codes(tmp_path, body, code):
    """The wrapper ends the process itself (os._exit), so run it in a child process."""
    import subprocess
    import sys

    from tests.train.launcher_runs import ROOT, launcher_env

    script = ("import sys\nfrom plsh_dist.train.failure import run_reporting_failures\n"
              f"def fn():\n    {body}\n"
              f"sys.exit(run_reporting_failures(fn, rank=2, out_dir={str(tmp_path)!r}))\n")
    res = subprocess.run([sys.executable, "-c", script], env=launcher_env(), cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == code, res.stderr
    written = tmp_path / "failures" / "rank_2.txt"
    assert written.exists() == (code == EXIT_OWN_ERROR)  # only a rank's own error is written up
    if code == EXIT_OWN_ERROR:
        assert "rank 2 failed: ZeroDivisionError: on purpose" in res.stderr
        assert "run_reporting_failures" not in written.read_text()  # the traceback starts at the user's code
