#!/usr/bin/env bash
# The system tools `make image-check` needs to build and run the CPU image without a Docker daemon or a
# registry: buildah (build, run), runc (the OCI runtime: crun fails on hybrid cgroups), debootstrap (the
# Debian base from Debian's packages), iproute2 (a network namespace with only its loopback up).
# Installs the missing Debian packages with apt-get when run as root; otherwise, or when apt-get fails,
# it names what is missing and exits 3.
#
#   bash docker/image_deps.sh           # install what is missing (root), then check
#   bash docker/image_deps.sh --check   # only check: exit 0 = everything there, 3 = something missing
set -euo pipefail

declare -A package_of=(
    [buildah]=buildah [runc]=runc [debootstrap]=debootstrap [ip]=iproute2 [unshare]=util-linux
)
PATH=$PATH:/usr/sbin:/sbin

missing_packages() {
    local tool
    for tool in "${!package_of[@]}"; do
        command -v "$tool" > /dev/null 2>&1 || echo "${package_of[$tool]}"
    done | sort -u
}

mapfile -t missing < <(missing_packages)
if ((${#missing[@]} == 0)); then
    echo "image-deps: all present (buildah, runc, debootstrap, iproute2, util-linux)"
    exit 0
fi
if [[ ${1:-} == --check ]]; then
    echo "image-deps: missing Debian packages: ${missing[*]} (run: make image-deps, as root)" >&2
    exit 3
fi
if ((EUID != 0)); then
    echo "image-deps: missing Debian packages: ${missing[*]}; installing them needs root:" \
         "sudo apt-get install -y ${missing[*]}" >&2
    exit 3
fi
if ! command -v apt-get > /dev/null 2>&1; then
    echo "image-deps: missing packages ${missing[*]} and no apt-get here: install their equivalents" >&2
    exit 3
fi
echo "image-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
if ! { timeout 300 apt-get update -q && timeout 900 apt-get install -y -q --no-install-recommends "${missing[@]}"; }; then
    echo "image-deps: apt-get could not install ${missing[*]} (no package registry reachable?)" >&2
    exit 3
fi
mapfile -t still < <(missing_packages)
if ((${#still[@]} > 0)); then
    echo "image-deps: still missing after apt-get: ${still[*]}" >&2
    exit 3
fi
echo "image-deps: installed ${missing[*]}"
