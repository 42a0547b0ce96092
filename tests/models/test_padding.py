"""Padded batches through transformers' API, in every bias mode: a row's logits and
greedy tokens equal those of the same row run alone, as for transformers' own ALiBi
models (BLOOM). Positions count the real tokens (``cumsum(mask) - 1``), so a left-padded
prompt's PLSH blocks are its blocks unpadded; padded keys are never attended and padded
queries stay finite. A tiny Qwen3 (2 layers, GQA 4/2) in fp32, as a user runs it."""

import dataclasses
import textwrap
from pathlib import Path

import pytest
import torch
import transformers

from plsh_dist.data.tokenizer import train_tokenizer
from plsh_dist.models import (AttentionConfig, AttentionRuntime, apply_sequence_parallel, build_model, get_runtime, presets,
                              set_attention_mode, window_cache)
from plsh_dist.models.hf_tokenizer import PlshTokenizer
from tests.tolerances import FP32

VOCAB = 384
PAD = 3  # the tokenizer's pad id; any id works, padded tokens are masked
MODES = [
    AttentionConfig(bias="none"),
    AttentionConfig(bias="none", rope=True),
    AttentionConfig(bias="alibi"),
    AttentionConfig(bias="window", window=5),
    AttentionConfig(bias="truncated", truncate_c=0.5),  # per-head windows 2, 8, 32, 128
    AttentionConfig(bias="plsh", num_samples=3, sigma=2.5, method="per_sample"),  # short blocks: positions matter
    AttentionConfig(bias="plsh", num_samples=4, method="onepass"),  # per-head sigma 4 .. 256
    AttentionConfig(bias="fixed_blocks", sigma=2.0),
]
IDS = [f"{c.bias}{'-rope' if c.rope else ''}-{c.method}" for c in MODES]


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    cfg = dataclasses.replace(presets["tiny"], num_layers=2, vocab_size=VOCAB)
    return build_model(cfg, AttentionConfig(), AttentionRuntime(run_seed=13)).eval()


def _set(model, attn):
    set_attention_mode(model, attn, AttentionRuntime(run_seed=13))
    get_runtime(model).set_step(2, 1)


def _prompts():
    g = torch.Generator().manual_seed(4)
    return [torch.randint(4, VOCAB, (n,), generator=g) for n in (11, 4, 8)]


def _pad(rows, side):
    """Rows of different lengths -> (ids, mask), padded on ``side`` with PAD."""
    n = max(len(r) for r in rows)
    ids = torch.full((len(rows), n), PAD)
    mask = torch.zeros(len(rows), n, dtype=torch.long)
    for b, r in enumerate(rows):
        cols = slice(n - len(r), n) if side == "left" else slice(0, len(r))
        ids[b, cols], mask[b, cols] = r, 1
    return ids, mask


@pytest.mark.parametrize("attn", MODES, ids=IDS)
def test_right_padded_logits_equal_each_row_alone(model, attn):
    _set(model, attn)
    rows = _prompts()
    ids, mask = _pad(rows, "right")
    with torch.no_grad():
        padded = model(input_ids=ids, attention_mask=mask).logits
        for b, r in enumerate(rows):
            torch.testing.assert_close(padded[b, : len(r)], model(input_ids=r[None]).logits[0], **FP32)
    assert bool(padded.isfinite().all())  # padded queries too


@pytest.mark.parametrize("attn", MODES, ids=IDS)
def test_left_padded_generate_equals_each_prompt_alone(model, attn):
    _set(model, attn)
    rows = _prompts()
    ids, mask = _pad(rows, "left")
    kw = dict(max_new_tokens=8, do_sample=False, pad_token_id=PAD)
    with torch.no_grad():
        batched = model.generate(input_ids=ids, attention_mask=mask, **kw)[:, ids.shape[1]:]
        for b, r in enumerate(rows):
            alone = model.generate(input_ids=r[None], **kw)[0, len(r):]
            assert batched[b].tolist() == alone.tolist(), b


@pytest.mark.parametrize("attn", [MODES[2], MODES[5]], ids=[IDS[2], IDS[5]])
def test_left_padded_generate_with_a_static_cache(model, attn):
    _set(model, attn)
    rows = _prompts()[:2]
    ids, mask = _pad(rows, "left")
    kw = dict(max_new_tokens=6, do_sample=False, pad_token_id=PAD)
    with torch.no_grad():
        static = model.generate(input_ids=ids, attention_mask=mask, cache_implementation="static", **kw)
        dynamic = model.generate(input_ids=ids, attention_mask=mask, **kw)
    assert torch.equal(static, dynamic)


@pytest.mark.parametrize("attn", [MODES[3], MODES[4]], ids=[IDS[3], IDS[4]])
def test_left_padded_generate_with_a_window_cache(model, attn):
    """window_cache keeps only the last w - 1 tokens: the mask is longer than the keys."""
    _set(model, attn)
    rows = _prompts()
    ids, mask = _pad(rows, "left")
    kw = dict(max_new_tokens=8, do_sample=False, pad_token_id=PAD)
    with torch.no_grad():
        windowed = model.generate(input_ids=ids, attention_mask=mask, cache=window_cache(model), **kw)
        for b, r in enumerate(rows):
            alone = model.generate(input_ids=r[None], **kw)[0, len(r):]
            assert windowed[b, ids.shape[1]:].tolist() == alone.tolist(), b


@pytest.mark.parametrize("attn", [MODES[2], MODES[5], MODES[6]], ids=[IDS[2], IDS[5], IDS[6]])
def test_padded_gradients_equal_each_row_alone(model, attn):
    """The padded path is differentiable: a right-padded batch's loss on the real tokens has the
    gradients of the rows' losses run alone."""
    _set(model, attn)
    rows = _prompts()[:2]
    ids, mask = _pad(rows, "right")
    params = [p for p in model.parameters() if p.requires_grad]

    def grads(loss):
        return torch.autograd.grad(loss, params, allow_unused=True)

    logits = model(input_ids=ids, attention_mask=mask).logits
    padded = grads(sum(logits[b, : len(r)].square().mean() for b, r in enumerate(rows)))
    alone = grads(sum(model(input_ids=r[None]).logits[0].square().mean() for r in rows))
    for got, want in zip(padded, alone):
        if want is not None:
            torch.testing.assert_close(got, want, **FP32)


def test_what_padding_cannot_honour_is_refused(model):
    _set(model, MODES[2])
    ids, mask = _pad(_prompts()[:2], "right")
    with torch.no_grad():
        model(input_ids=ids, attention_mask=torch.ones_like(mask))  # all ones: the plain path
        with pytest.raises(ValueError, match="materialised 4-D"):
            model(input_ids=ids, attention_mask=torch.ones(2, 1, ids.shape[1], ids.shape[1], dtype=torch.bool))
        with pytest.raises(ValueError, match="packed documents"):
            n = ids.numel()
            model(input_ids=ids, attention_mask=mask, cu_seq_lens_q=torch.tensor([0, n // 2, n]),
                  cu_seq_lens_k=torch.tensor([0, n // 2, n]), max_length_q=n // 2, max_length_k=n // 2)

    apply_sequence_parallel(model, object())  # a sequence-parallel group (never called here)
    try:
        with torch.no_grad(), pytest.raises(ValueError, match="sequence parallelism"):
            model(input_ids=ids, attention_mask=mask)
    finally:
        apply_sequence_parallel(model, None)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    root = tmp_path_factory.mktemp("padding_tok")
    (root / "text.txt").write_text(Path(textwrap.__file__).read_text())
    train_tokenizer([str(root / "text.txt")], root / "tok", vocab_size=VOCAB, input_sentence_size=300)
    tok = PlshTokenizer(str(root / "tok.model"))
    assert tok.pad_token_id == PAD and tok.padding_side == "left"
    return tok


@pytest.mark.parametrize("attn", MODES, ids=IDS)
def test_text_generation_pipeline_batches_prompts(model, tokenizer, attn):
    """``pipeline("text-generation", batch_size=2)`` pads the prompts (the tokenizer's padding,
    on the left): each text equals that prompt's text generated alone."""
    _set(model, attn)
    prompts = ["def wrap(text, width", "import os", "class TextWrapper:\n    def"]
    pipe = transformers.pipeline("text-generation", model=model, tokenizer=tokenizer, batch_size=2)
    kw = dict(max_new_tokens=5, do_sample=False, return_full_text=False)
    batched = [out[0]["generated_text"] for out in pipe(prompts, **kw)]
    alone = [pipe(p, **kw)[0]["generated_text"] for p in prompts]
    assert batched == alone
