"""What reaches the op: layout, global positions, scale, seed, sigma/slopes; and
which functions compute (the single-process ops unless a sequence-parallel group is set)."""

import pytest
import torch

import plsh_dist.biases.alibi as alibi_bias
from plsh_dist.distributed.sp import attention as sp_attention
from plsh_dist.hashing import alibi_slopes
from plsh_dist.models import (
    AttentionConfig, AttentionRuntime, apply_sequence_parallel, attention_modules, build_model, hash_seed, presets,
    set_attention_mode,
)

SP_GROUP = object()  # stands for a torch.distributed group: bound once, never called here

#: What the biases call under sequence parallelism: the blocks of a hash (PLSH and fixed blocks take the hash
#: object whole), ALiBi with or without a window, plain causal attention.
SP_FUNCTIONS = ("block_attention", "alibi_attention", "causal_attention")


def _record_sp_calls(monkeypatch) -> list:
    """Replace the sequence-parallel functions by recorders: (name, q shape, k shape, kwargs) per call."""
    calls = []
    for name in SP_FUNCTIONS:
        def op(q, k, v, *hash_, _name=name, **kwargs):
            calls.append((_name, q.shape, k.shape, dict(kwargs, lsh=hash_[0]) if hash_ else kwargs))
            return torch.zeros_like(q)
        monkeypatch.setattr(sp_attention, name, op)
    return calls


@pytest.mark.parametrize(
    "cfg, op",
    [
        (AttentionConfig(bias="none", rope=True), "causal_attention"),
        (AttentionConfig(bias="alibi", chunk_size=8), "alibi_attention"),
        (AttentionConfig(bias="window", window=7, sigma=32.0), "alibi_attention"),
        (AttentionConfig(bias="plsh", num_samples=5, sampler="stratified", backend="math", method="onepass"),
         "block_attention"),
        (AttentionConfig(bias="fixed_blocks", sigma=3.0), "block_attention"),
    ],
    ids=lambda x: x if isinstance(x, str) else x.bias,
)
def test_sequence_parallel_functions_receive_chunk_positions(cfg, op, monkeypatch):
    calls = _record_sp_calls(monkeypatch)
    runtime = AttentionRuntime(run_seed=5)
    runtime.set_step(2, 1)
    model = apply_sequence_parallel(build_model(presets["tiny"], cfg, runtime), SP_GROUP)
    # This rank's chunk of a longer sequence: global positions 64..79.
    with torch.no_grad():
        model(torch.randint(0, 512, (3, 16)), position_ids=torch.arange(64, 80)[None].expand(3, -1))

    assert len(calls) == 4  # one per layer
    for layer, (name, q_shape, k_shape, kw) in enumerate(calls):
        assert name == op
        assert q_shape == (3, 16, 4, 32) and k_shape == (3, 16, 2, 32)  # (B, T, H, D), GQA kept
        assert torch.equal(kw["positions"], torch.arange(64, 80))
        assert kw["causal"] is True and kw["group"] is SP_GROUP and kw["cu_seqlens"] is None
        assert kw["softmax_scale"] == 32**-0.5
        if cfg.bias in ("alibi", "window"):
            expected = alibi_slopes(4) if cfg.sigma is None else torch.full((4,), 1 / cfg.sigma)
            torch.testing.assert_close(kw["slopes"], expected, atol=0, rtol=0)
            assert kw["window"] == (cfg.window if cfg.bias == "window" else None)
            assert kw["chunk_size"] == cfg.chunk_size
        if cfg.bias == "plsh":
            lsh = kw["lsh"]
            torch.testing.assert_close(lsh.sigma, alibi_slopes(4).reciprocal().double(), atol=0, rtol=0)
            assert lsh.seed == hash_seed(5, 2, 1, layer) and not lsh.fixed
            assert (lsh.num_samples, lsh.sampler, kw["backend"], kw["method"]) == (5, "stratified", "math", "onepass")
        if cfg.bias == "fixed_blocks":
            lsh = kw["lsh"]
            assert lsh.fixed and lsh.sigma.tolist() == [3.0] and kw["method"] == "auto"


def test_single_process_op_by_default(monkeypatch):
    calls = []

    def op(q, k, v, *args):
        calls.append(args)
        return torch.zeros_like(q), None

    monkeypatch.setattr(alibi_bias, "alibi_attention_op", op)
    model = build_model(presets["tiny"], AttentionConfig(bias="alibi"))
    with torch.no_grad():
        model(torch.randint(0, 512, (1, 8)))
    assert len(calls) == 4  # one per layer: plsh_dist::alibi_attention, no sequence-parallel form
    positions, cu_seqlens, slopes, window, causal = calls[0][:5]
    assert torch.equal(positions, torch.arange(8)) and cu_seqlens is None and window == [] and causal is True
    torch.testing.assert_close(slopes, alibi_slopes(4), atol=0, rtol=0)


def test_apply_sequence_parallel_sets_the_group_of_every_module():
    model = build_model(presets["tiny"], AttentionConfig(bias="plsh"))
    apply_sequence_parallel(model, SP_GROUP)
    assert all(m.plsh_binding.group is SP_GROUP for m in attention_modules(model))
    set_attention_mode(model, AttentionConfig(bias="alibi"))  # switching the mode keeps parallelism
    assert all(m.plsh_binding.group is SP_GROUP for m in attention_modules(model))
    apply_sequence_parallel(model, None)  # back to one process
    assert all(m.plsh_binding.group is None for m in attention_modules(model))


def test_positions_buffer_refilled_in_place_is_reread():
    """The per-forward CPU copy of the positions must not go stale when a
    caller reuses one position_ids buffer and refills it in place."""
    model = build_model(presets["tiny"], AttentionConfig(bias="plsh", num_samples=2))
    ids = torch.randint(0, 512, (1, 16))
    buf = torch.arange(16)[None].clone()
    with torch.no_grad():
        first = model(ids, position_ids=buf).logits
        buf.add_(1000)  # same tensor object, new positions: other hash blocks
        moved = model(ids, position_ids=buf).logits
        fresh = model(ids, position_ids=torch.arange(1000, 1016)[None]).logits
    assert not torch.allclose(first, moved)
    assert torch.equal(moved, fresh)
