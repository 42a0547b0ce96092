"""The quickstart model's first losses do not depend on how the job is sharded.

configs/debug.toml (quickstart model, 128 tokens, global batch 4, fp32, 5
steps) in 4 spawned ranks as SP = 4, SP = 2 x DP = 2 and SP = 1 x DP = 4 under
ZeRO 1, and SP = 2 x DP = 2 under ZeRO 2 and 3, against the same config in one
process. The global batch stays 4 sequences (micro_batch_size = 4 / DP): the
sampler deals one global order round-robin to DP ranks, so every layout sees
the same sequences each step. tests/train/test_equivalence.py covers SP 1 vs 2
and ZeRO 0-3 on a smaller model in 2 ranks; this extends it to 4 ranks, SP = 4,
the quickstart model and its per-head sigmas (blocks crossing several chunks).

Tolerance 1e-5 relative, as in test_equivalence.py: the layouts sum the same
fp32 terms in different orders (SP splits attention and the loss over ranks,
DP and ZeRO reduce gradients over 4 ranks in partitions); measured differences
are <= 1e-7 (measured), while a wrong loss scale or a lost halo moves them by > 1e-3.
Gradient norms: 1e-4 relative. A gradient entry is a sum of many terms of both
signs, so reordering it costs more relative precision than the loss (measured
up to 1.04e-5 at step 4 for SP = 4 and ZeRO 2), and each Adam step's division
by sqrt(v) carries the earlier steps' differences into the weights; an error in
the gradient reduction or scaling is a factor (2x, 1/4x), far outside 1e-4.
"""

from __future__ import annotations

import pytest

from tests.train.golden.debug_run import prepare_debug_data, run_debug

REL = 1e-5
REL_GRAD_NORM = 1e-4

LAYOUTS = {
    "sp4 zero1": ["--parallel.sp_size=4", "--data.micro_batch_size=4"],
    "sp2 dp2 zero1": ["--parallel.sp_size=2", "--data.micro_batch_size=2"],
    "sp1 dp4 zero1": ["--parallel.sp_size=1", "--data.micro_batch_size=1"],
    "sp2 dp2 zero2": ["--parallel.sp_size=2", "--data.micro_batch_size=2", "--deepspeed.zero_stage=2"],
    "sp2 dp2 zero3": ["--parallel.sp_size=2", "--data.micro_batch_size=2", "--deepspeed.zero_stage=3"],
}


@pytest.mark.slow
def test_first_losses_are_the_same_for_every_layout_and_zero_stage(tmp_path):
    prepare_debug_data(tmp_path)
    (reference,) = run_debug(1, tmp_path, [])
    results = run_debug(4, tmp_path, *LAYOUTS.values())
    table = {name: (_rel_diff(res["losses"], reference["losses"]),
                    _rel_diff(res["grad_norms"], reference["grad_norms"]))
             for name, res in zip(LAYOUTS, results)}
    for name, (loss_diff, norm_diff) in table.items():
        assert loss_diff <= REL, (name, table)
        assert norm_diff <= REL_GRAD_NORM, (name, table)
    assert all(len(res["losses"]) == 5 for res in results)


def _rel_diff(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b)
    return max(abs(x - y) / abs(y) for x, y in zip(a, b))
