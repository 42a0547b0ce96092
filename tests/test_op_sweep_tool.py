"""tools/op_sweep.py's comparison: equal results pass, one element one ulp off, another dtype or a
missing tensor is caught (the sweep itself is run by hand: ``python tools/op_sweep.py``)."""

import torch

from tools.op_sweep import compare_results


def _results():
    g = torch.Generator().manual_seed(0)
    return {
        "ops/a:out": torch.randn(2, 3, generator=g),
        "ops/a:lse": torch.randn(3, generator=g, dtype=torch.float64),
        "model/b:logits": torch.randn(4, generator=g),
    }


def test_equal_results_pass():
    saved, current = _results(), _results()
    lines, ok = compare_results(saved, current)
    assert ok
    assert lines == ["ops/a: equal", "model/b: equal"]


def test_one_ulp_is_a_difference():
    saved, current = _results(), _results()
    x = current["ops/a:out"]
    x[1, 2] = torch.nextafter(x[1, 2], torch.tensor(float("inf")))
    assert x[1, 2] != saved["ops/a:out"][1, 2]
    lines, ok = compare_results(saved, current)
    assert not ok
    assert lines[0].startswith("ops/a: DIFFERS: out max abs diff") and lines[1:] == ["model/b: equal"]


def test_dtype_and_missing_are_differences():
    saved, current = _results(), _results()
    current["ops/a:lse"] = current["ops/a:lse"].float()
    del current["model/b:logits"]
    lines, ok = compare_results(saved, current, ["ops/a", "model/b"])
    assert not ok
    assert lines == ["ops/a: DIFFERS: lse dtype torch.float64 -> torch.float32", "model/b: missing"]
