"""``[run].compile``: each decoder layer compiled on its own (torchtitan's per-block compile) trains
as eager does.

The compiled run uses ``aot_eager``: dynamo and AOTAutograd trace every layer into one graph
(``fullgraph=True``, so a graph break fails the run) with the attention custom op's fake kernel
and autograd formula, as inductor would see them, without inductor's C++ code generation
(tens of seconds per graph on a CPU; ``tests/models/test_compile.py`` runs inductor on one
layer). The tiny run packs documents (``cu_seq_lens`` reach the op) and draws fresh PLSH masks
every step (the seed is an input of the graph, not a constant).
"""

from __future__ import annotations

import pytest

from tests.train.conftest import base_overrides
from tests.train.spawn import run_training

# Measured (torch 2.13, CPU): aot_eager gives eager's losses, gradient norms and validation loss to
# the bit; the tolerance leaves room for AOTAutograd decomposing an op in another summation order
# (GOLDEN_REL of the golden-loss test is 3e-6 for the same reason across CPUs).
COMPILED_REL = 1e-6


def test_compiled_layers_train_as_eager(tiny_data, tmp_path):
    eager, compiled = run_training(
        1, base_overrides(tiny_data, tmp_path / "eager"),
        base_overrides(tiny_data, tmp_path / "compiled", "--run.compile=aot_eager"))
    assert len(compiled["losses"]) == 4
    for key in ("losses", "grad_norms", "val_loss"):
        assert compiled[key] == pytest.approx(eager[key], rel=COMPILED_REL), key


def test_compiled_checkpointed_layers_train_as_eager(tiny_data, tmp_path):
    """``[run].compile`` with activation checkpointing (the checkpoint inside each compiled layer),
    full and selective, gives the eager run's losses (measured: to the bit); eager selective gives
    them exactly. Two micro-steps per step: each draws its own masks, which its recompute must draw
    again."""
    ac = ["--memory.activation_checkpointing=true", "--optim.grad_accum_steps=2"]
    eager, *checkpointed = run_training(
        1, base_overrides(tiny_data, tmp_path / "eager", "--optim.grad_accum_steps=2"),
        base_overrides(tiny_data, tmp_path / "full", "--run.compile=aot_eager", *ac),
        base_overrides(tiny_data, tmp_path / "selective", "--run.compile=aot_eager", *ac,
                       "--memory.activation_checkpointing_mode=selective"),
        base_overrides(tiny_data, tmp_path / "eager_selective", *ac,
                       "--memory.activation_checkpointing_mode=selective"))
    for run in checkpointed:
        assert len(run["losses"]) == 4
        for key in ("losses", "grad_norms", "val_loss"):
            assert run[key] == pytest.approx(eager[key], rel=COMPILED_REL), key
    assert [checkpointed[-1][key] for key in ("losses", "grad_norms")] == [eager["losses"], eager["grad_norms"]]


def test_compiled_sequence_parallel_layers_train_as_eager(tiny_data, tmp_path):
    """``[run].compile`` under sequence parallelism (2 ranks, the attention's collectives inside its
    custom op) with activation checkpointing and packed documents gives the eager SP run's losses."""
    sp = ["--parallel.sp_size=2", "--memory.activation_checkpointing=true", "--data.document_masking=true"]
    eager, compiled = run_training(
        2, base_overrides(tiny_data, tmp_path / "eager", *sp),
        base_overrides(tiny_data, tmp_path / "compiled", "--run.compile=aot_eager", *sp))
    assert len(compiled["losses"]) == 4
    for key in ("losses", "grad_norms", "val_loss"):
        assert compiled[key] == pytest.approx(eager[key], rel=COMPILED_REL), key
