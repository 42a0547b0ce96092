"""A directory the test process cannot write, root included (for refusals of unwritable outputs)."""

from __future__ import annotations

import os
import subprocess
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest


@contextmanager
def unwritable_dir(path: Path) -> Iterator[Path]:
    """Create ``path`` and make it unwritable until the block ends (``read_only``)."""
    path.mkdir(parents=True)
    with read_only(path, remove_on_skip=True):
        yield path


@contextmanager
def read_only(path: Path, remove_on_skip: bool = False) -> Iterator[Path]:
    """Make the existing directory ``path`` unwritable until the block ends: mode 555, or for root
    (whom permissions do not stop) the immutable attribute, as a read-only filesystem refuses writes.
    Only ``path`` itself: what is under it stays as it was."""
    root = os.geteuid() == 0
    if root:
        done = subprocess.run(["chattr", "+i", str(path)], capture_output=True, text=True)
        if done.returncode != 0:
            if remove_on_skip:
                path.rmdir()
            pytest.skip(f"running as root and `chattr +i` failed ({done.stderr.strip()}): no unwritable directory")
    else:
        path.chmod(0o555)
    try:
        yield path
    finally:
        if root:
            subprocess.run(["chattr", "-i", str(path)], check=True)
        else:
            path.chmod(0o755)
