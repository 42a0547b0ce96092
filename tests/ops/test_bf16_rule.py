"""flash-attn's bf16 rule for every attention mode on every path that runs bf16 on a CPU.

For out, dq, dk and dv: the max-abs error of the op in bf16 against an fp64
reference of the same estimator is at most ``BF16_FACTOR`` times that of a
plain bf16 computation of the estimator (bf16 matmuls, the bias and the
softmax in fp32; its gradients by autograd) against the same reference
(``experiments/bf16_rule.py`` holds the reference, the baseline and the
modes' weights). Paths: ``backend="torch"`` and ``"math"``, and the fused
Triton kernel under the interpreter with the compiled bf16 kernel's rounding
emulated. Two more tests show that the rule rejects worse ops: probabilities
rounded to fp8, and the partial gradients of query chunks rounded to bf16
before their sum (the code before this rule was applied).
"""

from __future__ import annotations

import pytest

import plsh_dist.ops.alibi as alibi_module
from experiments.bf16_rule import PATHS, Case, attention, inputs, log_weights, measure
from tests.tolerances import BF16_FACTOR

_PLSH = ("plsh_onepass", "plsh_per_sample", "fixed_blocks")
#: Truncated ALiBi with GQA: each key's gradient sums query chunks and the per-head window
#: groups of its query heads; rounding those partials to bf16 fails the rule on dv.
_ROUNDED_PARTIALS_FAIL = Case("alibi_truncated", T=512, Hq=8, Hkv=2, seed=1)


def _cases() -> list[Case]:
    """Three calls per mode and path: causal MHA; non-causal GQA at D = 128 (a shared sigma for
    the block modes); packed documents over two rows with Hkv = 1 (causal on math and Triton, not
    causal on torch). Lengths, seeds and the document layout differ between the three; the
    interpreted kernel runs shorter rows."""
    cases = []
    for mode, paths in PATHS.items():
        for path in paths:
            short = path == "triton"
            T1, T2, T3 = (128, 96, 80) if short else (512, 384, 300)
            cases += [
                Case(mode, path, T=T1, Hq=4, Hkv=4, D=64, causal=True, seed=0),
                Case(mode, path, T=T2, Hq=4, Hkv=2, D=128, causal=False, seed=1,
                     sigma=16.0 if mode in _PLSH else None),
                Case(mode, path, B=2, T=T3, Hq=4, Hkv=1, D=64, causal=path != "torch", seed=2,
                     docs=(T3 // 3, T3 - T3 // 3, T3 // 4, T3 - T3 // 4)),
            ]
    return cases + [
        Case("alibi", T=256, Hq=2, Hkv=2, seed=3, chunk=16),  # every key summed over many chunks' gradients
        _ROUNDED_PARTIALS_FAIL,
    ]


def _violations(case: Case, errors: dict[str, tuple[float, float]]) -> list[str]:
    bad = []
    for name, (err, base) in errors.items():
        assert base > 0, (case.label(), name)  # a bf16 baseline always rounds
        if err > BF16_FACTOR * base:
            bad.append(f"{name}: {err:.3g} > {BF16_FACTOR:g} x {base:.3g} (ratio {err / base:.2f})")
    return bad


def _skip_unless_interpreted(case: Case) -> None:
    if case.path != "triton":
        return
    pytest.importorskip("triton")
    from plsh_dist.ops.triton.attention import interpreting  # noqa: PLC0415

    if not interpreting():
        pytest.skip("bf16 rounding is emulated on Triton's interpreter only (TRITON_INTERPRET=1 before triton "
                    "is imported; tests/conftest.py sets it without CUDA)")


@pytest.mark.parametrize("case", _cases(), ids=Case.label)
def test_bf16_op_errs_at_most_twice_the_plain_bf16_computation(case):
    _skip_unless_interpreted(case)
    assert _violations(case, measure(case)) == []


@pytest.mark.parametrize("case", [Case("plsh_onepass", T=256, seed=4), Case("alibi_truncated", T=256, causal=False,
                                                                             Hkv=2, seed=5)], ids=Case.label)
def test_the_rule_rejects_fp8_probabilities(case):
    """The plain computation with p rounded to fp8 instead of bf16 fails on every tensor."""
    q, k, v, dout = inputs(case)
    logw, scale = log_weights(case), case.D**-0.5
    ref, base, worse = (attention(q, k, v, dout, logw, scale, p) for p in ("fp64", "bf16", "fp8_probs"))
    errors = {name: (float((w - r).abs().max()), float((b - r).abs().max()))
              for name, r, b, w in zip(("out", "dq", "dk", "dv"), ref, base, worse)}
    assert len(_violations(case, errors)) == 4, errors


def test_the_rule_rejects_partial_gradients_rounded_before_their_sum(monkeypatch):
    """ALiBi whose query chunks return dk, dv in bf16 (no ``partial``), as before the rule was
    applied: a key seen by m chunks (and head groups) is rounded m times, and dv fails."""
    dense_bwd = alibi_module.dense_bwd
    monkeypatch.setattr(alibi_module, "dense_bwd", lambda *args, partial=False, **kw: dense_bwd(*args, **kw))
    bad = _violations(_ROUNDED_PARTIALS_FAIL, measure(_ROUNDED_PARTIALS_FAIL))
    assert "dv" in [line.split(":")[0] for line in bad], bad

