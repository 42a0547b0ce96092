#!/usr/bin/env bash
# The system tools the two-host cluster needs (`make cluster-deps`): network/UTS/mount/PID namespaces
# (util-linux unshare + nsenter, iproute2), sshd + pdsh for DeepSpeed's hostfile runner, munge + Slurm
# 22.05 (Debian bookworm's) for sbatch. Installs the missing Debian packages with apt-get when run as
# root; otherwise, or when apt-get fails, it names what is missing and exits 3.
#
#   bash tools/cluster/deps.sh           # install what is missing (root), then check
#   bash tools/cluster/deps.sh --check   # only check: exit 0 = everything there, 3 = something missing
#
# apt's policy on Debian images (policy-rc.d) keeps the services from starting system-wide; the
# cluster starts its own daemons inside each host's namespaces and nowhere else.
set -euo pipefail

# executable -> the Debian package that provides it; the recipe: tools/cluster/apt_tools.sh
exec bash "$(dirname "$0")/apt_tools.sh" cluster-deps "$@" \
    unshare=util-linux nsenter=util-linux ip=iproute2 sshd=openssh-server ssh=openssh-client \
    ssh-keygen=openssh-client pdsh=pdsh munged=munge slurmctld=slurmctld slurmd=slurmd sbatch=slurm-client \
    scontrol=slurm-client scancel=slurm-client squeue=slurm-client srun=slurm-client sacct=slurm-client
