"""Why a launched job ended non-zero, in one line: which rank, which signal, and whether the kernel ran out of memory.

A rank killed by SIGKILL reaches the rehearsal as DeepSpeed's launcher line
``exits with return code = -9`` and, through pdsh/ssh, as exit status 247
(ssh's 255 - 8 wraps -9 as 256 - 9). The launcher's stderr tail is then
library warnings, not the cause. The kernel's log says when its
out-of-memory killer chose the process (``Out of memory: Killed process PID
(python) ... anon-rss:NkB``); it is read before and after the job so only
the job's own kills count.
"""

from __future__ import annotations

import re
import signal
import subprocess

_RANK_EXIT = re.compile(r"^(?:(?P<host>[\w.-]+): )?.*exits with return code = (?P<code>-?\d+)", re.M)
_OOM = re.compile(r"Out of memory: Killed process (?P<pid>\d+) \((?P<name>[^)]*)\).*?anon-rss:(?P<rss>\d+)kB")


def kernel_oom_kills() -> list[str]:
    """The kernel log's out-of-memory kill lines ([] when the log cannot be read)."""
    try:
        text = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [m.group(0) for m in _OOM.finditer(text)]


def _signal_name(code: int) -> str | None:
    """The signal behind a return code: -N (Python's), 128 + N (a shell's) or 256 - N (ssh's wrap of -N)."""
    for n in (-code, code - 128, 256 - code):
        if 0 < n < 65:
            try:
                return signal.Signals(n).name
            except ValueError:
                continue
    return None


def exit_reason(returncode: int, stdout: str, oom_before: list[str], oom_after: list[str]) -> str:
    """One line: the job's status, each rank's non-zero return code with its signal, and new OOM kills."""
    parts = [f"exit status {returncode}"]
    sig = _signal_name(returncode)
    if sig:
        parts[0] += f" ({sig})"
    ranks = [(m.group("host") or "local", int(m.group("code"))) for m in _RANK_EXIT.finditer(stdout)]
    for host, code in ranks:
        if code != 0:
            name = _signal_name(code) if code < 0 else None
            parts.append(f"{host}'s rank returned {code}" + (f" ({name})" if name else ""))
    new = oom_after[len(oom_before):] if oom_after[:len(oom_before)] == oom_before else oom_after
    for line in new:
        m = _OOM.search(line)
        parts.append(f"the kernel's out-of-memory killer killed pid {m.group('pid')} ({m.group('name')}) at "
                     f"{int(m.group('rss')) / 2**20:.2f} GiB resident")
    if not new and any(code == -9 for _, code in ranks):
        parts.append("SIGKILL with no out-of-memory kill in the kernel's log (or the log is unreadable)")
    return "; ".join(parts)
