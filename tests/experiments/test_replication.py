"""The replication launcher's grid and overrides, the report's statistics (mean ± std over
training seeds, paired ratios to the reference), and (slow) the --smoke run end to end."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from experiments import replicate
from experiments.replication_report import _check_reused, format_report, replication_lengths, reusable_runs, summarize


def test_the_protocol_grid():
    modes = replicate._modes()
    assert len(modes) == 24 and len(replicate.BUDGETS["full"]["modes"]) == 18  # the paper's grid: no trunc_*
    assert set(modes) - set(replicate.BUDGETS["full"]["modes"]) == {f"trunc_s{s}_{t}" for s in (8, 20, 100)
                                                                     for t in "hc"}
    assert modes["trunc_s20_h"][0] == ["--attention.bias=truncated", "--attention.num_samples=20"]
    assert "--attention.sigma={sigma}" in modes["trunc_s8_c"][0]
    assert modes["rope"][0] == ["--attention.bias=none", "--attention.rope=true"]
    assert "--attention.rope=false" in modes["nope"][0]
    plsh = {k: v for k, v in modes.items() if k.startswith("plsh")}
    assert len(plsh) == 12 and all("--attention.method=onepass" in v[0] for v in plsh.values())
    assert {k.split("_")[1] for k in plsh} == {"s8", "s20", "s100"}
    assert "--attention.sampler=stratified" in modes["plsh_s20_strat_c"][0]
    assert "--attention.sampler=stratified_ramp" in replicate._modes("stratified_ramp")["plsh_s8_strat_h"][0]
    assert not any("sigma" in o for o in modes["alibi_h"][0]) and "--attention.sigma={sigma}" in modes["fixed_c"][0]
    assert replication_lengths(128) == [128, 256, 512, 1024]


def test_run_overrides(tmp_path):
    args = replicate._parse(["--prose-dir", str(tmp_path / "prose"), "--sigma", "64"])
    assert (args.train_len, args.steps, args.batch, args.jobs) == (128, 100, 4, 2)
    assert args.seed_list == [0, 1, 2] and args.corpus_list == ["prose", "code"] and len(args.mode_list) == 18
    o = replicate.train_overrides(args, "plsh_s100_iid_c", 2, "prose", tmp_path / "run")
    assert "--attention.sigma=64.0" in o and "--run.seed=2" in o and "--data.seed=2" in o
    assert f"--data.train_files={json.dumps([str(tmp_path / 'prose' / 'train.jsonl')])}" in o
    assert any(x.endswith("replicate_prose_bpe2k.model") for x in o)
    code = replicate.train_overrides(args, "rope", 1, "code", tmp_path / "run")
    # The code corpus is files too, written once with seed 0: the training seed does not move its split.
    assert "--data.train_files=[\"data_cache/replicate_code_corpus/train.jsonl\"]" in code
    smoke = replicate._parse(["--smoke"])
    assert (smoke.train_len, smoke.steps, smoke.corpus_list, smoke.seed_list) == (32, 4, ["code"], [0])
    with pytest.raises(SystemExit):
        replicate._parse(["--modes", "alibi,bogus"])


def _row(corpus, mode, seed, length, losses):
    losses = list(losses)
    mean = float(np.mean(losses))
    return {"corpus": corpus, "mode": mode, "train_seed": seed, "length": length, "window_loss": losses,
            "loss_mean": mean, "perplexity_mean": math.exp(mean), "perplexity_std": 0.0,
            "perplexity_ci": [math.exp(mean - 0.1), math.exp(mean + 0.1)], "targets": {"sha1": f"t{length}"},
            "windows": len(losses), "scored_per_window": 8}


def test_summary_statistics_and_report():
    rows = []
    for seed, shift in ((0, 0.0), (1, 0.2)):
        for L in (16, 32):
            ref = np.array([3.0, 3.2, 2.9, 3.1]) + shift
            rows.append(_row("code", "alibi_h", seed, L, ref))
            rows.append(_row("code", "plsh_s8_iid_h", seed, L, ref + np.array([0.05, 0.03, 0.04, 0.06])))
    summary = summarize(rows, "alibi_h")
    cell = {(r["mode"], r["length"]): r for r in summary}
    a = cell["alibi_h", 16]
    ppl = [math.exp(3.05), math.exp(3.25)]
    assert a["perplexity_mean"] == pytest.approx(np.mean(ppl))
    assert a["perplexity_std"] == pytest.approx(np.std(ppl, ddof=1))
    assert "ratio_to_reference" not in a
    p = cell["plsh_s8_iid_h", 32]
    assert p["ratio_to_reference"] == pytest.approx(math.exp(0.045)) and p["ratio_seeds"] == 2
    assert p["ratio_ci"][0] < p["ratio_to_reference"] < p["ratio_ci"][1]
    md = format_report({"summary": summary, "reference": "alibi_h", "settings": {
        "train_len": 16, "steps": 4, "batch": 2, "sigma": 32.0, "eval_seeds": "0", "seeds": "0,1", "command": "x"}})
    assert "### code corpus" in md and "L=32 (2x)" in md and "Perplexity ratio to alibi_h" in md
    assert f"{math.exp(0.045):.3f}" in md and " ± " in md


def test_a_report_is_read_again_against_another_reference(tmp_path, capsys):
    from experiments.replication_report import main

    rows = []
    for seed in (0, 1):
        ref = np.array([3.0, 3.2, 2.9, 3.1]) + 0.1 * seed
        rows += [_row("prose", "alibi_h", seed, 16, ref), _row("prose", "plsh_s8_iid_h", seed, 16, ref + 0.04),
                 _row("prose", "trunc_s8_h", seed, 16, ref + 0.01)]
    report = tmp_path / "replication.json"
    report.write_text(json.dumps({"rows": rows, "settings": {
        "train_len": 16, "steps": 4, "batch": 2, "sigma": 32.0, "eval_seeds": "0", "seeds": "0,1", "command": "x"}}))
    assert main([str(report), "--reference", "plsh_s8_iid_h", "--modes", "trunc_s8_h"]) == 0
    table = capsys.readouterr().out
    assert "ratio to plsh_s8_iid_h" in table and f"| trunc_s8_h | {math.exp(-0.03):.3f} [" in table
    assert "alibi_h" not in table.split("Settings")[0]
    with pytest.raises(SystemExit):
        main([str(report), "--reference", "bogus"])


def test_a_report_is_reused_only_under_its_own_protocol(tmp_path):
    settings = vars(replicate._parse(["--prose-dir", "data_cache/jargon_corpus"]))
    settings["config"] = "configs/quickstart.toml"
    prior = {"settings": dict(settings), "runs": {"prose/alibi_h/seed0": {}, "prose/plsh_s8_iid_h/seed3": {}}}
    assert reusable_runs(prior, settings) == {("prose", "alibi_h", 0), ("prose", "plsh_s8_iid_h", 3)}
    # Seeds, modes and the command may differ: they choose runs, not how a run is made.
    assert reusable_runs(prior, {**settings, "seeds": "5", "modes": "trunc_s8_h", "command": "y"})
    with pytest.raises(ValueError, match=r"steps: report 100, now 300.*eval_windows: report 8, now 32"):
        reusable_runs(prior, {**settings, "steps": 300, "eval_windows": 32})


def test_a_reused_run_must_evaluate_to_the_report_bit_for_bit():
    row = {"length": 256, "eval_mode": "alibi", "scoring": "last", "window_loss": [5.1, 5.2]}
    _check_reused([dict(row)], [dict(row)], ("prose", "alibi_h", 0))
    with pytest.raises(ValueError, match="prose/alibi_h/0 trained and evaluated again"):
        _check_reused([{**row, "window_loss": [5.1, 5.2000001]}], [row], ("prose", "alibi_h", 0))


@pytest.mark.slow
def test_replicate_smoke_end_to_end(tmp_path):
    out, res = tmp_path / "runs", tmp_path / "results"
    assert replicate.main(["--smoke", "--out", str(out), "--results", str(res)]) == 0
    results = json.loads((res / "replication.json").read_text())
    assert {r["mode"] for r in results["summary"]} == {"nope", "alibi_h", "plsh_s8_iid_h"}
    assert len({r["targets"]["sha1"] for r in results["rows"]}) == 1  # the same tokens: every length, every mode
    assert (res / "replication.png").stat().st_size > 0 and "ratio to alibi_h" in (res / "replication.md").read_text()
    assert Path(out / "code" / "nope" / "seed0" / "final" / "model.safetensors").is_file()
