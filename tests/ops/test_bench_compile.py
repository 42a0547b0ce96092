"""The compile benchmark at a tiny size: one bias, aot_eager only, one training round. Its layer is
one graph with no break, the cold and warm compiles are timed in their own processes, and the
training ratio is that of the recorded runs."""

from __future__ import annotations

import json

import pytest
import torch
import torch._dynamo

from tests.launchers import load_launcher


def _bench():
    return load_launcher("bench_compile")


@pytest.mark.slow  # a training round and a compile in fresh processes (about 30 s)
def test_one_bias_with_aot_eager_and_one_training_round(tmp_path):
    data = tmp_path / "data"
    _bench().main([
        "--sections", "layer,training", "--biases", "plsh_onepass", "--backends", "aot_eager", "--rounds", "1",
        "--steps", "4", "--skip", "1", "--batch", "2", "--seq-len", "64", "--out", str(tmp_path / "out"),
        # a small corpus and tokenizer, made by the first run (tests/train/conftest.py's sizes)
        f"--data.cache_dir={data}", f"--data.corpus_dir={data / 'corpus'}", "--data.corpus_max_files=30",
        f"--tokenizer.model_path={data / 'tok.model'}", "--tokenizer.vocab_size=512",
        "--tokenizer.input_sentence_size=500",
    ])
    result = json.loads((tmp_path / "out" / "compile.json").read_text())
    (layer,) = result["layers"]
    assert layer["bias"] == "plsh_onepass" and layer["graph_breaks"] == 0 and layer["graph_count"] == 1
    for state in ("cold", "warm"):
        r = layer[f"aot_eager_{state}"]
        assert "error" not in r, r
        assert r["threads"] == 1 and r["seq_len"] == 64 and r["first_call_s"] > r["eager_s"] > 0
        assert r["compile_s"] == pytest.approx(r["first_call_s"] - r["eager_s"])
    assert "inductor_cold" not in layer
    runs = {r["variant"]: r for r in result["training"]["runs"]}
    assert set(runs) == {"off", "aot_eager"} and all(len(r["step_tokens_per_s"]) == 4 for r in runs.values())
    summary = result["training"]["summary"]
    assert summary["aot_eager"]["ratio"] == pytest.approx(
        runs["aot_eager"]["tokens_per_s"] / runs["off"]["tokens_per_s"])
    table = (tmp_path / "out" / "table.md").read_text()
    assert "| plsh_onepass | 1 | 0 |" in table
    assert f"| aot_eager | {summary['aot_eager']['tokens_per_s']:.0f} | {summary['aot_eager']['ratio']:.2f} |" in table


def test_a_graph_break_is_counted(monkeypatch):
    """The break count is dynamo's: a layer broken in two is reported as such, and fullgraph refuses it."""
    bench = _bench()
    layer = bench._layer

    def broken(*args):
        f, h, step = layer(*args)

        def g(x):
            y = f(x)
            torch._dynamo.graph_break()
            return y * 1

        return g, h, step

    monkeypatch.setattr(bench, "_layer", broken)
    torch._dynamo.reset()
    try:
        r = bench.measure_layer("none", "aot_eager", 1, 16, explain=True)
    finally:
        torch._dynamo.reset()
    assert r["graph_breaks"] == 1 and r["graph_count"] == 2
    assert "compile_s" not in r and "error" in r


def test_an_unknown_bias_is_refused():
    with pytest.raises(SystemExit):
        _bench().main(["--biases", "plsh"])


@pytest.mark.slow  # a fresh process spawning two ranks (15-25 s); the section's own test is slow too
def test_one_sp_layer_measurement(tmp_path):
    """One measurement of the sp_layer section (a fresh process spawning two gloo ranks, about 15 s):
    one graph with no break on every rank, the compile timed as the slowest rank's."""
    import argparse

    args = argparse.Namespace(batch=2, seq_len=64, threads=1, timeout=300, allow_breaks=False)
    r = _bench()._layer_subprocess("plsh_onepass", "aot_eager", str(tmp_path), explain=True, args=args, sp=2)
    assert "error" not in r, r
    assert r["sp"] == 2 and r["graph_count"] == 1 and r["graph_breaks"] == 0 and len(r["per_rank"]) == 2
    assert all(x["graph_breaks"] == 0 for x in r["per_rank"])
    assert r["first_call_s"] == max(x["first_call_s"] for x in r["per_rank"]) > r["eager_s"] > 0
    assert r["compile_s"] == pytest.approx(r["first_call_s"] - r["eager_s"])


@pytest.mark.slow  # two measurements of two spawned ranks each (30-75 s on 2 busy cores)
def test_the_sp_layer_section_records_graphs_and_compile_times(tmp_path):
    """``--sections sp_layer``: the layer under SP = 2 (two gloo ranks, spawned in a fresh process per
    measurement) is one graph with no break on every rank, and its cold and warm compiles are timed as
    the slowest rank's."""
    _bench().main(["--sections", "sp_layer", "--biases", "plsh_onepass", "--backends", "aot_eager", "--batch", "2",
                   "--seq-len", "64", "--out", str(tmp_path)])
    result = json.loads((tmp_path / "compile.json").read_text())
    assert result["layers"] == [] and result["training"] is None and result["sp_training"] is None
    (layer,) = result["sp_layers"]
    assert layer["bias"] == "plsh_onepass" and layer["graph_breaks"] == 0 and layer["graph_count"] == 1
    for state in ("cold", "warm"):
        r = layer[f"aot_eager_{state}"]
        assert "error" not in r, r
        assert r["sp"] == 2 and len(r["per_rank"]) == 2 and r["seq_len"] == 64 and r["threads"] == 1
        assert r["first_call_s"] == max(x["first_call_s"] for x in r["per_rank"]) > r["eager_s"] > 0
        assert r["compile_s"] == pytest.approx(r["first_call_s"] - r["eager_s"])
    assert all(x["graph_breaks"] == 0 for x in layer["aot_eager_cold"]["per_rank"])
    table = (tmp_path / "table.md").read_text()
    assert "SP = 2 (2 processes, gloo)" in table and "| plsh_onepass | 1 | 0 |" in table


@pytest.mark.slow  # two 2-rank training runs through the deepspeed launcher (about 60 s), a corpus made first
def test_the_sp_training_section_compares_compiled_with_eager(tmp_path):
    data = tmp_path / "data"
    _bench().main([
        "--sections", "sp_training", "--backends", "aot_eager", "--rounds", "1", "--steps", "4", "--skip", "1",
        "--batch", "2", "--seq-len", "64", "--out", str(tmp_path / "out"),
        f"--data.cache_dir={data}", f"--data.corpus_dir={data / 'corpus'}", "--data.corpus_max_files=30",
        f"--tokenizer.model_path={data / 'tok.model'}", "--tokenizer.vocab_size=512",
        "--tokenizer.input_sentence_size=500",
    ])
    result = json.loads((tmp_path / "out" / "compile.json").read_text())
    training = result["sp_training"]
    assert result["training"] is None and result["sp_layers"] == []
    assert training["sp"] == 2 and training["checkpointing"] == "full"
    assert "--parallel.sp_size=2" in training["overrides"] and "--memory.activation_checkpointing=true" in \
        training["overrides"]
    runs = {r["variant"]: r for r in training["runs"]}
    assert set(runs) == {"off", "aot_eager"} and all(len(r["step_tokens_per_s"]) == 4 for r in runs.values())
    assert training["summary"]["aot_eager"]["ratio"] == pytest.approx(
        runs["aot_eager"]["tokens_per_s"] / runs["off"]["tokens_per_s"])
    assert "Training under SP = 2" in (tmp_path / "out" / "table.md").read_text()


def test_ranks_merge_as_the_slowest():
    r0 = {"bias": "none", "eager_s": 1.0, "first_call_s": 5.0, "compile_s": 4.0, "compiled_s": 0.5,
          "graph_count": 1, "graph_breaks": 0, "cache_hits": {}}
    r1 = dict(r0, eager_s=2.0, first_call_s=4.0, compile_s=2.0, compiled_s=0.7, graph_breaks=1, graph_count=2)
    merged = _bench().merge_ranks([r0, r1])
    assert (merged["eager_s"], merged["first_call_s"], merged["compiled_s"]) == (2.0, 5.0, 0.7)
    assert merged["compile_s"] == 3.0 and merged["graph_breaks"] == 1 and merged["graph_count"] == 2
    failed = _bench().merge_ranks([r0, {"bias": "none", "error": "rank 1: RuntimeError: x"}])
    assert failed["error"] == "rank 1: RuntimeError: x" and "compile_s" not in failed


@pytest.mark.parametrize("argv", [["--sections", "sp"], ["--sections", "sp_layer", "--sp", "3"],
                                  ["--sections", "sp_layer", "--sp", "1"]])
def test_bad_sections_or_sp_are_refused(argv):
    with pytest.raises(SystemExit):
        _bench().main(argv)
