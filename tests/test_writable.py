"""check_writable_dir: an output directory that is a file, sits under one, or cannot be written
(read-only filesystem, permissions) is refused naming the setting and the path in the way."""

from __future__ import annotations

import pytest

from plsh_dist.writable import check_writable_dir
from tests.unwritable import unwritable_dir


def test_writable_paths_pass(tmp_path):
    check_writable_dir(tmp_path, "--out")  # exists
    check_writable_dir(tmp_path / "a" / "b", "--out")  # to be created
    assert list(tmp_path.iterdir()) == []  # the check writes nothing


def test_files_in_the_way_are_named(tmp_path):
    blocker = tmp_path / "blocker"
    blocker.write_text("x")
    with pytest.raises(ValueError, match=r"^--out = '.*/blocker' is an existing file, not a directory; "
                                         r"choose another --out"):
        check_writable_dir(blocker, "--out")
    with pytest.raises(ValueError, match=r"^\[run\]\.out_dir = '.*/blocker/run' cannot be created: '.*/blocker' "
                                         r"is a file, not a directory; choose another \[run\]\.out_dir"):
        check_writable_dir(blocker / "run", "[run].out_dir")


def test_unwritable_directories_are_named(tmp_path):
    with unwritable_dir(tmp_path / "ro") as ro:
        with pytest.raises(ValueError, match=r"'.*/ro' is not writable \(a read-only filesystem or no permission\); "
                                             r"choose another --out on a writable disk"):
            check_writable_dir(ro, "--out")
        with pytest.raises(ValueError, match=r"'.*/ro/runs/x' would be created in '.*/ro', not writable"):
            check_writable_dir(ro / "runs" / "x", "--out")
