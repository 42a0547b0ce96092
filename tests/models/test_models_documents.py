"""transformers' packed conventions through our attention: a Qwen3 model with
position_ids restarting per document (``DataCollatorWithFlattening``), or the
``cu_seq_lens_q/k`` keyword arguments, equals separate forwards of each
document (logits and every parameter gradient, fp64), in every mode; what
cannot be honoured is refused."""

import dataclasses

import pytest
import torch

from plsh_dist.models import AttentionConfig, AttentionRuntime, build_model, presets, set_attention_mode
from tests.tolerances import FP64

DOCS = [1, 9, 14, 24]  # one row of 48 tokens: a 1-token document, short ones, a long one
MODES = [
    AttentionConfig(bias="none", rope=True),
    AttentionConfig(bias="alibi"),
    AttentionConfig(bias="window", window=6),
    AttentionConfig(bias="plsh", num_samples=3, method="per_sample"),
    AttentionConfig(bias="plsh", num_samples=3, method="onepass", sigma=5.0),
    AttentionConfig(bias="fixed_blocks"),
]


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    cfg = dataclasses.replace(presets["tiny"], num_layers=2)
    return build_model(cfg, AttentionConfig(), AttentionRuntime(run_seed=5), dtype=torch.float64)


def _loss_and_grads(model, ids, **kw):
    model.zero_grad(set_to_none=True)
    logits = model(input_ids=ids, **kw).logits
    weights = torch.linspace(-1, 1, logits.shape[-1], dtype=logits.dtype)
    (logits * weights).sum().backward()
    return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _separately(model, ids):
    logits, grads, a = [], {}, 0
    for n in DOCS:
        lg, g = _loss_and_grads(model, ids[:, a:a + n], position_ids=torch.arange(n)[None])
        logits.append(lg)
        for name, x in g.items():
            grads[name] = grads.get(name, 0) + x
        a += n
    return torch.cat(logits, dim=1), grads


@pytest.mark.parametrize("attn", MODES, ids=lambda c: f"{c.bias}-{c.method}")
def test_restarting_position_ids_equal_separate_documents(model, attn):
    set_attention_mode(model, attn, AttentionRuntime(run_seed=5))
    ids = torch.randint(0, 512, (1, sum(DOCS)), generator=torch.Generator().manual_seed(1))
    position_ids = torch.cat([torch.arange(n) for n in DOCS])[None]
    packed = _loss_and_grads(model, ids, position_ids=position_ids)
    alone = _separately(model, ids)
    torch.testing.assert_close(packed[0], alone[0], **FP64)
    assert packed[1].keys() == alone[1].keys()
    for name in packed[1]:
        torch.testing.assert_close(packed[1][name], alone[1][name], **FP64, msg=lambda m: f"{name}: {m}")
    # DataCollatorWithFlattening(return_flash_attn_kwargs=True) also passes the offsets
    cu = torch.tensor([0, *torch.tensor(DOCS).cumsum(0).tolist()], dtype=torch.int32)
    with_kwargs = _loss_and_grads(model, ids, position_ids=position_ids, cu_seq_lens_q=cu, cu_seq_lens_k=cu,
                                  max_length_q=max(DOCS), max_length_k=max(DOCS))
    torch.testing.assert_close(with_kwargs[0], packed[0], **FP64)


def test_rows_with_different_positions_are_separate_documents(model):
    """Rows whose positions differ (no restart) each form one document: equal to each row alone."""
    set_attention_mode(model, AttentionConfig(bias="plsh", num_samples=2), AttentionRuntime(run_seed=5))
    ids = torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(2))
    pos = torch.stack([torch.arange(16), torch.arange(100, 116)])
    with torch.no_grad():
        both = model(input_ids=ids, position_ids=pos).logits
        rows = [model(input_ids=ids[b:b + 1], position_ids=pos[b:b + 1]).logits for b in range(2)]
    torch.testing.assert_close(both, torch.cat(rows), **FP64)


def test_packed_arguments_that_cannot_be_honoured_are_refused(model):
    set_attention_mode(model, AttentionConfig(bias="alibi"))
    ids = torch.randint(0, 512, (1, 12))
    cu = torch.tensor([0, 5, 12], dtype=torch.int32)
    with torch.no_grad():
        with pytest.raises(ValueError, match="cu_seq_lens_q and cu_seq_lens_k"):
            model(input_ids=ids, cu_seq_lens_q=cu, cu_seq_lens_k=torch.tensor([0, 6, 12], dtype=torch.int32))
        with pytest.raises(ValueError, match="cu_seqlens must start at 0 and end"):
            model(input_ids=ids, cu_seq_lens_q=cu[:2], cu_seq_lens_k=cu[:2])
        with pytest.raises(ValueError, match="within each document"):  # a restart that is not at 0, no offsets
            model(input_ids=ids, position_ids=torch.tensor([[0, 1, 2, 3, 4, 3, 4, 5, 6, 7, 8, 9]]))
