"""The prepare-data benchmark at a tiny size, so it cannot rot: every case runs in its own process
and reports what docs/benchmarks.md quotes (throughput and its ratios, peak RSS per size, the
1 GB study's prepare, launch and extrapolation, here on a few MB)."""

from __future__ import annotations

import json

import pytest

from tests.launchers import load_launcher

TINY = ["--size-mb", "1", "--repeats", "1", "--vocab-size", "400"]


@pytest.mark.slow  # 8 fresh processes, each importing torch: 40 s on 2 idle cores, minutes on busy ones
def test_throughput_and_peak_rss_at_a_tiny_size(tmp_path):
    result = load_launcher("bench_prepare_data").main(
        [*TINY, "--rss", "--rss-sizes-mb", "1", "2", "--txt-mb", "1", "--dir", str(tmp_path),
         "--out", str(tmp_path / "out")])
    t = result["throughput"]
    cases = {"read/1", "spm/1", "prepare/1"} | ({"spm/2", "prepare/2"} if result["cores"] >= 2 else set())
    assert set(t["median_mb_s"]) == cases and all(v > 0 for v in t["median_mb_s"].values())
    # the build and the limit tokenized the same documents: about the same tokens (the build adds an
    # EOS to each document and leaves out those under min_doc_tokens)
    (spm,), (prep,) = t["runs"]["spm/1"], t["runs"]["prepare/1"]
    assert abs(prep["tokens"] - spm["tokens"]) < 0.02 * spm["tokens"]
    assert t["ratios"]["prepare_over_limit_1"] > 0
    rows = {(r["format"], r["size_mb"]): r for r in result["rss"]}
    assert set(rows) == {("jsonl", 1), ("jsonl", 2), ("txt", 1)}
    assert rows[("jsonl", 1)]["over_smallest_jsonl"] == 1.0
    assert all(r["peak_mib"] >= r["before_mib"] > 0 and r["tokens"] > 0 for r in rows.values())
    assert json.loads((tmp_path / "out" / "results.json").read_text())["rss"] == result["rss"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # its data removed


@pytest.mark.slow  # prepare_data.py, then a 2-rank torchrun that builds the cache (about 40 s)
def test_prepare_and_two_rank_first_launch_at_a_tiny_size(tmp_path):
    result = load_launcher("bench_prepare_data").main([*TINY, "--launch", "--launch-mb", "2", "--dir", str(tmp_path)])
    launch = result["launch"]
    assert launch["prepare"]["exit"] == 0 and launch["prepare"]["tokens"] > 0
    assert launch["launch"]["exit"] == 0 and launch["launch"]["built_at_launch"], launch["launch"].get("tail")
    assert [e["text_gb"] for e in result["extrapolation"]] == [10, 100]
