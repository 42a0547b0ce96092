"""The chunked LM head + cross-entropy equals the plain logits path.

fp64 throughout (tests/tolerances.py: FP64): the loss sum and the gradient
of every parameter of a tiny Qwen3, tied and untied, with ignored labels,
on a whole sequence and on a later SP rank's chunk of positions; the
function alone with a bias and chunk sizes that do and do not divide the
token count. In fp32 the two paths differ only by summation order.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from plsh_dist.distributed.sp_chunks import sp_chunk, sp_positions
from plsh_dist.models import AttentionConfig, build_model, presets
from plsh_dist.train.chunked_ce import chunked_cross_entropy_sums
from plsh_dist.train.loss_head import ChunkedLossHead, chunked_loss_head, install_chunked_loss
from plsh_dist.train.losses import forward_sums, token_loss_sums
from tests.tolerances import FP32, FP64

torch.set_num_threads(1)


def _labels(n_rows: int, n_cols: int, vocab: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, vocab, (n_rows, n_cols), generator=g)
    labels[torch.rand(n_rows, n_cols, generator=g) < 0.25] = -100  # ignored tokens
    labels[0, -1] = -100  # the usual last-position ignore
    return labels


@pytest.mark.parametrize("chunk", [1, 7, 24, 1000])
def test_function_matches_cross_entropy_with_bias(chunk):
    torch.manual_seed(0)
    n, d, v = 24, 16, 50
    h = torch.randn(n, d, dtype=torch.float64, requires_grad=True)
    w = torch.randn(v, d, dtype=torch.float64, requires_grad=True)
    b = torch.randn(v, dtype=torch.float64, requires_grad=True)
    y = _labels(1, n, v)[0]
    ref = F.cross_entropy(F.linear(h, w, b), y, ignore_index=-100, reduction="sum")
    ref_grads = torch.autograd.grad(ref * 1.7, (h, w, b))
    loss, count = chunked_cross_entropy_sums(h, w, y, bias=b, chunk_tokens=chunk)
    grads = torch.autograd.grad(loss * 1.7, (h, w, b))
    assert count == (y != -100).sum()
    torch.testing.assert_close(loss, ref, **FP64)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want, **FP64)


def test_all_tokens_ignored_gives_zero_loss_and_gradients():
    h = torch.randn(5, 4, dtype=torch.float64, requires_grad=True)
    w = torch.randn(9, 4, dtype=torch.float64, requires_grad=True)
    loss, count = chunked_cross_entropy_sums(h, w, torch.full((5,), -100), chunk_tokens=2)
    loss.backward()
    assert loss.item() == 0.0 and count.item() == 0
    assert not h.grad.any() and not w.grad.any()


def test_bad_labels_and_chunk_are_refused():
    h, w = torch.randn(4, 3), torch.randn(6, 3)
    with pytest.raises(ValueError, match=r"labels must be in \[0, 6\) or -100"):
        chunked_cross_entropy_sums(h, w, torch.tensor([0, 6, 1, 2]), chunk_tokens=2)
    with pytest.raises(ValueError, match="labels must be in"):
        chunked_cross_entropy_sums(h, w, torch.tensor([0, -1, 1, 2]), chunk_tokens=2)
    with pytest.raises(ValueError, match="chunk_tokens must be an int >= 1"):
        chunked_cross_entropy_sums(h, w, torch.tensor([0, 1, 1, 2]), chunk_tokens=0)


def _model(tied: bool, dtype=torch.float64):
    torch.manual_seed(0)
    cfg = dataclasses.replace(presets["tiny"], tie_embeddings=tied, num_layers=2)
    return build_model(cfg, AttentionConfig(bias="plsh", num_samples=2), dtype=dtype)


def _loss_and_grads(model, batch):
    model.zero_grad(set_to_none=True)
    loss, count = forward_sums(model, batch, torch.device("cpu"))
    (loss * 0.37).backward()  # a non-unit incoming gradient, as the trainer's 1/N scale
    return loss.detach(), count, {n: p.grad.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("sp_rank", [None, 1], ids=["whole", "sp_chunk"])
def test_model_loss_and_every_gradient_match_plain_path_fp64(tied, sp_rank):
    model = _model(tied)
    vocab, seq = model.config.vocab_size, 64
    ids = torch.randint(0, vocab, (2, seq), generator=torch.Generator().manual_seed(1))
    labels = _labels(2, seq, vocab, seed=2)
    positions = torch.arange(seq)[None].expand(2, -1)
    if sp_rank is not None:  # rank 1 of 2: the second half, at its global positions
        ids, labels = sp_chunk(ids, sp_rank, 2), sp_chunk(labels, sp_rank, 2)
        positions = sp_positions(seq, sp_rank, 2)[None].expand(2, -1)
    batch = {"input_ids": ids, "position_ids": positions, "labels": labels}

    plain = _loss_and_grads(model, batch)
    head = install_chunked_loss(model, chunk_tokens=13)  # does not divide the 2 x 32 or 2 x 64 tokens
    assert chunked_loss_head(model) is head
    assert (head.weight is model.get_input_embeddings().weight) == tied
    chunked = _loss_and_grads(model, batch)

    torch.testing.assert_close(chunked[0], plain[0], **FP64)
    assert chunked[1] == plain[1] == (labels != -100).sum()
    assert chunked[2].keys() == plain[2].keys()
    assert len(plain[2]) == len(list(model.parameters()))  # tied: the shared weight appears once
    for name in plain[2]:
        torch.testing.assert_close(chunked[2][name], plain[2][name], **FP64, msg=name)


def test_fp32_paths_agree_to_rounding():
    model = _model(tied=True, dtype=torch.float32)
    ids = torch.randint(0, model.config.vocab_size, (2, 64), generator=torch.Generator().manual_seed(1))
    batch = {"input_ids": ids, "position_ids": torch.arange(64)[None].expand(2, -1),
             "labels": _labels(2, 64, model.config.vocab_size)}
    plain = _loss_and_grads(model, batch)
    install_chunked_loss(model, chunk_tokens=16)
    chunked = _loss_and_grads(model, batch)
    torch.testing.assert_close(chunked[0], plain[0], **FP32)
    for name in plain[2]:
        torch.testing.assert_close(chunked[2][name], plain[2][name], **FP32, msg=name)


def test_head_keeps_logits_state_dict_and_tying():
    model = _model(tied=True)
    ids = torch.randint(0, model.config.vocab_size, (1, 16))
    keys = list(model.state_dict())
    before = model(input_ids=ids).logits
    head = install_chunked_loss(model, chunk_tokens=4)
    assert isinstance(model.lm_head, ChunkedLossHead)
    assert list(model.state_dict()) == keys
    torch.testing.assert_close(model(input_ids=ids).logits, before, rtol=0, atol=0)  # outside loss_of: logits
    assert head.weight is model.model.embed_tokens.weight
    with pytest.raises(ValueError, match="already a ChunkedLossHead"):
        install_chunked_loss(model, chunk_tokens=4)
    with pytest.raises(ValueError, match="do not match the hidden states"), head.loss_of(torch.zeros(1, 3).long()):
        model(input_ids=ids)
    assert head._labels is None  # the context closed on the error


def test_plain_path_upcasts_only_low_precision():
    logits = torch.randn(1, 3, 5, dtype=torch.float64)
    labels = torch.tensor([[1, -100, 4]])
    loss, n = token_loss_sums(logits, labels)
    assert loss.dtype == torch.float64 and n.item() == 2
    assert token_loss_sums(logits.bfloat16(), labels)[0].dtype == torch.float32


def test_config_option_is_checked():
    from plsh_dist.config import MemorySection

    assert MemorySection().loss_chunk_tokens == 2048
    assert MemorySection(loss_chunk_tokens=0).loss_chunk_tokens == 0
    with pytest.raises(ValueError, match=r"\[memory\].loss_chunk_tokens must be an integer >= 0"):
        MemorySection(loss_chunk_tokens=-1)
    with pytest.raises(ValueError, match=r"\[memory\].loss_chunk_tokens must be an int"):
        MemorySection(loss_chunk_tokens=2048.0)


def test_training_with_chunked_loss_matches_plain_under_every_zero_stage(tiny_data, tmp_path):
    """2 data-parallel ranks: the chunked loss (16-token chunks of the 2 x 64 tokens) under
    ZeRO 0-3 and with activation checkpointing gives the plain loss's losses and grad norms
    (tests/train/test_equivalence.py's 1e-5 rule: the same fp32 sums in another order)."""
    from tests.train.conftest import base_overrides
    from tests.train.spawn import run_training

    plsh = ["--attention.bias=plsh", "--attention.num_samples=2", "--run.max_steps=3"]
    runs = [base_overrides(tiny_data, tmp_path / "plain", "--memory.loss_chunk_tokens=0", *plsh)]
    layouts = [[f"--deepspeed.zero_stage={stage}"] for stage in (0, 1, 2, 3)]
    layouts.append(["--deepspeed.zero_stage=2", "--memory.activation_checkpointing=true"])
    runs += [base_overrides(tiny_data, tmp_path / f"chunked{i}", "--memory.loss_chunk_tokens=16", *flags, *plsh)
             for i, flags in enumerate(layouts)]
    plain, *chunked = run_training(2, *runs)
    for res in chunked:
        assert res["losses"] == pytest.approx(plain["losses"], rel=1e-5)
        assert res["grad_norms"] == pytest.approx(plain["grad_norms"], rel=1e-5)
        assert res["val_loss"] == pytest.approx(plain["val_loss"], rel=1e-5)


def test_chunked_loss_peak_memory_is_a_small_fraction_of_the_plain_one():
    """Live torch bytes of forward + backward (benchmarks/bench_loss_memory.py's measure, smaller):
    the plain path peaks at 3 fp32 (N, V) tensors, the chunked one at ~2 (chunk, V) ones."""
    from plsh_dist.plan.memory_measure import peak_cpu_bytes

    n, v, d, chunk = 4096, 8192, 64, 512
    g = torch.Generator().manual_seed(0)
    h = torch.randn(n, d, generator=g, requires_grad=True)
    w = (torch.randn(v, d, generator=g) * 0.1).requires_grad_()
    y = torch.randint(0, v, (n,), generator=g)

    def run(chunk_tokens):
        def step():
            if chunk_tokens:
                loss = chunked_cross_entropy_sums(h, w, y, chunk_tokens=chunk_tokens)[0]
            else:
                loss = token_loss_sums(F.linear(h, w)[None], y[None])[0]
            loss.backward()
            return loss.item()
        h.grad = w.grad = None
        return peak_cpu_bytes(step)

    (plain_loss, plain_peak), (chunked_loss, chunked_peak) = run(0), run(chunk)
    assert chunked_loss == pytest.approx(plain_loss, rel=1e-6)
    assert plain_peak >= 3 * n * v * 4  # three fp32 (N, V) tensors at once
    assert chunked_peak <= plain_peak / 4
    assert chunked_peak <= 2 * chunk * v * 4 + (n + v) * d * 4 + 2**20  # ~2 chunks, or dh + dW + 1 chunk
