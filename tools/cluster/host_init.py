"""PID 1 of one namespace host: names it, gives it its own /run and files, then reaps orphans.

Started by ``tools.cluster.hosts`` inside fresh network, UTS, mount and PID namespaces
(``unshare --net --uts --mount --pid --mount-proc``), so everything here stays
in that host: the hostname, a private tmpfs on /run (each host's sshd, munge
and slurmd sockets and pid files), and bind mounts of per-host files over
system paths (``--bind SRC:DST``, e.g. the cluster's /etc/hosts). Mounts in a
private mount namespace vanish with it; the machine's files are never changed.

When this process dies (take-down: SIGKILL from outside; a crash of whoever
started it: the kill-child / parent-death chain in hosts.py), the kernel kills
every process of its PID namespace, and the network namespace, with the
host's end of the veth pair, goes with the last of them.

    host_init.py --hostname node-0 --bind /tmp/c/hosts:/etc/hosts ...
Prints ``ready`` once set up; exits 1 with the failing step otherwise.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, capture_output=True, text=True, timeout=30)


def set_up(hostname: str, binds: list[str], dirs: list[str]) -> None:
    socket.sethostname(hostname)
    # make no mount here visible outside (unshare already makes the tree private; this is explicit)
    _mount("--make-rprivate", "/")
    _mount("-t", "tmpfs", "-o", "mode=755", "tmpfs", "/run")
    for d in dirs:
        os.makedirs(d, exist_ok=True)
    for pair in binds:
        src, dst = pair.split(":", 1)
        _mount("--bind", src, dst)


def reap_forever() -> None:
    """Orphans of the host (daemons that forked, ranks whose launcher died) become our children."""
    while True:
        try:
            os.wait()
        except ChildProcessError:
            time.sleep(0.5)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hostname", required=True)
    parser.add_argument("--bind", action="append", default=[], metavar="SRC:DST")
    parser.add_argument("--dir", action="append", default=[], help="directory to create after /run is mounted")
    args = parser.parse_args()
    try:
        set_up(args.hostname, args.bind, args.dir)
    except (OSError, subprocess.SubprocessError) as err:
        detail = getattr(err, "stderr", "") or ""
        print(f"host {args.hostname}: set-up failed: {err} {detail}".strip(), flush=True)
        return 1
    print("ready", flush=True)
    sys.stdout.close()
    reap_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
