#!/usr/bin/env bash
# Keep only the pins that protect the base image's compiled stack in a pip constraints file.
#
#   docker/relax_pip_constraints.sh CONSTRAINTS_FILE KEEP_PACKAGE...
#   docker/relax_pip_constraints.sh /etc/pip/constraint.txt torch numpy triton
#
# NGC PyTorch images pin every Python package they ship in a constraints file that pip always
# applies (PIP_CONSTRAINT). That is what stops a `pip install` from replacing the image's own torch
# build, but it also refuses the newer transformers / datasets / flash-attn / deepspeed (and their
# dependencies) this project needs. This script rewrites the file so that only the named packages
# (normalised as pip does: case-insensitive, "-", "_" and "." equal) stay pinned; every other pin is
# dropped and listed on stderr. "torch" must be among the kept names: that pin is the point.
# A missing constraints file (a base image without one) is not an error: there is nothing to relax.
set -euo pipefail

if [[ $# -lt 2 ]]; then
    echo "usage: $0 CONSTRAINTS_FILE KEEP_PACKAGE... (e.g. $0 /etc/pip/constraint.txt torch numpy)" >&2
    exit 2
fi
constraints=$1
shift

keep=" "
for name in "$@"; do
    norm=$(printf '%s' "$name" | tr '[:upper:]' '[:lower:]' | sed -E 's/[-_.]+/-/g')
    keep+="$norm "
done
if [[ $keep != *" torch "* ]]; then
    echo "$0: 'torch' is not among the kept packages ($*); without its pin pip may replace the" \
         "image's CUDA torch build. Add torch to the list." >&2
    exit 2
fi

if [[ ! -f $constraints ]]; then
    echo "$0: no constraints file at $constraints; nothing to relax" >&2
    exit 0
fi

tmp=$(mktemp "${constraints}.XXXXXX")
# Lines that name no package (comments, blanks, pip options) are kept as they are.
awk -v keep="$keep" '
    /^[[:space:]]*(#|-|$)/ { print; next }
    {
        name = $0
        sub(/^[[:space:]]+/, "", name)
        match(name, /^[A-Za-z0-9][A-Za-z0-9._-]*/)
        norm = tolower(substr(name, 1, RLENGTH))
        gsub(/[-_.]+/, "-", norm)
        if (index(keep, " " norm " ")) { print; kept++ }
        else { print "unpinned: " $0 > "/dev/stderr"; dropped++ }
    }
    END { printf "kept %d pin(s), unpinned %d\n", kept, dropped > "/dev/stderr" }
' "$constraints" > "$tmp"
chmod --reference="$constraints" "$tmp" 2> /dev/null || chmod 644 "$tmp"
mv "$tmp" "$constraints"
