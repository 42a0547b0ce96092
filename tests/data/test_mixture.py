"""Weighted mixtures of sources (data/mixture.py): the weights hold, the draw is a pure function of
the seed, and a mixture resumes exactly at any step, at any DP size."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from plsh_dist.data.loader import PackedLoader
from plsh_dist.data.mixture import BLOCK, Mixture, MixtureSampler, quotas


def test_quotas_apportion_a_block_by_the_weights():
    assert quotas([3, 1], block=8).tolist() == [6, 2]
    assert quotas([1, 1, 1], block=10).tolist() == [4, 3, 3]  # the remainder to the earlier of equal fractions
    assert quotas([0.5, 0.25, 0.25]).sum() == BLOCK
    with pytest.raises(ValueError, match="positive"):
        quotas([1, 0])
    with pytest.raises(ValueError, match="below 1/1024"):
        quotas([1, 1e-4])


@pytest.mark.parametrize("weights", [[1, 1], [0.7, 0.2, 0.1], [5, 1, 1, 3]])
def test_each_source_reads_its_own_stream_in_order_and_the_weights_hold(weights):
    mix = Mixture(weights, seed=3)
    positions = np.arange(3 * BLOCK + 100)
    sources, local = mix.locate(positions)
    for s in range(len(weights)):
        mine = local[sources == s]
        assert mine.tolist() == list(range(len(mine)))  # the source's own positions, none skipped or repeated
        # Over every whole block, exactly its quota; so at any position within 1 block's quota of the weights.
        assert np.sum(sources[: 3 * BLOCK] == s) == 3 * mix.quota[s]
    assert mix.consumed(len(positions)).tolist() == np.bincount(sources, minlength=len(weights)).tolist()
    assert mix.consumed(1234).tolist() == np.bincount(sources[:1234], minlength=len(weights)).tolist()


def test_the_draw_is_a_pure_function_of_seed_and_position():
    a, b = Mixture([2, 1], seed=5), Mixture([2, 1], seed=5)
    p = np.array([7, 3000, 5, 99999, 1024])  # any order, any block
    assert all(np.array_equal(x, y) for x, y in zip(a.locate(p), b.locate(p)))
    ref = a.locate(np.arange(100000))
    assert all(np.array_equal(x, y[p]) for x, y in zip(b.locate(p), ref))
    other = Mixture([2, 1], seed=6).locate(np.arange(2048))[0]
    assert not np.array_equal(other, ref[0][:2048])


def _streams():
    rng = np.random.default_rng(0)
    return [rng.integers(10, 100, size=n).astype(np.uint16) for n in (5000, 1200, 700)]  # 312, 75, 43 windows


def _read(loader, n):
    return [loader.next_batch() for _ in range(n)]


@pytest.mark.parametrize("before, after", [(1, 1), (2, 1), (1, 4), (4, 2)])
def test_a_mixture_resumes_exactly_inside_an_epoch_at_any_dp_size(before, after):
    """A run stopped after 7 micro-batches of a global batch of 4 (a step inside the small sources'
    epochs) and resumed at the saved position reads what the uninterrupted run reads."""
    streams, weights, global_batch = _streams(), [0.6, 0.3, 0.1], 4

    def rows(dp, start, steps):
        loaders = [PackedLoader(streams, 16, global_batch // dp, dp_rank=r, dp_size=dp, seed=9, start=start,
                                weights=weights) for r in range(dp)]
        out = []
        for _ in range(steps):  # a global micro-batch: each rank's rows, dealt round-robin
            batches = [loader.next_batch()["input_ids"] for loader in loaders]
            out.extend(torch.stack(batches, dim=1).reshape(global_batch, -1).tolist())
        return out, loaders[0].position

    uninterrupted, _ = rows(1, 0, 20)
    first, position = rows(before, 0, 7)
    assert position == 7 * global_batch
    resumed, _ = rows(after, position, 13)
    assert first + resumed == uninterrupted


def test_sources_report_their_sequences_and_epochs():
    sampler = MixtureSampler([312, 75, 43], [0.6, 0.3, 0.1], seed=9)
    sampler.take(200)
    progress = sampler.source_progress()
    assert sum(p["sequences"] for p in progress) == 200
    assert progress[2]["epochs"] == pytest.approx(progress[2]["sequences"] / 43)


def _sources_config(tmp_path, tables: str):
    from plsh_dist.config import load_config

    (tmp_path / "a.jsonl").write_text('{"text": "x"}\n')
    (tmp_path / "b.txt").write_text("y\n")
    return load_config(None, [f"--data.sources={tables}", f"--data.cache_dir={tmp_path / 'cache'}"])


def test_sources_config_reads_tables_and_writes_them_back(tmp_path):
    from plsh_dist.config import to_toml
    import tomllib

    a, b = tmp_path / "a.jsonl", tmp_path / "b.txt"
    cfg = _sources_config(tmp_path, f"[{{name='web', train_files=['{a}'], weight=3}}, "
                                    f"{{name='code', train_files='{b}', weight=1.5, val_files=['{b}']}}]")
    assert [t["name"] for t in cfg.data.sources] == ["web", "code"]
    assert cfg.data.sources[1]["train_files"] == [str(b)]  # a single path becomes a list
    assert tomllib.loads(to_toml(cfg))["data"]["sources"] == cfg.data.sources  # the resolved config round-trips


@pytest.mark.parametrize("tables, expected", [
    ("[{name='web', train_files=['{a}']}]", "[data].sources[0] = {'name': 'web', 'train_files': ['{a}']}: missing ['weight']"),
    ("[{name='web', train_files=['{a}'], weight=0}]", "[data].sources[0].weight must be a positive number, got 0"),
    ("[{name='w', train_files=['{a}'], weight=1}, {name='w', train_files=['{a}'], weight=1}]",
     "[data].sources[1].name must be a non-empty string unlike the other sources', got 'w'"),
    ("[{name='w', train_files=['{a}'], weight=1, wieght=2}]", "unknown key(s) ['wieght']"),
    ("[{name='w', train_files=['nothing/*.jsonl'], weight=1}]", "[data].sources[0].train_files: "),
    ("[]", "[data].sources is empty"),
])
def test_bad_sources_are_refused_naming_the_table_and_key(tmp_path, tables, expected):
    a = tmp_path / "a.jsonl"
    with pytest.raises(ValueError) as err:
        _sources_config(tmp_path, tables.replace("{a}", str(a)))
    assert expected.replace("{a}", str(a)) in str(err.value)
