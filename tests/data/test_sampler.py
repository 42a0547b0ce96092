"""DP sharding, deterministic shuffling and resume."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from plsh_dist.data.loader import PackedLoader
from plsh_dist.data.sampler import ShardedSampler, epoch_permutation


def test_permutation_is_a_pure_function():
    p = epoch_permutation(1000, seed=7, epoch=2)
    assert sorted(p.tolist()) == list(range(1000))
    assert np.array_equal(p, epoch_permutation(1000, seed=7, epoch=2))
    assert not np.array_equal(p, epoch_permutation(1000, seed=8, epoch=2))
    assert not np.array_equal(p, epoch_permutation(1000, seed=7, epoch=3))
    # Pinned values: the order must not change with numpy versions or machines.
    assert epoch_permutation(8, seed=0, epoch=0).tolist() == PINNED_ORDER


PINNED_ORDER = [4, 0, 1, 7, 6, 2, 5, 3]  # recorded from this implementation (SplitMix64 keys)


@pytest.mark.parametrize("dp_size", [1, 2, 3, 4])
@pytest.mark.parametrize("num_items", [12, 13, 17])
def test_dp_ranks_deal_the_global_stream(num_items, dp_size):
    """Each global micro-batch is the next B x dp_size stream positions, dealt round-robin: the
    ranks are disjoint within a batch, and together read the stream in order, epoch after epoch."""
    batch = 2
    samplers = [ShardedSampler(num_items, r, dp_size, seed=1) for r in range(dp_size)]
    stream = np.concatenate([epoch_permutation(num_items, 1, e) for e in range(4)])
    read = []
    for _ in range(3 * num_items // (batch * dp_size)):
        taken = np.stack([s.take(batch) for s in samplers], axis=1)  # (batch, dp_size)
        read.extend(taken.reshape(-1).tolist())
    assert read == stream[: len(read)].tolist()
    assert all(s.position == len(read) for s in samplers)


@pytest.mark.parametrize("dp_size", [1, 2, 3, 4])
@pytest.mark.parametrize("num_items", [12, 13, 17])
def test_one_epoch_shards_disjoint_equal_and_covering(num_items, dp_size):
    shards = [ShardedSampler(num_items, r, dp_size, seed=1, loop=False).take(num_items) for r in range(dp_size)]
    per_rank = num_items // dp_size
    assert all(len(s) == per_rank for s in shards)
    union = np.concatenate(shards)
    assert len(set(union.tolist())) == per_rank * dp_size  # disjoint
    # Covering: exactly the first per_rank * dp_size windows of the epoch's order.
    assert set(union.tolist()) == set(epoch_permutation(num_items, 1, 0)[: per_rank * dp_size].tolist())


@pytest.mark.parametrize("before, after", [(2, 1), (2, 4), (1, 3), (4, 2)])
def test_resume_at_another_dp_size_neither_repeats_nor_skips(before, after):
    """A run stopped at one DP size and resumed at another reads the stream on from where the
    whole group stopped: the union of everything read equals one uninterrupted reading."""
    num_items, batch = 23, 2
    first = [ShardedSampler(num_items, r, before, seed=4) for r in range(before)]
    read = []
    for _ in range(5):  # 5 micro-batches, across an epoch border at dp 4
        read.extend(np.stack([s.take(batch) for s in first], axis=1).reshape(-1).tolist())
    state = first[0].state_dict()
    assert state["position"] == 5 * batch * before
    second = [ShardedSampler(num_items, r, after, seed=4) for r in range(after)]
    for s in second:
        s.load_state_dict(state)
    for _ in range(4):
        read.extend(np.stack([s.take(batch) for s in second], axis=1).reshape(-1).tolist())
    stream = np.concatenate([epoch_permutation(num_items, 4, e) for e in range(4)])
    assert read == stream[: len(read)].tolist()


def test_shuffle_differs_between_epochs_and_stays_whole():
    s = ShardedSampler(50, seed=3)
    e0, e1 = s.take(50), s.take(50)
    assert sorted(e0.tolist()) == sorted(e1.tolist()) == list(range(50))
    assert not np.array_equal(e0, e1)
    assert s.epoch == 2


def _batches(loader, n):
    return [loader.next_batch() for _ in range(n)]


@pytest.mark.parametrize("consumed_batches", [1, 4, 7])
def test_resume_yields_the_same_next_batches(consumed_batches):
    tokens = np.arange(1000) % 97
    kwargs = dict(dp_rank=1, dp_size=2, sp_rank=1, sp_size=2, seed=5)
    full = PackedLoader(tokens, 16, 3, **kwargs)  # 62 windows, 31 per rank: batches cross epoch borders
    reference = _batches(full, consumed_batches + 5)
    first = PackedLoader(tokens, 16, 3, **kwargs)
    _batches(first, consumed_batches)
    assert first.consumed == consumed_batches * 3 and first.position == consumed_batches * 3 * 2
    resumed = PackedLoader(tokens, 16, 3, start=first.position, **kwargs)  # as DataPipeline.skip_to does
    for ref, got in zip(reference[consumed_batches:], _batches(resumed, 5)):
        for key in ref:
            assert torch.equal(ref[key], got[key])


def test_resume_rejects_changed_data_or_seed():
    s = ShardedSampler(40, 0, 2, seed=1)
    s.take(5)
    with pytest.raises(ValueError, match="num_items"):
        ShardedSampler(41, 0, 2, seed=1).load_state_dict(s.state_dict())
    with pytest.raises(ValueError, match="seed"):
        ShardedSampler(40, 0, 2, seed=2).load_state_dict(s.state_dict())


def test_same_seed_same_batches_on_every_sp_rank():
    tokens = np.arange(2000) % 101
    whole = PackedLoader(tokens, 16, 4, dp_rank=0, dp_size=2, seed=9).next_batch()
    parts = [PackedLoader(tokens, 16, 4, dp_rank=0, dp_size=2, sp_rank=r, sp_size=4, seed=9).next_batch()
             for r in range(4)]
    for key in whole:
        assert torch.equal(torch.cat([p[key] for p in parts], dim=1), whole[key])


def test_one_epoch_loader_stops_with_equal_counts():
    tokens = np.arange(1000)
    loaders = [PackedLoader(tokens, 10, 4, dp_rank=r, dp_size=3, shuffle=False, loop=False) for r in range(3)]
    sizes = [[b["input_ids"].shape[0] for b in loader] for loader in loaders]
    # 99 windows, 33 per rank: 8 full batches of 4 and one of 1, on every rank.
    assert sizes == [[4] * 8 + [1]] * 3
    assert len(loaders[0]) == 9
    seen = np.concatenate([np.concatenate([b["input_ids"][:, 0].numpy() for b in PackedLoader(
        tokens, 10, 4, dp_rank=r, dp_size=3, shuffle=False, loop=False)]) for r in range(3)])
    assert sorted(seen.tolist()) == list(range(0, 990, 10))  # unshuffled windows start every 10 tokens
