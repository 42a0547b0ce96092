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

# executable -> the Debian package that provides it; the recipe: tools/cluster/apt_tools.sh
exec bash "$(dirname "$0")/../tools/cluster/apt_tools.sh" image-deps "$@" \
    buildah=buildah runc=runc debootstrap=debootstrap ip=iproute2 unshare=util-linux
