"""Slurm on the namespace hosts: munged on every host, slurmctld on node-0, slurmd on every host.

The configuration is written under ``state_dir/slurm`` and each host mounts
it over /etc/slurm, so ``sbatch``, ``scontrol`` and the daemons inside the
hosts read it and the machine's /etc/slurm is never touched. Every daemon
runs inside a host (its /run holds the munge socket, the pid files and
slurmd's spool) and dies with it. State, logs and the munge key live under
``state_dir``.

The choices that let Slurm 22.05 run inside namespaces without systemd or
cgroups: ``proctrack/linuxproc`` (process tree by parent pid),
``task/none``, no accounting; the nodes declare the machine's CPUs and
``CR_Core`` lets both hosts' steps share them; ``ReturnToService=2`` so a
node that restarts comes back. Root is SlurmUser (as the fixture runs as
root); jobs run as the submitting user.
"""

from __future__ import annotations

import os
import secrets
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from tools.cluster.hosts import ClusterUnavailable, Host, Hosts, missing_tools

__all__ = ["SLURM_TOOLS", "slurm_hosts", "slurm_unavailable", "wait_for_nodes"]

SLURM_TOOLS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "scancel", "squeue", "srun", "sacct")
CONFIG_MOUNT = "/etc/slurm"
MUNGE_SOCKET = "/run/munge/munge.socket.2"  # Slurm's auth/munge default; /run is each host's own

SLURM_CONF = """\
ClusterName=plsh
SlurmctldHost={controller}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation={state}/slurmctld
SlurmdSpoolDir=/run/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile={state}/slurmctld.log
SlurmdLogFile={state}/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ReturnToService=2
JobRequeue=1
KillWait=30
SlurmctldTimeout=30
SlurmdTimeout=30
MessageTimeout=10
InactiveLimit=0
MinJobAge=600
MailProg=/bin/true
NodeName={nodes} CPUs={cpus} State=UNKNOWN
PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
"""


def slurm_unavailable() -> str | None:
    """What is missing for Slurm on the hosts (None: nothing)."""
    missing = missing_tools(SLURM_TOOLS)
    if missing:
        return f"missing {', '.join(missing)} (munge, slurmctld, slurmd, slurm-client: make cluster-deps)"
    return None


def _write_config(state: Path, names: list[str]) -> Path:
    conf_dir = state / "slurm"
    conf_dir.mkdir(parents=True, exist_ok=True)
    (state / "slurmctld").mkdir(exist_ok=True)
    (conf_dir / "slurm.conf").write_text(SLURM_CONF.format(
        controller=names[0], state=state, nodes=",".join(names), cpus=os.cpu_count()))
    munge = state / "munge"
    munge.mkdir(mode=0o700, exist_ok=True)
    key = munge / "munge.key"
    key.write_bytes(secrets.token_bytes(128))  # this cluster's own key; /etc/munge is never read
    key.chmod(0o600)
    return conf_dir


def _start_munge(host: Host, state: Path) -> None:
    munge = state / "munge"
    host.run(["/usr/sbin/munged", f"--key-file={munge / 'munge.key'}", f"--socket={MUNGE_SOCKET}",
              f"--pid-file=/run/munge/munged.pid", f"--seed-file={munge / f'seed-{host.name}'}",
              f"--log-file={munge / f'munged-{host.name}.log'}"])


def wait_for_nodes(client: Host, names: list[str], timeout_s: float = 60) -> None:
    """Block until slurmctld reports every node idle (slurmd registered)."""
    deadline = time.monotonic() + timeout_s
    while True:
        res = client.run(["sinfo", "--noheader", "--Node", "--format=%N %t"], check=False, timeout_s=timeout_s)
        states = dict(line.split() for line in res.stdout.splitlines() if len(line.split()) == 2)
        if res.returncode == 0 and all(states.get(n, "").startswith("idle") for n in names):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"Slurm nodes not idle after {timeout_s:.0f} s: {states or res.stderr.strip()}")
        time.sleep(0.5)


@contextmanager
def slurm_hosts(n: int, state_dir: Path) -> Iterator[Hosts]:
    """``n`` namespace hosts running munged and slurmd, node-0 also slurmctld, every node idle."""
    reason = slurm_unavailable()
    if reason:
        raise ClusterUnavailable(reason)
    state = Path(state_dir)
    hosts = Hosts(n, state / "hosts", dirs=("/run/munge", "/run/slurmd"))
    conf_dir = _write_config(state, hosts.names)
    hosts.binds = (f"{conf_dir}:{CONFIG_MOUNT}",)
    with hosts:
        for host in hosts:
            _start_munge(host, state)
        hosts[0].run(["/usr/sbin/slurmctld"])
        for host in hosts:
            host.run(["/usr/sbin/slurmd"])
        wait_for_nodes(hosts[0], hosts.names)
        yield hosts
