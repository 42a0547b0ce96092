"""The loss hands a batch's document layout to the model ([data].document_masking).

A batch with ``cu_seqlens`` reaches the model as transformers' packed-sequence
keywords (``cu_seq_lens_q/k``, ``max_length_q/k``); a batch without it gets
exactly the plain call (the golden losses depend on that). On a tiny Qwen3
in fp64, the masked loss of a packed batch equals the sum of the losses of
its documents run one at a time (at their global positions), on the plain
and the chunked loss path: no token sees another document.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from plsh_dist.data import DataConfig
from plsh_dist.data.packing import split_for_sp
from plsh_dist.data.tokenizer import EOS_ID
from plsh_dist.models import AttentionConfig, AttentionRuntime, build_model, get_runtime, presets
from plsh_dist.train.loss_head import install_chunked_loss
from plsh_dist.train.losses import forward_sums, packed_kwargs, token_loss_sums
from plsh_dist.train.data_setup import DataPipeline
from plsh_dist.train.validation import validation_loss
from tests.tolerances import FP64

torch.set_num_threads(1)

CPU = torch.device("cpu")


class _Recorder(torch.nn.Module):
    """Records the keywords of every call; logits of zeros."""

    def __init__(self, vocab: int = 11):
        super().__init__()
        self.vocab, self.calls = vocab, []

    def forward(self, **kwargs):
        self.calls.append(kwargs)
        ids = kwargs["input_ids"]
        return SimpleNamespace(logits=torch.zeros(*ids.shape, self.vocab, requires_grad=True))


def _windows(seed: int = 0, rows: int = 2, seq: int = 24, vocab: int = 11) -> np.ndarray:
    """(rows, seq + 1) tokens with a few EOS: several documents per row, one cut by the border."""
    rng = np.random.default_rng(seed)
    w = rng.integers(4, vocab, size=(rows, seq + 1))
    w[0, [5, 6, 15]] = EOS_ID  # a one-token document (6) and a border-cut last one
    w[1, [0, 11, seq - 1]] = EOS_ID  # EOS first (the previous document's end) and at the last input
    return w


def test_plain_batches_get_exactly_the_plain_call():
    model = _Recorder()
    batch = split_for_sp(_windows())
    forward_sums(model, batch, CPU)
    assert packed_kwargs(batch) == {}
    (call,) = model.calls
    assert set(call) == {"input_ids", "position_ids"}


def test_masked_batches_pass_the_packed_keywords():
    model = _Recorder()
    batch = split_for_sp(_windows(), 1, 2, eos_id=EOS_ID)  # an SP chunk: the layout is still the whole batch's
    forward_sums(model, batch, CPU)
    (call,) = model.calls
    assert set(call) == {"input_ids", "position_ids", "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q",
                         "max_length_k"}
    cu = batch["cu_seqlens"]
    assert call["cu_seq_lens_q"].dtype == torch.int32 and torch.equal(call["cu_seq_lens_q"], cu)
    assert call["cu_seq_lens_k"] is call["cu_seq_lens_q"]
    assert call["max_length_q"] == call["max_length_k"] == int(cu.diff().max())
    assert type(call["max_length_q"]) is int
    assert call["input_ids"].shape == (2, 12) and cu[-1] == 2 * 24


def test_validation_loss_passes_the_layout():
    model = _Recorder()
    runtime = AttentionRuntime(run_seed=0, step=7, micro_step=1)
    batches = [split_for_sp(_windows(s), eos_id=EOS_ID) for s in range(2)]
    loss = validation_loss(model, batches, runtime, CPU)
    assert loss == pytest.approx(np.log(11))  # zero logits: log V per token
    assert [torch.equal(c["cu_seq_lens_q"], b["cu_seqlens"]) for c, b in zip(model.calls, batches)] == [True, True]


def _model(bias: str):
    torch.manual_seed(0)
    cfg = dataclasses.replace(presets["tiny"], num_layers=2)
    attn = AttentionConfig(bias=bias, num_samples=2) if bias == "plsh" else AttentionConfig(bias=bias)
    model = build_model(cfg, attn, dtype=torch.float64)
    get_runtime(model).set_step(3, 0)
    return model


def _per_document_loss(model, batch) -> torch.Tensor:
    """Each document of the batch alone (batch of one, its global positions), losses summed."""
    ids, labels, pos = batch["input_ids"], batch["labels"], batch["position_ids"]
    seq = ids.shape[1]
    cu = batch["cu_seqlens"].tolist()
    total = torch.zeros((), dtype=torch.float64)
    for lo, hi in zip(cu[:-1], cu[1:]):
        b, a, z = lo // seq, lo % seq, lo % seq + (hi - lo)
        doc = {"input_ids": ids[b : b + 1, a:z], "labels": labels[b : b + 1, a:z], "position_ids": pos[b : b + 1, a:z]}
        total = total + forward_sums(model, doc, CPU)[0]
    return total


@pytest.mark.parametrize("chunked", [False, True], ids=["plain", "chunked"])
@pytest.mark.parametrize("bias", ["alibi", "plsh"])
def test_masked_loss_is_the_sum_of_the_documents_alone(bias, chunked):
    model = _model(bias)
    vocab = model.config.vocab_size
    batch = split_for_sp(_windows(seed=1, seq=32, vocab=vocab), eos_id=EOS_ID)
    assert len(batch["cu_seqlens"]) - 1 >= 6  # several documents, so masking matters
    if chunked:
        install_chunked_loss(model, chunk_tokens=7)
    with torch.no_grad():
        masked, n = forward_sums(model, batch, CPU)
        plain = forward_sums(model, {k: v for k, v in batch.items() if k != "cu_seqlens"}, CPU)[0]
        alone = _per_document_loss(model, batch)
    assert n == batch["labels"].numel()
    torch.testing.assert_close(masked, alone, **FP64)
    assert abs(float(masked - plain)) > 1e-6  # the layout reached the attention


def test_chunked_path_equals_plain_path_with_a_layout():
    model = _model("plsh")
    batch = split_for_sp(_windows(seed=2, seq=32, vocab=model.config.vocab_size), eos_id=EOS_ID)
    ids, pos = batch["input_ids"], batch["position_ids"]
    with torch.no_grad():
        plain = token_loss_sums(model(input_ids=ids, position_ids=pos, **packed_kwargs(batch)).logits,
                                batch["labels"])[0]
        install_chunked_loss(model, chunk_tokens=5)
        chunked = forward_sums(model, batch, CPU)[0]
    torch.testing.assert_close(chunked, plain, **FP64)


@pytest.mark.parametrize("masking", [True, False])
def test_data_pipeline_sp_ranks_share_the_layout_and_resume_it(masking):
    rng = np.random.default_rng(4)
    tokens = rng.integers(4, 300, size=4000).astype(np.uint16)
    tokens[rng.random(tokens.size) < 0.02] = EOS_ID
    stream = SimpleNamespace(tokens=tokens, eos_id=EOS_ID)
    prepared = SimpleNamespace(train=stream, val=None, mixture=())
    cfg = DataConfig(seq_len=32, micro_batch_size=2, document_masking=masking)
    ranks = [DataPipeline(prepared, cfg, dp_rank=1, dp_size=2, sp_rank=r, sp_size=2) for r in range(2)]
    first = [[p.next_train() for _ in range(3)] for p in ranks]
    val = [next(p.val_batches(1)) for p in ranks]
    for batches in (*zip(*first), val):
        assert all(("cu_seqlens" in b) == masking for b in batches)
        if masking:
            assert torch.equal(batches[0]["cu_seqlens"], batches[1]["cu_seqlens"])
            assert batches[0]["cu_seqlens"][-1] == 2 * 32
        assert torch.equal(batches[0]["position_ids"] + 16, batches[1]["position_ids"])  # each rank its chunk
    resumed = DataPipeline(prepared, cfg, dp_rank=1, dp_size=2, sp_rank=1, sp_size=2)
    resumed.skip_to(2 * 2 * 2)  # 2 micro-batches of 2 sequences on each of the 2 DP ranks
    got = resumed.next_train()
    assert set(got) == set(first[1][2]) and all(torch.equal(got[k], first[1][2][k]) for k in got)
