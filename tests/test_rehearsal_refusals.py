"""tools/rehearsal.py refuses before any work (exit 2, the reason named, nothing written)."""

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
    from tools.cluster import rehearsal as cluster_rehearsal

    monkeypatch.setattr(cluster_rehearsal, "namespaces_refused", lambda: "namespaces refused: unshare failed (EPERM)")
    assert rehearsal.main(["--tiny", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "the two hosts cannot be made here: namespaces refused: unshare failed (EPERM)" in err
    assert not (tmp_path / "out").exists()


def test_a_length_sp_cannot_split_is_refused_with_the_trainers_message(rehearsal, tmp_path, capsys, monkeypatch):
    from tools.cluster import rehearsal as cluster_rehearsal

    monkeypatch.setattr(cluster_rehearsal, "namespaces_refused", lambda: None)
    monkeypatch.setattr(cluster_rehearsal, "ssh_unavailable", lambda: None)
    assert rehearsal.main(["--tiny", "--seq-len", "255", "--out", str(tmp_path / "out")]) == 2
    assert "config error" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_too_little_disk_for_the_checkpoints_is_refused(rehearsal, tmp_path, capsys, monkeypatch):
    import shutil

    from tools.cluster import rehearsal as cluster_rehearsal

    monkeypatch.setattr(cluster_rehearsal, "namespaces_refused", lambda: None)
    monkeypatch.setattr(cluster_rehearsal, "ssh_unavailable", lambda: None)
    monkeypatch.setattr(cluster_rehearsal.shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(1, 1, 2**20))
    assert rehearsal.main(["--tiny", "--out", str(tmp_path / "out")]) == 2
    assert f"not enough disk under {tmp_path}" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_memory_is_budgeted_as_resident_not_live_tensors(rehearsal, tmp_path, capsys, monkeypatch):
    """Two ranks whose live peak fits the machine but whose resident peak does not are refused: the first
    0.6B run, let through on the live peak, was killed by the kernel's out-of-memory killer."""
    from plsh_dist.plan import plan_run
    from plsh_dist.plan.machine import MachineMemory
    from tools.cluster import rehearsal as cluster_rehearsal

    monkeypatch.setattr(cluster_rehearsal, "namespaces_refused", lambda: None)
    monkeypatch.setattr(cluster_rehearsal, "ssh_unavailable", lambda: None)
    peaks = []

    def planned(cfg, **kw):
        plan = plan_run(cfg, **kw)
        peaks.append(plan.memory.peak)
        return plan

    monkeypatch.setattr("plsh_dist.plan.plan_run", planned)
    # available memory that holds two live peaks with room, but not two resident ones
    monkeypatch.setattr("plsh_dist.plan.machine.machine_memory",
                        lambda: MachineMemory(available=int(2.6 * peaks[-1]), total=2**40, source="test"))
    assert rehearsal.main(["--tiny", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "not enough memory: each rank needs about" in err and "x 1.44" in err
    assert not (tmp_path / "out").exists()
