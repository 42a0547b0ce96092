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

# AOTAutograd runs the layers' aten decompositions: sums in another order than eager's modules
# (measured: losses within 1e-6 relative, gradient norms within 1e-5 over 4 steps).
COMPILED_REL = 1e-4


def test_compiled_layers_train_as_eager(tiny_data, tmp_path):
    eager, compiled = run_training(
        1, base_overrides(tiny_data, tmp_path / "eager"),
        base_overrides(tiny_data, tmp_path / "compiled", "--run.compile=aot_eager"))
    assert len(compiled["losses"]) == 4
    for key in ("losses", "grad_norms", "val_loss"):
        assert compiled[key] == pytest.approx(eager[key], rel=COMPILED_REL), key
