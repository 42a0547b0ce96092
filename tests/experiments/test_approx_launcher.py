"""``python -m experiments.approximation`` end to end on tiny settings, with a tiny saved Qwen3 checkpoint."""

from __future__ import annotations

import importlib
import json
import math
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import pytest
import torch

from experiments.approximation.approx_report import ApproxErrorConfig, parse_int_list



def _launcher():
    return importlib.import_module("experiments.approximation.__main__")


def test_parse_int_list_and_config_checks():
    assert parse_int_list("1,2,4,...,1024") == [2**i for i in range(11)]
    assert parse_int_list("3,5") == [3, 5]
    with pytest.raises(ValueError, match="two numbers"):
        parse_int_list("1,...,8")
    with pytest.raises(ValueError, match="samples"):
        ApproxErrorConfig(samples=[4, 2])
    with pytest.raises(ValueError, match="samplers"):
        ApproxErrorConfig(samplers=["sobol"])


def test_launcher_writes_results(tmp_path):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.Qwen3Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, head_dim=16, vocab_size=128, max_position_embeddings=128)
    transformers.Qwen3ForCausalLM(cfg).save_pretrained(tmp_path / "ckpt")
    out = tmp_path / "out"
    rc = _launcher().main(["--sigma", "2,6", "--seq-len", "64", "--samples", "1,2,4,...,64", "--seeds", "2",
                           "--output-seeds", "1", "--block-seq-lens", "64,256", "--checkpoint", str(tmp_path / "ckpt"),
                           "--truncated", "--out", str(out)])
    assert rc == 0
    for name in ("results.json", "table.md", "error_vs_s.png", "blocks.png", "iid_vs_stratified.png", "output_error.png"):
        assert (out / name).stat().st_size > 0, name
    res = json.loads((out / "results.json").read_text())
    assert len(res["mask"]) == 2 * 3 * 7  # sigma x (2 samplers + truncated) x s
    assert {r["source"] for r in res["output"]} == {"random", "layer 0", "layer 1"}
    assert len([r for r in res["output"] if r["sampler"] == "truncated"]) == 3 * 2 * 7  # source x sigma x s
    trunc = [r for r in res["mask"] if r["sampler"] == "truncated" and r["sigma"] == 6.0 and r["s"] == 8]
    assert trunc[0]["window"] == 16 and trunc[0]["max_mean"] == pytest.approx(math.exp(-16 / 6.0))
    assert all(row["iid_bound_holds"] and row["stratified_bound_holds"] for row in res["summary"]["per_sigma"])
    assert "| 6 | 64 |" in (out / "table.md").read_text()
    assert "truncated max | truncated spectral" in (out / "table.md").read_text()
    with pytest.raises(ValueError, match="samplers"):
        ApproxErrorConfig(samplers=["truncated"])  # an entry of its own (truncated=True), not a sampler
