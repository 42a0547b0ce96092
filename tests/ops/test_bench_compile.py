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
        "--biases", "plsh_onepass", "--backends", "aot_eager", "--rounds", "1", "--steps", "4", "--skip", "1",
        "--batch", "2", "--seq-len", "64", "--out", str(tmp_path / "out"),
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
