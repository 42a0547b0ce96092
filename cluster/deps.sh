#!/usr/bin/env bash
# The system tools the two-host cluster needs (`make cluster-deps`): network/UTS/mount/PID namespaces
# (util-linux unshare + nsenter, iproute2), sshd + pdsh for DeepSpeed's hostfile runner, munge + Slurm
# 22.05 (Debian bookworm's) for sbatch. Installs the missing Debian packages with apt-get when run as
# root; otherwise, or when apt-get fails, it names what is missing and exits 3.
#
#   bash cluster/deps.sh           # install what is missing (root), then check
#   bash cluster/deps.sh --check   # only check: exit 0 = everything there, 3 = something missing
#
# apt's policy on Debian images (policy-rc.d) keeps the services from starting system-wide; the
# cluster starts its own daemons inside each host's namespaces and nowhere else.
set -euo pipefail

# executable -> the Debian package that provides it
declare -A package_of=(
    [unshare]=util-linux [nsenter]=util-linux [ip]=iproute2
    [sshd]=openssh-server [ssh]=openssh-client [ssh-keygen]=openssh-client [pdsh]=pdsh
    [munged]=munge [slurmctld]=slurmctld [slurmd]=slurmd
    [sbatch]=slurm-client [scontrol]=slurm-client [scancel]=slurm-client [squeue]=slurm-client
    [srun]=slurm-client [sacct]=slurm-client
)
# sshd, munged, slurmctld and slurmd are in /usr/sbin, not on every user's PATH
PATH=$PATH:/usr/sbin:/sbin

missing_packages() {
    local tool
    for tool in "${!package_of[@]}"; do
        command -v "$tool" > /dev/null 2>&1 || echo "${package_of[$tool]}"
    done | sort -u
}

mapfile -t missing < <(missing_packages)
if ((${#missing[@]} == 0)); then
    echo "cluster-deps: all present (util-linux, iproute2, openssh-server, pdsh, munge, slurmctld, slurmd, slurm-client)"
    exit 0
fi
if [[ ${1:-} == --check ]]; then
    echo "cluster-deps: missing Debian packages: ${missing[*]} (run: make cluster-deps, as root)" >&2
    exit 3
fi
if ((EUID != 0)); then
    echo "cluster-deps: missing Debian packages: ${missing[*]}; installing them needs root:" \
         "sudo apt-get install -y ${missing[*]}" >&2
    exit 3
fi
if ! command -v apt-get > /dev/null 2>&1; then
    echo "cluster-deps: missing packages ${missing[*]} and no apt-get here: install their equivalents" >&2
    exit 3
fi
echo "cluster-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
if ! { timeout 300 apt-get update -q && timeout 900 apt-get install -y -q --no-install-recommends "${missing[@]}"; }; then
    echo "cluster-deps: apt-get could not install ${missing[*]} (no package registry reachable?)" >&2
    exit 3
fi
mapfile -t still < <(missing_packages)
if ((${#still[@]} > 0)); then
    echo "cluster-deps: still missing after apt-get: ${still[*]}" >&2
    exit 3
fi
echo "cluster-deps: installed ${missing[*]}"
