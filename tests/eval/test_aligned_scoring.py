"""Like-with-like evaluation: aligned last-K windows score the same target tokens at
every length and in every mode; confidence intervals over windows; paired differences;
the evaluate launcher's scoring and CI options. Reuses the tiny exported model of
test_extrapolation (seconds)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from plsh_dist.checkpoint.loading import load_model
from plsh_dist.eval.eval_data import load_eval_tokens
from plsh_dist.eval.extrapolation import EvalSettings, evaluate_model, format_table, paired_differences, write_outputs
from plsh_dist.eval.mode_specs import attention_for, parse_modes
from plsh_dist.eval.scoring import mean_ci, paired_ci, plan_windows, t_quantile, targets_digest
from plsh_dist.models import set_attention_mode
from tests.eval.test_extrapolation import METRIC_TOL, tiny  # noqa: F401  (module fixture)


def test_aligned_windows_score_the_same_tokens():
    toks = np.arange(1000) % 97
    K, lengths = 16, [32, 64, 128]
    plans = {L: plan_windows(1000, L, "last", K, align_to=max(lengths)) for L in lengths}
    assert len({len(p) for p in plans.values()}) == 1  # the same number of windows at every length
    digests = {L: targets_digest(toks, p) for L, p in plans.items()}
    assert len({d["sha1"] for d in digests.values()}) == 1
    for L, p in plans.items():
        assert [w.start + w.length for w in p] == [128 + i * K for i in range(len(p))]  # same ends
        assert all(w.score_from == L - K for w in p)
    assert digests[32] == {"first": 128 - K + 1, "end": 128 + len(plans[32]) * K - K + 1,
                           "count": K * len(plans[32]), "sha1": digests[32]["sha1"]}
    # Unaligned (the old plan): a longer length scores later text.
    old = {L: targets_digest(toks, plan_windows(1000, L, "last", K)) for L in lengths}
    assert old[32]["first"] < old[128]["first"] and old[32]["sha1"] != old[128]["sha1"]
    # "whole" ignores align_to; too little data for the longest length is an error naming it.
    assert plan_windows(1000, 32, "whole", align_to=128)[1].start == 32
    with pytest.raises(ValueError, match="longest length 128"):
        plan_windows(100, 32, "last", 8, align_to=128)
    with pytest.raises(ValueError, match="must be >= the length"):
        plan_windows(1000, 64, "last", 8, align_to=32)


def test_mean_ci_and_t_quantile():
    for df, exact in [(1, 12.706205), (2, 4.302653), (5, 2.570582), (7, 2.364624), (30, 2.042272)]:
        assert t_quantile(0.975, df) == pytest.approx(exact, rel=2e-4)
    x = [3.1, 2.9, 3.4, 3.0, 3.6, 2.8]
    c = mean_ci(x)
    se = np.std(x, ddof=1) / math.sqrt(len(x))
    assert c["mean"] == pytest.approx(np.mean(x)) and c["se"] == pytest.approx(se)
    assert c["high"] - c["mean"] == pytest.approx(t_quantile(0.975, 5) * se)
    b1, b2 = mean_ci(x, method="bootstrap", resamples=500), mean_ci(x, method="bootstrap", resamples=500)
    assert b1 == b2 and b1["low"] < c["mean"] < b1["high"]  # reproducible, contains the mean
    assert b1["high"] - b1["low"] < c["high"] - c["low"]  # percentile bootstrap is narrower at n = 6
    assert math.isnan(mean_ci([1.0])["low"])
    p = paired_ci([1.0, 2.0, 3.0], [0.5, 1.4, 2.6])
    assert p["mean"] == pytest.approx(0.5) and p["low"] < 0.5 < p["high"]
    for bad, match in [(dict(method="jackknife"), "ci method"), (dict(level=1.5), "level"),
                       (dict(method="bootstrap", resamples=10), "resamples")]:
        with pytest.raises(ValueError, match=match):
            mean_ci(x, **bad)


def test_evaluation_compares_like_with_like(tiny, tmp_path):  # noqa: F811
    ck = load_model(tiny.export)
    tokens, _ = load_eval_tokens(ck, None)
    lengths, K, n = [16, 32, 48], 8, 3
    rows = evaluate_model(ck.model, ck.trained_attention, tokens,
                          EvalSettings(lengths, "plsh:s=2,alibi,none", seeds=[0, 1], scorings=["last"],
                                       last_tokens=K, max_windows=n, progress=False))
    assert len({json.dumps(r["targets"], sort_keys=True) for r in rows}) == 1  # same tokens: lengths x modes
    assert all(r["aligned"] and r["windows"] == n and len(r["window_loss"]) == n for r in rows)
    for r in rows:
        # The row's loss is the mean of its windows' losses (equal K per window), inside its interval.
        assert np.mean(r["window_loss"]) == pytest.approx(r["loss_mean"], rel=1e-9)
        assert r["loss_ci"][0] < r["loss_mean"] < r["loss_ci"][1]
        assert r["perplexity_ci"] == pytest.approx([math.exp(b) for b in r["loss_ci"]])
        assert r["ci"] == {"method": "se", "level": 0.95, "windows": n}
    # Direct calculation of the aligned L=32 windows (they end where L=48's do).
    r32 = next(r for r in rows if r["mode"] == "alibi" and r["length"] == 32)
    set_attention_mode(ck.model, attention_for(parse_modes("alibi")[0], ck.trained_attention))
    losses = []
    with torch.no_grad():
        for i in range(n):
            start = 48 - 32 + i * K
            w = torch.as_tensor(tokens[start : start + 33].astype("int64"))
            logits = ck.model(input_ids=w[None, :-1], position_ids=torch.arange(32)[None]).logits[0]
            losses.append(F.cross_entropy(logits[-K:].double(), w[-K:]).item())
    set_attention_mode(ck.model, ck.trained_attention)
    assert r32["window_loss"] == pytest.approx(losses, **METRIC_TOL)

    paired = paired_differences(rows, "alibi")
    assert {(p["mode"], p["length"]) for p in paired} == {(m, L) for m in ("plsh:s=2", "none") for L in lengths}
    for p in paired:
        a = next(r for r in rows if r["mode"] == p["mode"] and r["length"] == p["length"])
        b = next(r for r in rows if r["mode"] == "alibi" and r["length"] == p["length"])
        assert p["loss_diff"] == pytest.approx(a["loss_mean"] - b["loss_mean"], rel=1e-9, abs=1e-12)
        assert p["ppl_ratio"] == pytest.approx(math.exp(p["loss_diff"]))

    results = {"rows": rows, "paired": paired, "ci": {"method": "se", "level": 0.95}}
    table = format_table(results)
    assert "the same target tokens at every length" in table and "95% CI over windows" in table
    assert "perplexity ratio to alibi" in table and table.count("[") > len(rows)
    paths = write_outputs(results, tmp_path / "out", tensorboard=False)
    assert paths["plot"].stat().st_size > 0

    # Bootstrap intervals, and unaligned windows for the old behaviour.
    rows_b = evaluate_model(ck.model, ck.trained_attention, tokens,
                            EvalSettings([16, 32], "alibi", scorings=["last"], last_tokens=K, max_windows=n,
                                         progress=False, ci="bootstrap", bootstrap_resamples=300, align=False))
    assert rows_b[0]["ci"]["method"] == "bootstrap" and not rows_b[0]["aligned"]
    assert rows_b[0]["targets"] != rows_b[1]["targets"]
    with pytest.raises(ValueError, match="ci method"):
        EvalSettings([16], "alibi", ci="nope", progress=False)


def test_evaluate_launcher_defaults_to_aligned_last_tokens(tiny, tmp_path):  # noqa: F811
    from launchers.evaluate import main

    out = tmp_path / "cli"
    rc = main(["--checkpoint", str(tiny.export), "--lengths", "16,32", "--modes", "alibi,none", "--max-windows", "2",
               "--ci", "bootstrap", "--bootstrap-resamples", "200", "--reference", "alibi", "--out", str(out),
               "--no-progress"])
    assert rc == 0
    res = json.loads((out / "results.json").read_text())
    assert res["scorings"] == ["last"] and res["last_tokens"] == 8 and res["aligned"] is True
    assert res["ci"] == {"method": "bootstrap", "level": 0.95, "resamples": 200}
    assert [p["mode"] for p in res["paired"]] == ["none", "none"]
    assert len({r["targets"]["sha1"] for r in res["rows"]}) == 1
    assert main(["--checkpoint", str(tiny.export), "--lengths", "16", "--modes", "alibi", "--reference", "none",
                 "--out", str(out), "--no-progress"]) == 2  # a reference that is not evaluated
