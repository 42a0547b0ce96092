#!/usr/bin/env bash
# Install the Debian packages behind missing system tools, or name them: the one recipe of
# tools/cluster/deps.sh and docker/image_deps.sh, which list their tools.
#
#   bash tools/cluster/apt_tools.sh LABEL [--check] TOOL=PACKAGE ...
#
# A tool is present when `command -v` finds it (/usr/sbin and /sbin included: sshd, slurmd, ...).
# --check, not root, no apt-get, or apt-get failing: names the missing packages and exits 3.
set -euo pipefail

label=$1
shift
check=0
if [[ ${1:-} == --check ]]; then
    check=1
    shift
fi
declare -A package_of=()
for pair in "$@"; do
    package_of[${pair%%=*}]=${pair#*=}
done
PATH=$PATH:/usr/sbin:/sbin

missing_packages() {
    local tool
    for tool in "${!package_of[@]}"; do
        command -v "$tool" > /dev/null 2>&1 || echo "${package_of[$tool]}"
    done | sort -u
}

mapfile -t missing < <(missing_packages)
if ((${#missing[@]} == 0)); then
    echo "$label: all present ($(printf '%s\n' "${package_of[@]}" | sort -u | paste -sd, - | sed 's/,/, /g'))"
    exit 0
fi
if ((check)); then
    echo "$label: missing Debian packages: ${missing[*]} (run: make $label, as root)" >&2
    exit 3
fi
if ((EUID != 0)); then
    echo "$label: missing Debian packages: ${missing[*]}; installing them needs root:" \
         "sudo apt-get install -y ${missing[*]}" >&2
    exit 3
fi
if ! command -v apt-get > /dev/null 2>&1; then
    echo "$label: missing packages ${missing[*]} and no apt-get here: install their equivalents" >&2
    exit 3
fi
echo "$label: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
if ! { timeout 300 apt-get update -q && timeout 900 apt-get install -y -q --no-install-recommends "${missing[@]}"; }; then
    echo "$label: apt-get could not install ${missing[*]} (no package registry reachable?)" >&2
    exit 3
fi
mapfile -t still < <(missing_packages)
if ((${#still[@]} > 0)); then
    echo "$label: still missing after apt-get: ${still[*]}" >&2
    exit 3
fi
echo "$label: installed ${missing[*]}"
