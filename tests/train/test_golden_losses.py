"""The debug flavor reproduces its golden losses on any x86-64 CPU (torchtitan's regression guard).

configs/debug.toml (the quickstart model on a 60-file corpus, fp32, 5 steps) is
trained in one CPU process from a fresh corpus and tokenizer, once per PLSH
method; its per-step losses, pre-clip gradient norms and validation loss must
equal tests/train/golden/debug_losses.json to GOLDEN_REL. A change that is not meant
to alter the computation passes; one that is (new init, hash, data order,
optimizer) must regenerate the file: ``python tests/train/golden/regenerate.py``.

Why a tolerance, and why so small: the runs pin torch's CPU code paths
(``plsh_dist.cpu_paths``: ATen's AVX2 kernels, MKL's COMPATIBLE branch, oneDNN
up to AVX2, one thread) and train with the fused AdamW (foreach AdamW's MKL
vector sqrt follows the CPU model). Measured (results/cpu_paths/README.md):
unpinned, the code paths torch picks by itself move the step-4 gradient norm by
up to 1.8e-5 relative on one AMD EPYC (the earlier golden file failed by 1.1e-5
on it); pinned, every forced capability and AVX-512 hidden from glibc and MKL
give the same bits, and an emulated Intel Haswell (QEMU user mode) gives the
same losses and gradient norms within 2.9e-7 relative. GOLDEN_REL is 10x that
spread: 6x below the unpinned spread, 300x below the smallest deliberate change.
On one machine the run is deterministic: ``regenerate.py --check`` asks for the
same bits (exit 1 otherwise). The file records the code paths; where a CPU
cannot run them (no AVX2), or under another Python (the stdlib is the corpus),
sentencepiece (the tokenizer) or torch, the test skips and says why.

The two methods compute one estimator from the same hash masks in other orders
of fp32 sums; their runs differ by up to 1.1e-5 relative over the 5 steps
(Adam amplifies the last bits), so they are compared with METHODS_REL. Small
deliberate changes move the figures 100x more (largest relative loss change:
hash seeding (fixed_masks) 1e-3, data order (data.seed) 2.5e-2); both are
checked below so the test is known to fail when it should.

bf16 (the golden file's "bf16" section; ``BF16_RUNS``): the same run with
``precision = "bf16"`` at ZeRO 0, 1, 2 and 3 and with bf16 master weights, each
pinned to BF16_GOLDEN_REL. These runs do not clip gradients: clipping scales
each update by DeepSpeed's square root of the norm, the one CPU-dependent bit
of the pinned fp32 run, and in bf16 the updated weights round to other bf16
values, so a one-ulp change of the clip coefficient (``grad_clip`` 1 +- 1 ulp,
run natively, ``experiments/clip_ulp.py``) moves the bf16 losses by up to 6.5e-5
and the gradient norms by 1.2% within 5 steps (fp32: 6.6e-8 and 6e-7, as
across CPUs): a tolerance above that would not catch 1e-3 with a margin. Unclipped, that
square root only reaches the logged norm (one ulp, 1.2e-7); every op and two
optimizer steps of bf16 weights give the same bits pinned on an emulated
Intel Haswell as here (``experiments/cpu_paths.py``, results/cpu_paths/bf16),
so the fp32 tolerance holds. Unclipped, ZeRO 0-3 give bit-equal losses. A
deliberate change of 1e-3 (the hash's seeding) is caught.
"""

from __future__ import annotations

import pytest

from tests.train.golden.debug_run import (BF16_RUNS, MUST_MATCH, REGENERATE, environment, load_golden,
                                          pinned_environment, prepare_debug_data, record, run_debug)

GOLDEN_REL = 3e-6  # pinned runs across CPU models: 2.9e-7 measured (module doc)
BF16_GOLDEN_REL = GOLDEN_REL  # the bf16 runs, unclipped: their only CPU-dependent bit is the logged norm's (module doc)
METHODS_REL = 5e-5  # one pass against per sample: 1.1e-5 measured, with room for other configs' orders


def _rel_diff(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) / abs(y) for x, y in zip(a, b))


def _golden_or_skip() -> dict:
    golden = load_golden()
    env = environment()
    different = {k: (golden["environment"][k], env[k]) for k in MUST_MATCH if golden["environment"][k] != env[k]}
    if different:
        pytest.skip(f"golden losses were made under {different} (golden, here); regenerate with {REGENERATE}")
    return golden


def test_debug_config_reproduces_the_golden_losses(tmp_path):
    golden = _golden_or_skip()

    with pinned_environment():
        prepare_debug_data(tmp_path)
        # The golden run, both PLSH methods by name, and two deliberate changes the test must catch.
        run, onepass, per_sample, other_data_order, other_hash_seeds = run_debug(
            1, tmp_path, [], ["--attention.method=onepass"], ["--attention.method=per_sample"], ["--data.seed=1"],
            ["--attention.fixed_masks=true"])
    if run["cpu_paths"] != golden["cpu_paths"]:
        pytest.skip(f"this CPU runs torch's code paths {run['cpu_paths']}, the golden file's are "
                    f"{golden['cpu_paths']} (plsh_dist.cpu_paths pins them on x86-64 CPUs with AVX2)")

    assert len(run["losses"]) == 5 and run["losses"][-1] < run["losses"][0]  # the pinned run trains
    assert record(onepass) == record(run)  # on CPU the default method is the one pass, same bits
    for name, now, pinned in (("default", run, golden), ("per_sample", per_sample, golden["per_sample"])):
        for key in ("losses", "grad_norms", "val_loss"):
            assert now[key] == pytest.approx(pinned[key], rel=GOLDEN_REL), (
                f"{name} {key}: {now[key]} against the golden {pinned[key]}; regenerate if intended: {REGENERATE}")
    for key in ("losses", "grad_norms"):
        assert _rel_diff(per_sample[key], run[key]) < METHODS_REL, key

    assert _rel_diff(other_data_order["losses"], golden["losses"]) > 10 * METHODS_REL
    assert _rel_diff(other_hash_seeds["losses"], golden["losses"]) > 10 * METHODS_REL


def test_debug_config_reproduces_the_golden_bf16_losses(tmp_path):
    """bf16 at every ZeRO stage and with bf16 master weights: the pinned runs, within BF16_GOLDEN_REL
    (module doc of this file's bf16 part: ``BF16_GOLDEN_REL``), and a deliberate change of 1e-3
    (the hash's seeding) is caught."""
    golden = _golden_or_skip()["bf16"]
    with pinned_environment():
        prepare_debug_data(tmp_path)
        *runs, other_hash_seeds = run_debug(1, tmp_path, *BF16_RUNS.values(),
                                            [*BF16_RUNS["zero1"], "--attention.fixed_masks=true"])
    if runs[0]["cpu_paths"] != golden["cpu_paths"]:
        pytest.skip(f"this CPU runs torch's code paths {runs[0]['cpu_paths']}, the golden file's are "
                    f"{golden['cpu_paths']}")
    for name, run in zip(BF16_RUNS, runs):
        assert len(run["losses"]) == 5 and run["losses"][-1] < run["losses"][0], name
        for key in ("losses", "grad_norms", "val_loss"):
            assert run[key] == pytest.approx(golden[name][key], rel=BF16_GOLDEN_REL), (
                f"bf16 {name} {key}: {run[key]} against the golden {golden[name][key]}; regenerate if intended: "
                f"{REGENERATE} --only bf16")
    assert _rel_diff(other_hash_seeds["losses"], golden["zero1"]["losses"]) > 5 * BF16_GOLDEN_REL
