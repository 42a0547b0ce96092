"""The closing ``outputs:`` line names what the run wrote, nothing it did not (the debug
config writes neither tensorboard/ nor final/)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from plsh_dist.config import load_config
from plsh_dist.train.loop import TrainResult, _outputs_line


@pytest.mark.parametrize("tensorboard,saved,final,expected", [
    (False, 1, None, "(metrics.jsonl, checkpoints/)"),
    (True, 2, "runs/x/final", "(metrics.jsonl, tensorboard/, checkpoints/, final/)"),
    (False, 0, None, "(metrics.jsonl)"),  # resumed at max_steps: nothing trained, nothing saved
])
def test_outputs_line_lists_only_what_was_written(tensorboard, saved, final, expected):
    cfg = load_config(None, [f"--logging.tensorboard={str(tensorboard).lower()}"])
    session = SimpleNamespace(cfg=cfg, out_dir="runs/x", progress=SimpleNamespace(checkpoints_written=saved))
    assert _outputs_line(session, TrainResult(final_dir=final)) == f"outputs: runs/x {expected}"
