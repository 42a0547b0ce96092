"""launchers/rehearsal.py refuses before any work (exit 2, the reason named, nothing written)."""

from __future__ import annotations

import pytest

from tests.launchers import load_launcher


@pytest.fixture
def rehearsal():
    return load_launcher("rehearsal")


def test_one_step_is_refused(rehearsal, tmp_path, capsys):
    assert rehearsal.main(["--tiny", "--steps", "1", "--out", str(tmp_path / "out")]) == 2
    assert "--steps 1: at least 2" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_used_out_dir_is_refused(rehearsal, tmp_path, capsys):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "old").write_text("kept")
    assert rehearsal.main(["--tiny", "--out", str(tmp_path / "out")]) == 2
    assert "exists and is not empty" in capsys.readouterr().err
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["old"]


def test_hosts_that_cannot_be_made_are_named(rehearsal, tmp_path, capsys, monkeypatch):
    import cluster.rehearsal

    monkeypatch.setattr(cluster.rehearsal, "namespaces_refused", lambda: "namespaces refused: unshare failed (EPERM)")
    assert rehearsal.main(["--tiny", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "the two hosts cannot be made here: namespaces refused: unshare failed (EPERM)" in err
    assert not (tmp_path / "out").exists()


def test_a_length_sp_cannot_split_is_refused_with_the_trainers_message(rehearsal, tmp_path, capsys, monkeypatch):
    import cluster.rehearsal

    monkeypatch.setattr(cluster.rehearsal, "namespaces_refused", lambda: None)
    monkeypatch.setattr(cluster.rehearsal, "ssh_unavailable", lambda: None)
    assert rehearsal.main(["--tiny", "--seq-len", "255", "--out", str(tmp_path / "out")]) == 2
    assert "config error" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_too_little_disk_for_the_checkpoints_is_refused(rehearsal, tmp_path, capsys, monkeypatch):
    import shutil

    import cluster.rehearsal

    monkeypatch.setattr(cluster.rehearsal, "namespaces_refused", lambda: None)
    monkeypatch.setattr(cluster.rehearsal, "ssh_unavailable", lambda: None)
    monkeypatch.setattr(cluster.rehearsal.shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(1, 1, 2**20))
    assert rehearsal.main(["--tiny", "--out", str(tmp_path / "out")]) == 2
    assert f"not enough disk under {tmp_path}" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
