"""experiments/flex_cpu.py at a toy length: every bias by both sides, outputs that agree, the table."""

import json

import pytest

from experiments import flex_cpu
from plsh_dist.ops.flex.attend import flex_status


@pytest.mark.slow  # four FlexAttention compiles (seconds each from the on-disk cache, a minute cold)
@pytest.mark.skipif(flex_status("cpu") is not None, reason="no CPU FlexAttention here")
def test_toy_run_compares_every_bias(tmp_path):
    assert flex_cpu.main(["--lengths", "256", "--heads", "4", "--head-dim", "32", "--repeats", "1",
                          "--out", str(tmp_path)]) == 0
    records = json.loads((tmp_path / "results.json").read_text())["records"]
    assert {(r["bias"], r["method"]) for r in records} == {
        ("alibi", "ours"), ("alibi", "flex"), ("truncated_s8", "ours"), ("truncated_s8", "flex"),
        ("plsh_s8", "ours"), ("plsh_s8", "flex"), ("plsh_s8", "flex_hash")}
    for r in records:
        if r["method"] != "ours":
            assert r["max_abs_diff_vs_ours"] < 1e-5 and r["speedup_vs_ours"] > 0
    assert (tmp_path / "table.md").read_text().count("\n| 256 |") == 4
