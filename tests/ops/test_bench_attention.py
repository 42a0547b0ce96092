"""The CPU attention benchmark at a tiny size: every equal-cost pair is measured, each in its
own process, and the summary's ratios are those of the recorded medians."""

from __future__ import annotations

import json

import pytest

from tests.launchers import load_launcher


def _bench():
    return load_launcher("bench_attention")


def test_truncated_alibi_is_timed_beside_plsh_at_equal_cost(tmp_path):
    bench = _bench()
    bench.main(["--lengths", "512", "--methods", "onepass_s8,truncated_s8,alibi_chunked", "--repeats", "1",
                "--heads", "4", "--head-dim", "16", "--out", str(tmp_path)])
    records = {r["method"]: r for r in json.loads((tmp_path / "results.json").read_text())}
    assert set(records) == {"onepass_s8", "truncated_s8", "alibi_chunked"}
    assert all(r["median_s"] > 0 and r["threads"] == 1 for r in records.values())
    ratio = records["truncated_s8"]["median_s"] / records["onepass_s8"]["median_s"]
    lines = (tmp_path / "table.md").read_text()
    assert f"T=512: truncated_s8 takes {ratio:.2f}x the time of onepass_s8" in lines
    assert "alibi_chunked takes" in lines and (tmp_path / "attention_time.png").stat().st_size > 0


def test_an_unknown_method_is_refused():
    with pytest.raises(SystemExit):
        _bench().main(["--methods", "truncated_s9"])
