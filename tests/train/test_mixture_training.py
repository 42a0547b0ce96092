"""Training on a weighted mixture of sources ([data].sources): it runs, reports each source, and a
stopped run resumes exactly (the draw and every source's position follow from the global position)."""

from __future__ import annotations

import json

from tests.train.conftest import base_overrides
from tests.train.spawn import run_training


def _two_sources(tiny_data, tmp_path) -> list[str]:
    """The tiny corpus's training documents split into two sources (every other document), weights 3:1,
    the first with the corpus's validation file."""
    train = next(o for o in tiny_data if o.startswith("--data.train_files="))[len("--data.train_files=['"):-2]
    val = next(o for o in tiny_data if o.startswith("--data.val_files="))[len("--data.val_files=['"):-2]
    lines = open(train).read().splitlines()
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text("\n".join(lines[0::2]) + "\n")
    b.write_text("\n".join(lines[1::2]) + "\n")
    data = [o for o in tiny_data if not o.startswith(("--data.train_files=", "--data.val_files="))]
    return data + [f"--data.sources=[{{name='even', train_files=['{a}'], weight=3, val_files=['{val}']}}, "
                   f"{{name='odd', train_files=['{b}'], weight=1}}]"]


def test_a_mixture_trains_reports_its_sources_and_resumes_exactly(tiny_data, tmp_path):
    import pytest

    from plsh_dist.train.validation import exported_validation

    data = _two_sources(tiny_data, tmp_path)
    common = ["--checkpoint.keep_last=0", "--attention.bias=plsh", "--attention.num_samples=2", "--data.seq_len=32",
              "--parallel.sp_size=2", "--data.micro_batch_size=4", "--checkpoint.export_safetensors=true"]
    full, _, resumed = run_training(
        2, base_overrides(data, tmp_path / "full", *common), base_overrides(data, tmp_path / "cut", *common),
        base_overrides(data, tmp_path / "cut", *common, "--checkpoint.resume=auto"), stop_after=[None, 2, None])
    assert resumed["first_step"] == 2 and resumed["losses"] == full["losses"][2:]  # same shape: bit for bit
    assert resumed["val_loss"] == full["val_loss"]

    state = json.loads((tmp_path / "cut" / "checkpoints" / "step_00000002" / "trainer_state.json").read_text())
    sources = state["sources"]
    assert list(sources) == ["even", "odd"]
    assert sum(p["sequences"] for p in sources.values()) == state["consumed_sequences"] == 2 * 4
    last = [json.loads(line) for line in (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()][-1]
    assert {"val_loss", "val_loss/even", "val_loss/odd"} <= set(last)
    assert min(last["val_loss/even"], last["val_loss/odd"]) <= last["val_loss"] <= max(last["val_loss/even"],
                                                                                         last["val_loss/odd"])
    # The export validates as the run did: each source's batches (1e-5: one process sums in another order).
    assert exported_validation(tmp_path / "full" / "final")["val_loss"] == pytest.approx(full["val_loss"], rel=1e-5)
