"""backend="flex": PLSH's one pass on the compiled FlexAttention (CPU fp32, output only) against the
dense fp64 reference, its place in the table (output-only calls only), one compile per shape set.

Each new shape set compiles (seconds to a minute on a small CPU; the on-disk inductor cache
serves later runs), so the fast suite keeps one shape set and the other cases are slow."""

import pytest
import torch

from plsh_dist.hashing import PositionalLSH, alibi_slopes
from plsh_dist.ops import plsh_attention
from plsh_dist.ops.flex import strategy as plsh_flex
from plsh_dist.ops.backends import Backend, choose_strategy
from plsh_dist.ops.flex.attend import flex_status
from plsh_dist.ops.flex.strategy import FlexOnePass
from plsh_dist.ops.cpu.onepass import onepass_forward
from plsh_dist.ops.reference import dense_attention
from tests.tolerances import FP32

pytestmark = pytest.mark.skipif(flex_status("cpu") is not None, reason=f"no CPU FlexAttention: {flex_status('cpu')}")

CPU, FP32_DTYPE = torch.device("cpu"), torch.float32


def _qkv(B, T, Hq, Hkv, D=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, T, h, D, generator=g) for h in (Hq, Hkv, Hkv))


def _check(T, causal, sigma, positions, Hkv, cu_seqlens=None):
    q, k, v = _qkv(2, T, 4, Hkv)
    with torch.no_grad():
        out = plsh_attention(q, k, v, sigma=sigma, num_samples=8, seed=42, positions=positions, causal=causal,
                             backend="flex", cu_seqlens=cu_seqlens)
    assert out.dtype == q.dtype and out.shape == q.shape
    if cu_seqlens is None:
        ref = dense_attention(q, k, v, PositionalLSH(sigma, 8, 42).averaged_mask(positions), causal=causal)
    else:  # documents: the chunked one pass, itself checked against the reference with documents
        with torch.no_grad():
            ref = plsh_attention(q.double(), k.double(), v.double(), sigma=sigma, num_samples=8, seed=42,
                                 positions=positions, causal=causal, backend="torch", cu_seqlens=cu_seqlens)
    torch.testing.assert_close(out.double(), ref, **FP32)


def test_matches_dense_reference():
    """Per-head sigma, GQA, a length that is not a multiple of the 128-block, offset positions."""
    _check(97, True, alibi_slopes(4).reciprocal() * 2, torch.arange(97) + 123_457, Hkv=2)


@pytest.mark.slow
@pytest.mark.parametrize("causal,per_head,gapped,Hkv", [(False, True, True, 2), (True, False, False, 4),
                                                        (False, False, False, 1)])
def test_matches_dense_reference_more_cases(causal, per_head, gapped, Hkv):
    T = 300  # three blocks: full, partial and skipped key blocks
    sigma = alibi_slopes(4).reciprocal() * 4 if per_head else 9.0
    _check(T, causal, sigma, torch.arange(T) * (3 if gapped else 1) + 5, Hkv)


@pytest.mark.slow
def test_documents_match_the_chunked_one_pass():
    positions = torch.cat([torch.arange(40), torch.arange(57)])
    _check(97, True, alibi_slopes(4).reciprocal() * 2, positions.repeat(2).view(2, 97), Hkv=2,
           cu_seqlens=torch.tensor([0, 40, 97, 137, 194]))


def test_a_new_hash_of_the_same_shapes_reuses_the_compiled_graph():
    from torch._dynamo.utils import counters

    q, k, v = _qkv(2, 97, 4, 2)
    sigma = alibi_slopes(4).reciprocal() * 2
    with torch.no_grad():
        plsh_attention(q, k, v, sigma=sigma, num_samples=8, seed=1, backend="flex")
        graphs = counters["stats"]["unique_graphs"]
        plsh_attention(q, k, v, sigma=sigma * 3, num_samples=8, seed=2, backend="flex")
    assert counters["stats"]["unique_graphs"] == graphs


def test_past_the_recompile_limit_new_shapes_run_the_chunked_one_pass(monkeypatch, caplog):
    """Dynamo would run FlexAttention eagerly (dense scores) past its limit: the strategy does not let it."""
    import torch._dynamo

    from torch._dynamo.utils import counters

    monkeypatch.setattr(plsh_flex, "_COMPILED", set())
    plsh_flex._say_once.cache_clear()
    q, k, v = _qkv(1, 50, 2, 2)
    lsh = PositionalLSH(alibi_slopes(2).reciprocal(), 4, 0)
    graphs = counters["stats"]["unique_graphs"]
    with caplog.at_level("WARNING"), torch._dynamo.config.patch(recompile_limit=0):
        out = FlexOnePass().attend(q, k, v, lsh, torch.arange(50), causal=True, scale=0.25)
    assert counters["stats"]["unique_graphs"] == graphs
    assert torch.equal(out, onepass_forward(q, k, v, lsh, torch.arange(50), causal=True, scale=0.25)[0])
    assert any("recompile limit" in r.getMessage() for r in caplog.records)


def test_other_flexattention_users_do_not_take_the_paths_compiles(monkeypatch, recwarn):
    """The strategy compiles its own function: a benchmark's FlexAttention graphs in the same process
    do not count against the strategy's recompile limit (else dynamo runs it eagerly, dense)."""
    import torch._dynamo

    from plsh_dist.ops.flex.attend import alibi_band, alibi_score_mod, band_block_mask, flex_attend

    torch._dynamo.reset()
    monkeypatch.setattr(plsh_flex, "_COMPILED", set())
    q, k, v = _qkv(1, 64, 2, 2)
    with torch.no_grad(), torch._dynamo.config.patch(recompile_limit=1):
        flex_attend(q, k, v, alibi_score_mod(alibi_slopes(2)), band_block_mask(*alibi_band(64, None, True, "cpu")))
        out = plsh_attention(q, k, v, sigma=4.0, num_samples=2, seed=0, backend="flex")
    assert not [w for w in recwarn if "without torch.compile" in str(w.message)]
    ref = dense_attention(q, k, v, PositionalLSH(4.0, 2, 0).averaged_mask(torch.arange(64)))
    torch.testing.assert_close(out.double(), ref, **FP32)


@pytest.mark.parametrize("grad,return_lse", [(True, False), (False, True)])
def test_calls_that_need_gradients_or_the_lse_are_refused_by_name(grad, return_lse):
    q, k, v = _qkv(1, 16, 2, 2)
    q.requires_grad_(grad)
    with pytest.raises(ValueError, match="backend='flex' needs CPU fp32 tensors.*neither gradients nor the "
                                         "log-sum-exp"):
        plsh_attention(q, k, v, sigma=4.0, num_samples=2, seed=0, backend="flex", return_lse=return_lse)


def test_the_table_offers_flex_to_output_only_calls_and_auto_never_picks_it():
    assert choose_strategy("flex", "auto", CPU, FP32_DTYPE, 8, out_only=True) == FlexOnePass()
    assert choose_strategy("flex", "onepass", CPU, FP32_DTYPE, 1, out_only=True) == FlexOnePass()
    for out_only in (True, False):
        assert not isinstance(choose_strategy("auto", "auto", CPU, FP32_DTYPE, 8, out_only=out_only), FlexOnePass)
    for kw in (dict(device=CPU, dtype=torch.bfloat16, out_only=True), dict(device=CPU, dtype=FP32_DTYPE),
               dict(device=torch.device("cuda"), dtype=FP32_DTYPE, out_only=True)):
        with pytest.raises(ValueError, match="backend='flex' needs"):
            choose_strategy(Backend.FLEX, "auto", kw.pop("device"), kw.pop("dtype"), 8, **kw)
    with pytest.raises(ValueError, match="has no method='per_sample'"):
        choose_strategy("flex", "per_sample", CPU, FP32_DTYPE, 8, out_only=True)
