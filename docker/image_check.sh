#!/usr/bin/env bash
# `make image-check`: build the CPU image (docker/Dockerfile --target cpu) on this machine with no Docker daemon
# and no registry, run the training, a resume, an evaluation and from_pretrained in it (tests/image/), check its
# HEALTHCHECK and entry command; lint the Dockerfile and build the GPU target up to its first CUDA step.
#
#   bash docker/image_check.sh               # root; docker/image_deps.sh installs buildah, runc, debootstrap
#   bash docker/image_check.sh --rootfs-only # build the CPU image and export its root filesystem only
#                                            # (what `make test-cluster`'s two hosts chroot into)
#
# How: a Debian 12 base from Debian's packages (docker/base_bookworm.sh: debootstrap, buildah commit), then
# `buildah bud --format docker --runtime runc` (--format docker: the OCI format drops SHELL and with it
# pipefail). PyTorch's CPU wheel comes from the wheel pip finds here (.venv's pip: its index or find-links),
# mounted into the build (TORCH_FIND_LINKS), and pip in the build reads this machine's CA bundle (the build
# secret pip_cert: $PIP_CERT, else /etc/ssl/certs/ca-certificates.crt). The checks run with `buildah run` in a
# network namespace with only its loopback up (no network; buildah's --network none leaves even the
# loopback down).
#
# Bounds and clean-up: every phase runs under a timeout; the build refuses to start with less than
# IMAGE_MIN_FREE_GB (default 12) free; buildah's storage lives in IMAGE_DIR (default build/image) and is deleted
# on exit, however the script ends. Kept: IMAGE_DIR/rootfs (the exported image, ~2.3 GB, for
# `make test-cluster`; `make clean-image` deletes it) and IMAGE_DIR/summary.txt (times and size).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
mode=${1:-all}
if [[ $mode != all && $mode != --rootfs-only ]]; then
    echo "usage: $0 [--rootfs-only]" >&2
    exit 2
fi
dir=$(mkdir -p "${IMAGE_DIR:-build/image}" && cd "${IMAGE_DIR:-build/image}" && pwd)
python=${PYTHON:-$root/.venv/bin/python}
image=localhost/plsh_dist:cpu
base=localhost/plsh-base:bookworm

if ((EUID != 0)); then
    echo "image-check: needs root (buildah's storage, runc, network namespaces)" >&2
    exit 3
fi
bash docker/image_deps.sh --check
if [[ $dir == *" "* ]]; then
    echo "image-check: IMAGE_DIR must not contain spaces: $dir" >&2
    exit 2
fi
free_gb=$(df --output=avail -BG "$dir" | tail -1 | tr -dc 0-9)
if ((free_gb < ${IMAGE_MIN_FREE_GB:-12})); then
    echo "image-check: ${free_gb} GB free under $dir, the build needs ${IMAGE_MIN_FREE_GB:-12} GB" >&2
    exit 3
fi

buildah=(buildah --root "$dir/storage" --runroot "$dir/runroot" --storage-driver overlay)
export BUILDAH="${buildah[*]}" dir python image base
netns_pid=
cleanup() {
    local status=$?
    if [[ -n $netns_pid ]]; then kill "$netns_pid" 2> /dev/null || true; fi
    if [[ -d $dir/storage ]]; then
        timeout 300 "${buildah[@]}" rm --all > /dev/null 2>&1 || true
        timeout 300 "${buildah[@]}" rmi --all --force > /dev/null 2>&1 || true
        # overlay layers may still be mounted: unmount everything under the storage before deleting it
        grep -o " $dir/[^ ]*" /proc/mounts | sort -r | xargs -r -n1 umount -l 2> /dev/null || true
        rm -rf "$dir/storage" "$dir/runroot"
    fi
    rm -rf "$dir/wheels" "$dir/base-rootfs"
    exit "$status"
}
trap cleanup EXIT
trap 'exit 143' TERM
trap 'exit 130' INT

: > "$dir/summary.txt"
phase_start=$SECONDS
phase() {  # $1: name, $2: timeout in s, then the command
    local name=$1 limit=$2 t0=$SECONDS
    shift 2
    echo "== image-check: $name"
    if ! timeout "$limit" bash -c '"$@"' "$name" "$@"; then
        echo "image-check: $name failed or ran past ${limit} s" >&2
        return 1
    fi
    echo "$name: $((SECONDS - t0)) s" | tee -a "$dir/summary.txt"
}

torch_wheel() {
    mkdir -p "$dir/wheels"
    "$python" -m pip download --quiet --no-deps --only-binary=:all: "torch==2.13.0+cpu" -d "$dir/wheels"
}
bud() {  # the stage, the tag, then extra buildah bud flags
    local target=$1 tag=$2 buildah
    read -r -a buildah <<< "$BUILDAH"
    shift 2
    local cert=${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt} secret=()
    if [[ -s $cert ]]; then secret=(--secret "id=pip_cert,src=$cert"); fi
    "${buildah[@]}" bud --format docker --runtime /usr/sbin/runc --target "$target" "${secret[@]}" \
        -t "$tag" -f docker/Dockerfile "$@" .
}
cpu_image() {
    local torch_args=()
    if [[ -n $(ls "$dir/wheels" 2> /dev/null) ]]; then
        torch_args=(--build-arg TORCH_INDEX_URL= --build-arg TORCH_FIND_LINKS=/tmp/wheels
                    --volume "$dir/wheels:/tmp/wheels:ro")
    fi
    bud cpu "$image" --build-arg CPU_BASE_IMAGE="$base" "${torch_args[@]}"
}
export_rootfs() {
    local ctr mnt buildah
    read -r -a buildah <<< "$BUILDAH"
    rm -rf "$dir/rootfs" "$dir/rootfs.id"
    ctr=$("${buildah[@]}" from "$image")
    mnt=$("${buildah[@]}" mount "$ctr")
    mkdir -p "$dir/rootfs"
    cp -a "$mnt/." "$dir/rootfs/"
    chmod 755 "$dir/rootfs"
    "${buildah[@]}" umount "$ctr" > /dev/null
    "${buildah[@]}" rm "$ctr" > /dev/null
    "${buildah[@]}" images --noheading --format '{{.ID}}' "$image" > "$dir/rootfs.id"
}
checks() {  # $1: the pid whose network namespace the containers join
    PLSH_IMAGE=$image PLSH_BUILDAH=$BUILDAH PLSH_NETNS=/proc/$1/ns/net "$python" -m pytest -q -m image tests/image
}
export -f torch_wheel bud cpu_image export_rootfs checks

if [[ $mode == all ]]; then
    phase "lint (hadolint, shellcheck)" 120 bash docker/lint.sh
fi
if ! torch_wheel; then
    echo "image-check: no torch==2.13.0+cpu wheel found by pip here; the build tries PyTorch's CPU index" >&2
    rm -rf "$dir/wheels"
fi
phase "base (debootstrap bookworm)" 900 bash docker/base_bookworm.sh "$base" "$dir"
if [[ $mode == all ]]; then
    phase "gpu target up to its first CUDA step (--target gpu-base)" 900 \
        bud gpu-base localhost/plsh_dist:gpu-base --build-arg BASE_IMAGE="$base"
fi
phase "cpu image build" 2400 cpu_image
size=$("${buildah[@]}" images --noheading --format '{{.Size}}' "$image")
echo "cpu image size: $size" | tee -a "$dir/summary.txt"
phase "rootfs export" 600 export_rootfs
if [[ $mode == all ]]; then
    unshare --net sh -c 'ip link set lo up && exec sleep 3600' &  # no network, but a loopback
    netns_pid=$!
    sleep 1
    phase "checks in the image (tests/image)" 1800 checks "$netns_pid"
fi
echo "image-check${mode/all/}: passed in $((SECONDS - phase_start)) s" | tee -a "$dir/summary.txt"
