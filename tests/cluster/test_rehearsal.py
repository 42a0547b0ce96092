"""The rehearsal's tiny stand-in end to end on the two namespace hosts: every phase, every check, its page.

``tools/rehearsal.py --tiny`` runs the phases of the 0.6B rehearsal
(uninterrupted run, checkpoint + SIGKILL of node-1's rank mid-step, resume,
ZeRO-3 export, evaluation at 2x the length, planner beside the measured run)
with the debug model at 256 tokens. The real one is not run here: it takes
hours of both cores (results/cluster/README.md).
"""

from __future__ import annotations

import json
import sys

import pytest

from tests.cluster.conftest import unavailable
from tests.train.launcher_runs import ROOT, launcher_env, run

pytestmark = pytest.mark.cluster

BOUND_S = 1800  # 1.5-4 minutes on 2 busy cores; a hang fails the test instead of blocking


def test_tiny_rehearsal_passes_every_phase_and_writes_its_page(tmp_path):
    out, page = tmp_path / "out", tmp_path / "page.md"
    res = run([sys.executable, str(ROOT / "tools" / "rehearsal.py"), "--tiny", "--out", str(out),
               "--page", str(page)], launcher_env(), tmp_path, "rehearsal", BOUND_S)
    if res.returncode == 2 and "cannot be made here" in res.stderr:
        unavailable(res.stderr.strip())
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]

    rep = json.loads((out / "rehearsal.json").read_text())
    assert rep["ok"] and not rep.get("stopped")
    assert [p["name"] for p in rep["phases"]] == ["prepare data", "hosts up", "reference", "killed", "resumed",
                                                  "export", "evaluate"]
    assert all(p["ok"] for p in rep["phases"]) and all(c["ok"] for c in rep["checks"]), rep["checks"]
    assert len(rep["checks"]) == 10
    assert rep["resumed"]["losses"] == rep["reference"]["losses"]  # the check's own comparison, in the record
    assert rep["seq_len"] == 256 and {row["length"] for row in rep["evaluation"]} == {256, 512}
    assert rep["resumed"]["load_s"] > 0 and rep["checkpoint"]["size_bytes"] > 0
    assert [x["tag"] for x in rep["killed"]["saves"]] == ["step_00000002"]  # then step 3 was killed
    assert sorted(rep["measured"]["peak_rss_bytes"]) == ["node-0/local_rank0", "node-1/local_rank0"]
    assert all(v > 2**20 for v in rep["measured"]["peak_rss_bytes"].values())
    assert rep["plan"]["peak_bytes_per_rank"] > 0 and rep["plan"]["step_flops"] > 0

    text = page.read_text()
    assert text.startswith("# The rehearsal's tiny stand-in across two namespace hosts")
    assert "Passed" in text and "FAIL" not in text
    assert "python tools/rehearsal.py --tiny --out" in text  # the exact command
    for phase in rep["phases"]:
        assert f"| {phase['name']} | {phase['wall_s']:.1f} s | ok" in text
    assert "| peak memory |" in text and "| step FLOPs |" in text
    assert "save: killed run, step_00000002" in text and "load on resume" in text
