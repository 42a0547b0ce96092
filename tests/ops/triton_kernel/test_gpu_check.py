"""tools/gpu_check.py without CUDA: the smoke stage's CPU-safe part (the kernel's check at toy
sizes under Triton's interpreter) runs, writes its results before the full stage starts, says
that every GPU part was skipped, and fails when the kernel is wrong; the full stage copes
without pytest."""

import json

import pytest
import torch

pytest.importorskip("triton")

from plsh_dist.ops.triton import attention as triton_onepass  # noqa: E402
from tests.launchers import load_launcher  # noqa: E402

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU path of the check (a GPU runs the real one)")


def _check():
    if not triton_onepass.interpreting():
        pytest.skip("the smoke stage's CPU part runs the kernel under Triton's interpreter")
    return load_launcher("gpu_check")


def test_smoke_stage_runs_the_cpu_safe_part_and_says_the_gpu_parts_were_skipped(tmp_path):
    check = _check()
    assert check.main(["--out", str(tmp_path), "--stage", "smoke"]) == 0
    smoke = json.loads((tmp_path / "smoke.json").read_text())
    assert smoke["ok"] and not smoke["cuda"] and smoke["timings"] == []
    assert any("no CUDA" in s for s in smoke["skipped"])
    assert {c["case"] for c in smoke["correctness"]} == set(load_launcher("gpu_smoke").TOY_CASES)
    for case in smoke["correctness"]:
        assert {o["kernel"] for o in case["outputs"].values()} == {"forward", "dK/dV", "dQ"}
    summary = (tmp_path / "summary.txt").read_text()
    assert "NO CUDA" in summary and "SKIPPED" in summary and not (tmp_path / "check.json").exists()


def test_smoke_stage_fails_on_a_wrong_kernel(tmp_path, monkeypatch):
    check = _check()
    forward = triton_onepass.triton_onepass_forward

    def off_by_a_little(*args, **kwargs):
        out, lse = forward(*args, **kwargs)
        return out + 1e-3, lse

    monkeypatch.setattr(triton_onepass, "triton_onepass_forward", off_by_a_little)
    assert check.main(["--out", str(tmp_path), "--stage", "smoke"]) == 1
    smoke = json.loads((tmp_path / "smoke.json").read_text())
    assert not smoke["ok"] and all(not c["outputs"]["out"]["ok"] for c in smoke["correctness"])
    assert "FAILED" in (tmp_path / "summary.txt").read_text()


def test_all_stages_run_smoke_graph_full_in_order_and_cope_without_pytest(tmp_path, monkeypatch):
    """The default (``all``): the smoke results are written before the graph stage starts, the graph
    stage's before the full stage (the graph stage itself: test_gpu_graph.py; stood in for here)."""
    check = _check()
    seen = []
    run_full = check.run_full

    def graph_after_smoke(out, budget_s):
        seen.append(("graph", (out / "smoke.json").is_file() and (out / "smoke.md").is_file()))
        return {"ok": True, "failures": {}, "summary": ["graph stage (stand-in): ok"]}

    def full_after_graph(env, out, args):
        seen.append(("full", "graph stage (stand-in)" in (out / "summary.txt").read_text()))
        return run_full(env, out, args)

    monkeypatch.setattr(check, "run_graph_stage", graph_after_smoke)
    monkeypatch.setattr(check, "run_full", full_after_graph)
    monkeypatch.setattr(check, "pytest_status", lambda: "pytest is not installed: the tests were skipped (test)")
    assert check.main(["--out", str(tmp_path), "--skip-bench"]) == 0
    assert seen == [("graph", True), ("full", True)]
    result = json.loads((tmp_path / "check.json").read_text())
    assert result["tests"] == {} and "not installed" in result["pytest"] and result["planning"]
    assert "pytest is not installed" in (tmp_path / "summary.txt").read_text()


def test_the_timing_code_runs_at_a_toy_size_on_cpu():
    """The smoke timings run only with CUDA; their code is exercised here (fp32, the interpreter)."""
    _check()
    smoke = load_launcher("gpu_smoke")
    records = smoke.timings(torch.device("cpu"), lengths=(64,), shape=dict(heads=2, head_dim=16, samples=8),
                            repeats=1)
    assert [r["method"] for r in records] == ["plsh_triton_perhead_s8", "sdpa_flash_causal"]
    assert all(r["status"] == "ok" and r["time_ms"] > 0 and r["speedup_vs_fastest_floor"] > 0 for r in records)
    assert "| 64 | plsh_triton_perhead_s8 |" in smoke.markdown({"device": "CPU", "torch": "x", "wall_s": 0,
                                                                "skipped": [], "correctness": [], "timings": records})
