#!/usr/bin/env bash
# A Debian 12 (bookworm) base image made from Debian's own packages, for building the CPU image where no
# registry can be reached (docker/image_check.sh): `debootstrap --variant=minbase` into a directory, then
# that directory committed as an image with buildah. It stands in for `debian:bookworm-slim`; the
# Dockerfile's CPU stage installs everything else it needs (python3, a compiler, pdsh) itself.
#
#   docker/base_bookworm.sh IMAGE_NAME WORK_DIR        # root; buildah and debootstrap installed
#
# Environment: BUILDAH (the buildah command with its storage flags; default "buildah"),
# DEBIAN_MIRROR (default http://deb.debian.org/debian). The debootstrap tree is deleted once committed.
# ~2 min and ~150 MB on a 2-core machine.
set -euo pipefail

if [[ $# -ne 2 ]]; then
    echo "usage: $0 IMAGE_NAME WORK_DIR" >&2
    exit 2
fi
image=$1
work=$2
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
read -r -a buildah <<< "${BUILDAH:-buildah}"

rootfs="$work/base-rootfs"
rm -rf "$rootfs"
mkdir -p "$rootfs"
echo "base: debootstrap --variant=minbase bookworm from $mirror"
if ! debootstrap --variant=minbase bookworm "$rootfs" "$mirror" > "$work/debootstrap.log" 2>&1; then
    tail -20 "$work/debootstrap.log" >&2
    echo "base: debootstrap failed (log: $work/debootstrap.log)" >&2
    exit 1
fi
# As in Debian's official images: no package caches, and apt keeps none.
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
printf 'DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb || true"; };\n' \
    > "$rootfs/etc/apt/apt.conf.d/docker-clean"

container=$("${buildah[@]}" from scratch)
trap '"${buildah[@]}" rm "$container" > /dev/null 2>&1 || true' EXIT
mnt=$("${buildah[@]}" mount "$container")
cp -a "$rootfs/." "$mnt/"
"${buildah[@]}" umount "$container" > /dev/null
"${buildah[@]}" config --cmd bash --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    "$container"
"${buildah[@]}" commit --quiet --format docker "$container" "$image" > /dev/null
rm -rf "$rootfs"
echo "base: $image committed"
