"""The gap of PLSH to exact ALiBi against s: paired ratios, the per-seed spread and the target flags."""

from __future__ import annotations

import math

import numpy as np
import pytest

from experiments import replicate
from experiments.gap_curve import format_gap, gap_rows, plot_gap, seeds_needed, verdict
from experiments.replication_report import summarize

WINDOWS = 6


def _row(mode, seed, length, offset):
    """An evaluated row whose window losses are the reference's plus ``offset``."""
    base = np.linspace(4.0, 5.0, WINDOWS) + 0.01 * seed
    loss = base + offset
    return {"corpus": "prose", "mode": mode, "train_seed": seed, "length": length, "targets": f"t{length}",
            "window_loss": loss.tolist(), "perplexity_mean": float(np.exp(loss.mean())), "loss_mean": float(loss.mean()),
            "perplexity_ci": [1.0, 2.0], "perplexity_std": 0.0, "windows": WINDOWS, "scored_per_window": 8}


@pytest.fixture
def results():
    # log-ratio offsets per (mode, seed): s = 8 is 5-7% worse, s = 100 within 1-2%.
    offsets = {"plsh_s8_strat_h": (0.05, 0.07), "plsh_s100_strat_h": (0.01, 0.02)}
    rows = []
    for length in (64, 128):
        for seed in (0, 1):
            rows.append(_row("alibi_h", seed, length, 0.0))
            for mode, off in offsets.items():
                rows.append(_row(mode, seed, length, off[seed]))
    return {"reference": "alibi_h", "train_len": 64, "rows": rows, "summary": summarize(rows, "alibi_h")}


def test_ratios_and_seed_spread_are_the_paired_ones(results):
    rows = gap_rows(results)
    assert [(r["s"], r["length"]) for r in rows] == [(8, 64), (8, 128), (100, 64), (100, 128)]
    s8 = rows[0]
    assert s8["ratio"] == pytest.approx(math.exp(0.06))  # mean over seeds of the paired differences
    assert s8["seed_ratios"] == pytest.approx([math.exp(0.05), math.exp(0.07)])
    assert s8["seed_max"] == pytest.approx(math.exp(0.07))
    sd = np.std([0.05, 0.07], ddof=1)
    assert s8["seed_log_sd"] == pytest.approx(sd)
    half = 12.706 * sd / math.sqrt(2)  # t quantile, 1 degree of freedom
    assert s8["seed_ci"] == pytest.approx([math.exp(0.06 - half), math.exp(0.06 + half)], rel=1e-4)
    assert s8["sampler"] == "strat" and s8["sigma"] == "h"


def test_the_verdict_reads_the_seed_interval():
    assert verdict([1.01, 1.02], 1.03) == "within"
    assert verdict([1.04, 1.10], 1.03) == "outside"
    assert verdict([0.99, 1.05], 1.03) == "unresolved"
    assert verdict([math.nan, math.nan], 1.03) == "unresolved"  # one seed: nothing is shown


def test_seeds_needed_grows_with_the_spread_and_the_tightness():
    assert seeds_needed(0.1, 1.03) == math.ceil((1.96 * 0.1 / math.log(1.03)) ** 2)  # 44 at 10% spread
    assert seeds_needed(0.2, 1.03) > seeds_needed(0.1, 1.03) > seeds_needed(0.1, 1.10)
    assert seeds_needed(math.nan, 1.03) is None


def _line(text, s):
    return next(line for line in text.splitlines() if line.startswith(f"| {s} |"))


def test_the_table_says_within_outside_or_unresolved(results):
    # Two seeds: t(1) = 12.7 makes every interval wide, so nothing is shown either way ...
    text = format_gap(results, target=1.03)
    assert "| unresolved |" in _line(text, 8) and "| unresolved |" in _line(text, 100)
    # ... unless the seeds agree closely: offsets 0.05 / 0.0502 put s = 8 outside 1.03, s = 100 within 1.06.
    rows = []
    for length in (64, 128):
        for seed, (a, b) in enumerate(((0.05, 0.010), (0.0502, 0.0102))):
            rows += [_row("alibi_h", seed, length, 0.0), _row("plsh_s8_strat_h", seed, length, a),
                     _row("plsh_s100_strat_h", seed, length, b)]
    tight = {"reference": "alibi_h", "train_len": 64, "rows": rows, "summary": summarize(rows, "alibi_h")}
    assert "| outside |" in _line(format_gap(tight, target=1.03), 8)
    assert "| within |" in _line(format_gap(tight, target=1.06), 100)


def test_no_reference_or_no_plsh_gives_nothing(results, tmp_path):
    assert gap_rows({**results, "reference": None}) == [] and format_gap({**results, "reference": None}) == ""
    only_one_s = {**results, "summary": [r for r in results["summary"] if r["mode"] != "plsh_s100_strat_h"]}
    assert plot_gap(only_one_s, tmp_path / "gap.png") is None


def test_the_plot_is_written(results, tmp_path):
    assert plot_gap(results, tmp_path / "gap.png").stat().st_size > 1000


def test_replicate_mode_names_parse_as_plsh_points():
    from experiments.gap_curve import PLSH_MODE

    names = [m for m in replicate._modes(samples=(8, 400)) if m.startswith("plsh")]
    assert names and all(PLSH_MODE.match(m) for m in names)
    assert {int(PLSH_MODE.match(m)["s"]) for m in names} == {8, 400}


def test_truncated_modes_are_points_beside_the_samplers(results):
    from experiments.gap_curve import TRUNCATED, TRUNCATED_MODE

    names = [m for m in replicate._modes(samples=(8, 20)) if m.startswith("trunc")]
    assert {int(TRUNCATED_MODE.match(m)["s"]) for m in names} == {8, 20}
    rows = results["rows"] + [_row("trunc_s8_h", seed, length, 0.02) for length in (64, 128) for seed in (0, 1)]
    with_truncated = {**results, "rows": rows, "summary": summarize(rows, "alibi_h")}
    trunc = [r for r in gap_rows(with_truncated) if r["sampler"] == TRUNCATED]
    assert [(r["s"], r["sigma"], r["length"]) for r in trunc] == [(8, "h", 64), (8, "h", 128)]
    assert trunc[0]["ratio"] == pytest.approx(math.exp(0.02))
    assert "truncated ALiBi at s samples' cost, sigma per head" in format_gap(with_truncated)
