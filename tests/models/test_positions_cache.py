"""The per-forward positions cache: every layer of one forward reuses one layout,
and a position buffer refilled in place for the next forward is never answered with the old
positions (the decoder clears the cache when a forward starts)."""

import dataclasses

import torch

from plsh_dist.models import AttentionConfig, AttentionRuntime, build_model, presets
from plsh_dist.models.attention import PositionsCache, _layout


class CountingCache(PositionsCache):
    """A PositionsCache that counts the layouts it was asked to keep (one per miss)."""

    def __init__(self):
        super().__init__()
        self.stores = 0

    def store(self, inputs, layout):
        self.stores += 1
        super().store(inputs, layout)


def test_same_tensors_hit_and_refilled_buffer_misses():
    cache = CountingCache()
    pos = torch.arange(8)[None].repeat(2, 1)
    first = _layout(pos, None, 2, 8, cache)
    assert _layout(pos, None, 2, 8, cache) is first and cache.stores == 1  # the next layer: a hit
    cache.clear()  # the next forward starts (the decoder's pre-hook)
    pos.copy_(torch.cat([torch.arange(4), torch.arange(4)])[None].expand(2, 8))  # the caller reuses its buffer
    positions, cu = _layout(pos, None, 2, 8, cache)
    assert cache.stores == 2
    assert torch.equal(positions, pos) and cu.tolist() == [0, 4, 8, 12, 16]  # the new documents, not the old row
    offsets = torch.tensor([0, 8, 16], dtype=torch.int32)
    _layout(pos, offsets, 2, 8, cache)
    cache.clear()
    offsets[1] = 4  # cu_seq_lens refilled in place too
    assert _layout(pos, offsets, 2, 8, cache)[1].tolist() == [0, 4, 16] and cache.stores == 4
    assert _layout(pos.clone(), offsets, 2, 8, cache) is not None and cache.stores == 5  # another tensor: a miss


def test_one_layout_per_forward_across_layers():
    torch.manual_seed(0)
    cfg = dataclasses.replace(presets["tiny"], num_layers=3)
    model = build_model(cfg, AttentionConfig(bias="alibi"), AttentionRuntime(run_seed=5), dtype=torch.float64)
    modules = [m for m in model.modules() if hasattr(m, "plsh_binding")]
    assert len(modules) == 3
    cache = modules[0].plsh_binding.positions  # the model's own, cleared by its decoder at each forward
    assert all(m.plsh_binding.positions is cache for m in modules)
    stored = cache.store
    cache.stores = 0

    def counting_store(inputs, layout):
        cache.stores += 1
        stored(inputs, layout)

    cache.store = counting_store
    ids = torch.randint(0, cfg.vocab_size, (1, 12))
    pos = torch.arange(12)[None]
    with torch.no_grad():
        before = model(input_ids=ids, position_ids=pos).logits
        assert cache.stores == 1  # three layers, one layout
        pos.copy_(torch.cat([torch.arange(6), torch.arange(6)])[None])  # two documents, same buffer
        packed = model(input_ids=ids, position_ids=pos).logits
        assert cache.stores == 2
        second_doc = model(input_ids=ids[:, 6:], position_ids=torch.arange(6)[None]).logits
    assert torch.equal(packed[:, :6], before[:, :6])
    assert torch.allclose(packed[:, 6:], second_doc) and not torch.allclose(packed[:, 6:], before[:, 6:])
