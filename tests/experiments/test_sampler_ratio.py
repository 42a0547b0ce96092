"""experiments/sampler_ratio.py: the s a sampler needs to reach i.i.d.'s max-norm error, and its table."""

from __future__ import annotations

import json

import pytest

from experiments import sampler_ratio
from experiments.approximation.approx_error import mask_error, samples_to_match


def test_ratio_is_match_at_over_the_interpolated_s(tmp_path):
    argv = ["--sigma", "4", "--seq-len", "64", "--seeds", "3", "--sampler", "stratified", "--samples", "2,4,8,16",
            "--match-at", "16", "--out", str(tmp_path)]
    assert sampler_ratio.main(argv) == 0
    res = json.loads((tmp_path / "ratios.json").read_text())
    (row,) = res["rows"]
    level = mask_error(4.0, 64, [16], 3, "iid", spectral=False)[0]["max_mean"]
    assert row["iid_level"] == level
    s_star = samples_to_match(mask_error(4.0, 64, [2, 4, 8, 16], 3, "stratified", spectral=False), level)
    assert row["stratified_s"] == pytest.approx(s_star) and row["stratified_ratio"] == pytest.approx(16 / s_star)
    assert 2 <= s_star < 16  # stratified reaches i.i.d.'s error with fewer samples
    assert res["command"].startswith("python experiments/sampler_ratio.py --sigma 4")
    md = (tmp_path / "ratios.md").read_text()
    assert f"| 4 | {level:.4f} | {s_star:.1f} ({16 / s_star:.2f}x fewer) |" in md
