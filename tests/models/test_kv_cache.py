"""KV-cache decoding through a whole model: a tiny Qwen3 (fp64, GQA 4/2) decoding
token by token with transformers' DynamicCache gives the logits of one full
forward (1e-10) in every bias mode; generate() with the cache equals greedy
decoding by repeated full forwards, and sampling with a fixed seed is the same
with and without the cache; what a cache cannot honour is refused."""

import dataclasses

import pytest
import torch
from transformers import DynamicCache

from plsh_dist.models import (AttentionConfig, AttentionRuntime, apply_sequence_parallel, build_model, get_runtime, presets,
                              set_attention_mode, window_cache)
from tests.tolerances import FP64

PROMPT, NEW = 5, 19  # a 5-token prefill, then 19 single-token steps: 24 positions
MODES = [
    AttentionConfig(bias="none", rope=True),
    AttentionConfig(bias="alibi"),
    AttentionConfig(bias="window", window=7),  # keys beyond the window are ignored
    AttentionConfig(bias="truncated", truncate_c=1.0),  # per-head windows 4, 16, 64, 256
    AttentionConfig(bias="plsh", num_samples=4),  # per-head sigma 4, 16, 64, 256
    AttentionConfig(bias="plsh", num_samples=3, sigma=3.0, sampler="stratified", method="per_sample"),
    AttentionConfig(bias="plsh", num_samples=8, sigma=2.5, method="onepass"),
    AttentionConfig(bias="fixed_blocks", sigma=2.0),
]


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    cfg = dataclasses.replace(presets["tiny"], num_layers=2)
    return build_model(cfg, AttentionConfig(), AttentionRuntime(run_seed=13), dtype=torch.float64).eval()


def _ids(n, seed=1):
    return torch.randint(0, 512, (2, n), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("attn", MODES, ids=lambda c: f"{c.bias}-{c.sigma}-{c.method}")
def test_cached_decoding_equals_one_full_forward(model, attn):
    set_attention_mode(model, attn, AttentionRuntime(run_seed=13))
    get_runtime(model).set_step(3, 1)  # a step's seed: decoding keeps the runtime's rule
    ids = _ids(PROMPT + NEW)
    with torch.no_grad():
        full = model(input_ids=ids, use_cache=False).logits
        cache = DynamicCache(config=model.config)
        steps = [model(input_ids=ids[:, :PROMPT], cache=cache, use_cache=True).logits]
        for t in range(PROMPT, PROMPT + NEW):
            steps.append(model(input_ids=ids[:, t : t + 1], cache=cache, use_cache=True).logits)
    assert cache.get_seq_length() == PROMPT + NEW
    torch.testing.assert_close(torch.cat(steps, dim=1), full, **FP64)


@pytest.mark.parametrize("attn", [AttentionConfig(bias="truncated", truncate_c=0.25),  # windows 1, 4, 16, 64
                                  AttentionConfig(bias="window", window=7)], ids=["truncated", "window"])
def test_window_cache_keeps_only_the_window(model, attn):
    """window_cache keeps the last w - 1 tokens per layer (w the widest head's window); decoding
    with it, also 3 tokens at a time, gives one full forward's logits."""
    set_attention_mode(model, attn, AttentionRuntime(run_seed=13))
    widest = 64 if attn.bias == "truncated" else 7
    n = widest + 30
    ids = _ids(n, seed=4)
    with torch.no_grad():
        full = model(input_ids=ids, use_cache=False).logits
        cache = window_cache(model)
        steps = [model(input_ids=ids[:, :PROMPT], cache=cache, use_cache=True).logits]
        for t in range(PROMPT, n, 3):
            steps.append(model(input_ids=ids[:, t : t + 3], cache=cache, use_cache=True).logits)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, **FP64)
    kept = cache.layers[0].keys.shape[-2]
    assert kept == min(n, widest - 1), kept
    assert cache.get_seq_length() == n


def test_window_cache_refuses_unbounded_modes(model):
    set_attention_mode(model, AttentionConfig(bias="alibi"))
    with pytest.raises(ValueError, match="no key window"):
        window_cache(model)


def test_multi_token_steps_and_position_offset(model):
    """Chunks of several new tokens against the cache, and a sequence that starts at position 40."""
    set_attention_mode(model, AttentionConfig(bias="plsh", num_samples=4), AttentionRuntime(run_seed=2))
    ids = _ids(20, seed=3)
    pos = (40 + torch.arange(20))[None]
    with torch.no_grad():
        full = model(input_ids=ids, position_ids=pos, use_cache=False).logits
        cache, steps = DynamicCache(config=model.config), []
        for a, b in ((0, 6), (6, 13), (13, 14), (14, 20)):
            steps.append(model(input_ids=ids[:, a:b], position_ids=pos[:, a:b], cache=cache,
                               use_cache=True).logits)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, **FP64)


def _greedy_by_full_forwards(model, ids, n):
    with torch.no_grad():
        for _ in range(n):
            nxt = model(input_ids=ids, use_cache=False).logits[:, -1].argmax(-1, keepdim=True)
            ids = torch.cat([ids, nxt], dim=1)
    return ids


@pytest.mark.parametrize("attn", [AttentionConfig(bias="plsh", num_samples=4), AttentionConfig(bias="alibi"),
                                  AttentionConfig(bias="none", rope=True)], ids=lambda c: c.bias)
def test_generate_with_cache_equals_greedy_full_forwards(model, attn):
    set_attention_mode(model, attn, AttentionRuntime(run_seed=13))
    ids = _ids(6, seed=4)
    want = _greedy_by_full_forwards(model, ids, 10)
    got = model.generate(ids, max_new_tokens=10, do_sample=False, use_cache=True, eos_token_id=None,
                         pad_token_id=0)
    assert torch.equal(got, want)


def test_sampling_is_the_same_with_and_without_cache(model):
    set_attention_mode(model, AttentionConfig(bias="plsh", num_samples=3, sigma=4.0), AttentionRuntime(run_seed=7))
    ids = _ids(4, seed=5)
    runs = []
    for use_cache in (True, False):
        torch.manual_seed(123)
        runs.append(model.generate(ids, max_new_tokens=12, do_sample=True, top_k=0, temperature=1.0,
                                   use_cache=use_cache, eos_token_id=None, pad_token_id=0))
    assert torch.equal(runs[0], runs[1])
    assert runs[0].shape == (2, 16)


def test_cache_refuses_what_it_cannot_honour(model):
    set_attention_mode(model, AttentionConfig(bias="plsh", num_samples=2), AttentionRuntime(run_seed=1))
    ids = _ids(8, seed=6)
    with torch.no_grad():
        cache = DynamicCache(config=model.config)
        model(input_ids=ids[:, :5], cache=cache, use_cache=True)
        with pytest.raises(ValueError, match="packed documents"):  # position_ids restarting at 0
            model(input_ids=ids[:, 5:], position_ids=torch.tensor([[5, 0, 1]]), cache=cache,
                  use_cache=True)
        cache = DynamicCache(config=model.config)
        model(input_ids=ids[:, :5], cache=cache, use_cache=True)
        with pytest.raises(ValueError, match="continue the cached tokens"):  # 6 keys cannot end at position 3
            model(input_ids=ids[:, 5:6], position_ids=torch.tensor([[3]]), cache=cache, use_cache=True)
        with pytest.raises(ValueError, match="continue the cached tokens"):  # new tokens not consecutive
            model(input_ids=ids[:, 5:7], position_ids=torch.tensor([[5, 7]]), cache=cache, use_cache=True)
        cache = DynamicCache(config=model.config)
        model(input_ids=ids[:, :5], cache=cache, use_cache=True)
        apply_sequence_parallel(model, object())  # a sequence-parallel group (never called here)
        try:
            with pytest.raises(ValueError, match="sequence parallelism"):
                model(input_ids=ids[:, 5:6], cache=cache, use_cache=True)
        finally:
            apply_sequence_parallel(model, None)


@pytest.mark.parametrize("family", ["llama", "mistral"])
def test_other_families_decode_with_cache(family):
    torch.manual_seed(0)
    cfg = dataclasses.replace(presets["tiny"], num_layers=2, family=family)
    m = build_model(cfg, AttentionConfig(bias="plsh", num_samples=3), AttentionRuntime(run_seed=4),
                    dtype=torch.float64).eval()
    ids = _ids(12, seed=8)
    with torch.no_grad():
        full = m(input_ids=ids, use_cache=False).logits
        cache = DynamicCache(config=m.config)
        steps = [m(input_ids=ids[:, :4], cache=cache, use_cache=True).logits]
        steps += [m(input_ids=ids[:, t : t + 1], cache=cache, use_cache=True).logits for t in range(4, 12)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, **FP64)


def test_static_cache(model):
    """StaticCache (slot j = position j, unwritten slots after the queries): as the dynamic cache."""
    from transformers import StaticCache

    set_attention_mode(model, AttentionConfig(bias="plsh", num_samples=4), AttentionRuntime(run_seed=13))
    ids = _ids(14, seed=9)
    with torch.no_grad():
        full = model(input_ids=ids, use_cache=False).logits
        cache = StaticCache(config=model.config, max_cache_len=32)
        steps = [model(input_ids=ids[:, :5], cache=cache, use_cache=True).logits]
        steps += [model(input_ids=ids[:, t : t + 1], cache=cache, use_cache=True).logits for t in range(5, 14)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, **FP64)
    got = model.generate(ids[:, :6], max_new_tokens=8, do_sample=False, cache_implementation="static",
                         eos_token_id=None, pad_token_id=0)
    assert torch.equal(got, _greedy_by_full_forwards(model, ids[:, :6], 8))
