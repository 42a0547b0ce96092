"""tools/gpu_graph.py (gpu_check.py's graph stage): without CUDA it says what it skipped and runs
the eager and compiled steps of the tiny model, whose compiled step is checked against an fp64
copy at two steps; a failing part is recorded and the next one runs; gpu_check.py records a child
process it had to kill. With CUDA, the stage's own result must be ok (never faked here)."""

import json
import warnings

import pytest
import torch

from tests.launchers import load_launcher

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU path of the stage (a GPU runs the real one)")


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Each run compiles a new model's layers: no test inherits another's compiled code (nor its
    recompile count)."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@no_cuda
def test_graph_stage_runs_the_cpu_part_and_says_what_it_skipped(tmp_path):
    graph = load_launcher("gpu_graph")
    result = graph.run_graph(tmp_path)
    assert json.loads((tmp_path / "graph.json").read_text()) == json.loads(json.dumps(result))
    assert result["ok"] and not result["cuda"] and not result["failures"]
    assert any("no CUDA" in s and "CUDA graph" in s for s in result["skipped"])
    assert set(result["times"]) == {"eager", "compiled"} and result["sync_sites"] == {}
    assert all(t["median_ms"] > 0 and len(t["all_ms"]) == graph.TIMED_CPU for name, t in result["times"].items())
    assert result["times"]["compiled"]["backend"] == "aot_eager" and set(result["ratios"]) == {"eager_over_compiled"}
    assert result["references"] == {"ref_dtype": "float64", "ref_backend": "auto"}
    check = result["checks"]["compiled"]
    assert check["ok"] and check["masks"]["changed"] and check["masks"]["conclusive"]
    for step in graph.STEPS:
        row = check[f"step {step}"]
        assert row["loss_error"] <= row["loss_allowed"] and row["grad_error"] <= row["grad_allowed"]
    assert result["what"]["attention"]["num_samples"] == 10 and result["what"]["tokens"] == graph.CPU_TOY["seq_len"]
    text = "\n".join(result["summary"])
    assert "SKIPPED" in text and "eager / compiled" in text and "the masks changed" in text


@no_cuda
def test_a_failing_part_is_recorded_and_the_stage_goes_on(tmp_path, monkeypatch):
    graph = load_launcher("gpu_graph")

    def broken(*_args, **_kwargs):
        raise RuntimeError("called a synchronizing CUDA operation (test)")

    monkeypatch.setattr(graph, "references", broken)
    result = graph.run_graph(tmp_path)
    assert not result["ok"] and set(result["failures"]) == {"references"}
    assert "synchronizing" in result["failures"]["references"]["error"]
    assert any("gpu_graph.py" in w for w in result["failures"]["references"]["chain"][0]["where"])
    assert set(result["times"]) == {"eager", "compiled"} and result["checks"] == {}  # timed, not checked
    assert "FAILED references" in "\n".join(result["summary"])


@no_cuda
def test_a_stage_out_of_budget_skips_its_parts(tmp_path):
    result = load_launcher("gpu_graph").run_graph(tmp_path, budget_s=0.0)
    assert result["times"] == {} and result["ok"]  # nothing failed: nothing ran, and it says so
    assert sum("budget" in s for s in result["skipped"]) == 3


def test_a_reference_copy_that_fails_falls_back_to_the_torch_backend(monkeypatch):
    """On CUDA the fp32 copy runs the fused kernel first; where that fails (say, out of shared memory:
    its tiles are sized for bf16) the torch one pass gives the reference, and the report says why."""
    graph = load_launcher("gpu_graph")
    s = graph.build(False)
    real = graph.build_model

    def first_backend_fails(model_cfg, attn_cfg, runtime, **kwargs):
        model = real(model_cfg, attn_cfg, runtime, **kwargs)
        if kwargs["dtype"] == torch.float64 and attn_cfg.backend != "torch":
            def forward(*_args, **_kwargs):
                raise RuntimeError("out of resources: shared memory (test)")
            model.forward = forward
        return model

    monkeypatch.setattr(graph, "build_model", first_backend_fails)
    refs = graph.references(s)
    assert refs["ref_backend"] == "torch" and "out of resources" in refs["ref_fallback"]
    assert set(refs["ref"]) == set(refs["base"]) == set(graph.STEPS)
    assert refs["ref"][0][0] == pytest.approx(refs["base"][0][0], rel=1e-5)


def test_sync_warnings_are_filed_by_source_line():
    graph = load_launcher("gpu_graph")
    show, sites = graph.site_recorder()

    def op():  # the call site of a synchronizing op: this line, twice
        warnings.warn("called a synchronizing CUDA operation")

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = show
        op()
        op()
        warnings.warn("something else")
    (site,) = sites.values()
    assert site["calls"] == 2 and "test_gpu_graph.py" in site["where"] and site["where"].endswith("in op")


def test_the_stage_measures_the_configs_model():
    """The model, attention and length the stage reads are those the trainer resolves from the config."""
    from plsh_dist.config import load_config

    graph = load_launcher("gpu_graph")
    cfg = graph.run_config()
    run = load_config(str(graph.CONFIG))
    assert cfg["model"] == run.model and cfg["attention"] == run.attention and cfg["seq_len"] == run.data.seq_len
    assert cfg["model"].num_layers == 28 and cfg["attention"].num_samples == 10 and cfg["seq_len"] == 8192


@no_cuda
def test_gpu_check_records_a_graph_process_it_had_to_kill(tmp_path, monkeypatch):
    check = load_launcher("gpu_check")
    monkeypatch.setattr(check, "GRAPH_GRACE_S", 0.0)
    assert check.main(["--out", str(tmp_path), "--stage", "graph", "--graph-budget-s", "0.5"]) == 1
    result = json.loads((tmp_path / "graph.json").read_text())
    assert not result["ok"] and "killed after" in result["failures"]["process"]["error"]
    summary = (tmp_path / "summary.txt").read_text()
    assert "FAILED process: killed after" in summary and not (tmp_path / "smoke.json").exists()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: the graph stage on the 0.6B model at 8k")
def test_the_step_is_captured_and_replays_as_eager(tmp_path):
    result = load_launcher("gpu_graph").run_graph(tmp_path)
    assert set(result["times"]) == {"eager", "graphed", "compiled", "compiled+graphed"}, result["summary"]
    assert result["ok"], "\n".join(result["summary"])
    assert all(check["masks"]["changed"] for check in result["checks"].values())
