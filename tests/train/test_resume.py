"""A stopped run resumes from its checkpoint and replays the uninterrupted run exactly.

Exact equality (no tolerance): same data order (sampler position from the
step), same hash seeds (from the step), restored optimizer and scheduler, and
the same arithmetic in the same order, so every float must be identical.
"""

from __future__ import annotations

import json

from tests.train.conftest import base_overrides
from tests.train.spawn import run_training


def test_resume_replays_the_uninterrupted_run(tiny_data, tmp_path):
    common = ["--attention.bias=plsh", "--attention.num_samples=2", "--run.max_steps=5", "--checkpoint.keep_last=0",
              "--deepspeed.zero_stage=1", "--parallel.sp_size=2", "--checkpoint.export_safetensors=true"]
    full_dir, cut_dir = tmp_path / "full", tmp_path / "cut"
    full, stopped, resumed = run_training(
        2,
        base_overrides(tiny_data, full_dir, *common),
        base_overrides(tiny_data, cut_dir, *common),
        base_overrides(tiny_data, cut_dir, *common, "--checkpoint.resume=auto"),
        stop_after=[None, 2, None],
    )
    assert all(r["config_unchanged"] for r in (full, stopped, resumed))  # train() never writes into its config
    assert stopped["losses"] == full["losses"][:2]
    assert resumed["first_step"] == 2
    assert resumed["losses"] == full["losses"][2:]
    assert resumed["val_loss"] == full["val_loss"]

    # Outputs: one metrics record per step, checkpoints with config + tokenizer, safetensors export.
    steps = [json.loads(line)["step"] for line in (cut_dir / "metrics.jsonl").read_text().splitlines()
             if "loss" in json.loads(line)]
    assert steps == [1, 2, 3, 4, 5]
    for tag in ("step_00000002", "step_00000005"):
        ckpt = cut_dir / "checkpoints" / tag
        assert (ckpt / "config.resolved.toml").is_file() and (ckpt / "tokenizer.model").is_file()
        assert json.loads((ckpt / "trainer_state.json").read_text())["step"] == int(tag[5:])
    assert (cut_dir / "final" / "model.safetensors").is_file()


def test_exported_weights_reproduce_the_validation_loss(tiny_data, tmp_path):
    """Train with SP=2 under ZeRO-3, export, reload in one process: same validation loss.

    Tolerance 1e-5 relative: the single process sums the loss over the whole
    sequence, the SP run over two chunks (fp32 reduction order only).
    """
    import pytest

    from plsh_dist.train.validation import exported_validation

    out = tmp_path / "z3"
    (res,) = run_training(2, base_overrides(tiny_data, out, "--attention.bias=plsh", "--attention.num_samples=2",
                                            "--deepspeed.zero_stage=3", "--parallel.sp_size=2", "--run.max_steps=3",
                                            "--checkpoint.export_safetensors=true"))
    ev = exported_validation(out / "final")
    assert ev["val_loss"] == pytest.approx(res["val_loss"], rel=1e-5)
