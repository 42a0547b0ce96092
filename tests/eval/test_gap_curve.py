"""The gap of PLSH to exact ALiBi against s: paired ratios, the per-seed spread and the target flags."""

from __future__ import annotations

import math

import numpy as np
import pytest

from launchers import replicate
from plsh_dist.eval.gap_curve import format_gap, gap_rows, plot_gap
from plsh_dist.eval.replication import summarize

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
    assert s8["seed_std"] == pytest.approx(np.std([math.exp(0.05), math.exp(0.07)], ddof=1))
    assert s8["sampler"] == "strat" and s8["sigma"] == "h"


def test_the_table_flags_the_target_on_the_mean_and_on_every_seed(results):
    text = format_gap(results, target=1.016)
    line8 = next(line for line in text.splitlines() if line.startswith("| 8 |"))
    line100 = next(line for line in text.splitlines() if line.startswith("| 100 |"))
    assert line8.endswith("| no / no |")
    assert line100.endswith("| yes / no |")  # the mean exp(0.015) is within 1.016, the second seed exp(0.02) not
    wide = format_gap(results, target=1.03)
    assert next(line for line in wide.splitlines() if line.startswith("| 100 |")).endswith("| yes / yes |")


def test_no_reference_or_no_plsh_gives_nothing(results, tmp_path):
    assert gap_rows({**results, "reference": None}) == [] and format_gap({**results, "reference": None}) == ""
    only_one_s = {**results, "summary": [r for r in results["summary"] if r["mode"] != "plsh_s100_strat_h"]}
    assert plot_gap(only_one_s, tmp_path / "gap.png") is None


def test_the_plot_is_written(results, tmp_path):
    assert plot_gap(results, tmp_path / "gap.png").stat().st_size > 1000


def test_replicate_mode_names_parse_as_plsh_points():
    from plsh_dist.eval.gap_curve import PLSH_MODE

    names = [m for m in replicate._modes(samples=(8, 400)) if m.startswith("plsh")]
    assert names and all(PLSH_MODE.match(m) for m in names)
    assert {int(PLSH_MODE.match(m)["s"]) for m in names} == {8, 400}
