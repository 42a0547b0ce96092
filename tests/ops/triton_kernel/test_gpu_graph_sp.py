"""tools/gpu_graph_sp.py (the graph stage's SP part): two ranks over gloo, the SP = 2 decoder layer.
Without CUDA the capture is skipped and says so, and the ranks run the eager and compiled SP steps
of the tiny model on the CPU (the compiled one checked against eager); a rank past its time is
killed and recorded; the graph stage says it did not attempt the SP capture. With CUDA, the stage's
own verdict must be ok (never faked here: the SP ops exchange halos on the host, so the capture may
well be impossible, and then this test fails with the recorded reason)."""

import json

import pytest
import torch

from tests.launchers import load_launcher

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU path of the SP part (a GPU runs the real one)")


@pytest.mark.slow  # two ranks' eager and compiled steps in fresh processes (15-30 s)
@no_cuda
def test_without_cuda_the_capture_is_skipped_and_the_sp_steps_run_on_the_cpu(tmp_path):
    sp = load_launcher("gpu_graph_sp")
    result = sp.run_sp_layer(tmp_path)
    assert json.loads((tmp_path / "sp_graph.json").read_text()) == json.loads(json.dumps(result))
    assert result["ok"] and not result["cuda"] and not result["failures"], result["summary"]
    assert result["skipped"] == [sp.NO_CUDA] and "no CUDA" in sp.NO_CUDA and "CUDA graph" in sp.NO_CUDA
    assert [r["rank"] for r in result["ranks"]] == [0, 1]
    for rec in result["ranks"]:
        assert set(rec["times"]) == {"eager", "compiled"} and rec["times"]["compiled"]["backend"] == "aot_eager"
        assert set(rec["checks"]) == {"compiled"} and rec["checks"]["compiled"]["ok"]
        assert rec["what"]["sp"] == 2 and rec["what"]["chunk"] == sp.CPU_TOY["seq_len"] // 2
    text = "\n".join(result["summary"])
    assert "SKIPPED" in text and "rank 1 check compiled: ok" in text and "FAILED" not in text


@no_cuda
def test_a_rank_past_its_time_is_killed_and_recorded(tmp_path, monkeypatch):
    sp = load_launcher("gpu_graph_sp")
    monkeypatch.setattr(sp, "GRACE_S", 0.0)
    result = sp.run_sp_layer(tmp_path, budget_s=0.0)
    assert not result["ok"]
    assert all("killed after" in result["failures"][f"rank {r}: process"]["error"] for r in (0, 1))
    assert "FAILED rank 0: process" in "\n".join(result["summary"])


@no_cuda
def test_the_graph_stage_says_it_did_not_attempt_the_sp_capture(tmp_path):
    graph = load_launcher("gpu_graph")
    result = graph.run_graph(tmp_path, budget_s=0.0)
    assert graph.SP_NO_CUDA in result["skipped"] and "sp_layer" not in result
    assert f"  SKIPPED {graph.SP_NO_CUDA}" in result["summary"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: two SP ranks on one GPU")
def test_the_sp_layer_is_captured_and_replays_as_eager(tmp_path):
    result = load_launcher("gpu_graph_sp").run_sp_layer(tmp_path, budget_s=300.0)
    assert result["ok"], "\n".join(result["summary"])
    assert all(set(r["checks"]) == {"graphed", "compiled", "compiled+graphed"} for r in result["ranks"])
