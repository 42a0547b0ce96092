"""A job that ends non-zero is named in one line: each rank's return code and signal, and the kernel's
out-of-memory kills during the job (``tools/cluster/exit_reason.py``, what the rehearsal reports)."""

from __future__ import annotations

from tools.cluster.exit_reason import exit_reason

LAUNCHER = ("node-0: [2026-12-02 10:43:47,975] [ERROR] [launch.py:259:sigkill_handler] ['python', '-u', "
            "'launchers/pretrain.py'] exits with return code = -9\n"
            "node-1: [2026-12-02 10:43:51,792] [ERROR] [launch.py:259:sigkill_handler] ['python', '-u', "
            "'launchers/pretrain.py'] exits with return code = 3\n")
OOM = ("Out of memory: Killed process 9028 (python) total-vm:11411336kB, anon-rss:9682264kB, file-rss:64kB, "
       "shmem-rss:0kB, UID:0 pgtables:19856kB oom_score_adj:0")


def test_an_out_of_memory_kill_during_the_job_is_named():
    line = exit_reason(247, LAUNCHER, oom_before=[], oom_after=[OOM])
    assert line == ("exit status 247 (SIGKILL); node-0's rank returned -9 (SIGKILL); node-1's rank returned 3; "
                    "the kernel's out-of-memory killer killed pid 9028 (python) at 9.23 GiB resident")


def test_kills_before_the_job_do_not_count():
    line = exit_reason(247, LAUNCHER, oom_before=[OOM], oom_after=[OOM])
    assert "out-of-memory killer killed" not in line
    assert line.endswith("SIGKILL with no out-of-memory kill in the kernel's log (or the log is unreadable)")


def test_a_plain_failure_has_no_signal():
    assert exit_reason(1, "node-1: ... exits with return code = 1\n", [], []) == \
        "exit status 1; node-1's rank returned 1"
