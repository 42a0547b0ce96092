"""What reaches the op: layout, global positions, scale, seed, SP group, sigma/slopes."""

import pytest
import torch

import plsh_dist.ops as ops
from plsh_dist.hashing import alibi_slopes
from plsh_dist.models import AttentionConfig, AttentionRuntime, build_model, hash_seed, presets

SP_GROUP = object()  # stands for a torch.distributed group: passed through untouched


@pytest.mark.parametrize(
    "cfg, op",
    [
        (AttentionConfig(bias="none", rope=True), "causal_attention"),
        (AttentionConfig(bias="alibi", chunk_size=8), "alibi_attention"),
        (AttentionConfig(bias="window", window=7, sigma=32.0), "alibi_attention"),
        (AttentionConfig(bias="plsh", num_samples=5, sampler="stratified", backend="math"), "plsh_attention"),
        (AttentionConfig(bias="fixed_blocks", sigma=3.0), "fixed_blocks_attention"),
    ],
    ids=lambda x: x if isinstance(x, str) else x.bias,
)
def test_op_receives_chunk_positions_and_sp_group(monkeypatch, cfg, op):
    calls = []

    def fake(q, k, v, **kwargs):
        calls.append((q.shape, k.shape, kwargs))
        return torch.zeros_like(q)

    monkeypatch.setattr(ops, op, fake)
    runtime = AttentionRuntime(run_seed=5, sp_group=SP_GROUP)
    runtime.set_step(2, 1)
    model = build_model(presets["tiny"], cfg, runtime)
    # This rank's chunk of a longer sequence: global positions 64..79.
    with torch.no_grad():
        model(torch.randint(0, 512, (3, 16)), position_ids=torch.arange(64, 80)[None].expand(3, -1))

    assert len(calls) == 4  # one per layer
    for layer, (q_shape, k_shape, kw) in enumerate(calls):
        assert q_shape == (3, 16, 4, 32) and k_shape == (3, 16, 2, 32)  # (B, T, H, D), GQA kept
        assert torch.equal(kw["positions"], torch.arange(64, 80))
        assert kw["sp_group"] is SP_GROUP and kw["causal"] is True
        assert kw["softmax_scale"] == 32**-0.5
        if cfg.bias in ("alibi", "window"):
            expected = alibi_slopes(4) if cfg.sigma is None else torch.full((4,), 1 / cfg.sigma)
            torch.testing.assert_close(kw["slopes"], expected, atol=0, rtol=0)
            assert kw["window"] == (cfg.window if cfg.bias == "window" else None)
            assert kw["chunk_size"] == cfg.chunk_size
        if cfg.bias == "plsh":
            torch.testing.assert_close(kw["sigma"], alibi_slopes(4).reciprocal(), atol=0, rtol=0)
            assert kw["seed"] == hash_seed(5, 2, 1, layer)
            assert (kw["num_samples"], kw["sampler"], kw["backend"]) == (5, "stratified", "math")
        if cfg.bias == "fixed_blocks":
            assert kw["sigma"] == 3.0


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
