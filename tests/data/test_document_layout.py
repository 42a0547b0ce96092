"""Document layout of packed batches ([data].document_masking): cu_seqlens from the windows.

A document is its tokens and the EOS that ends it; one starts after each EOS
and at position 0 of every window. ``cu_seqlens`` (int32) lists the starts
over the flattened (B, T) inputs, then B * T. Hand-made windows pin the edge
cases; random streams check the invariants against a plain-Python reference;
SP ranks share the tensor; labels, chunks and resume are unchanged.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from plsh_dist.data import DataConfig
from plsh_dist.data.loader import PackedLoader
from plsh_dist.data.packing import document_cu_seqlens, gather_windows, max_document_length, split_for_sp
from plsh_dist.data.tokenizer import EOS_ID

E = EOS_ID


def _cu(rows: list[list[int]]) -> list[int]:
    """cu_seqlens of windows ``rows`` (each T + 1 tokens), as a list."""
    cu = split_for_sp(np.array(rows), eos_id=E)["cu_seqlens"]
    assert cu.dtype == torch.int32 and cu.ndim == 1
    return cu.tolist()


def _reference(inputs: np.ndarray) -> list[int]:
    """Document offsets by walking the tokens one at a time."""
    out = []
    for b, row in enumerate(inputs.tolist()):
        for t, tok in enumerate(row):
            if t == 0 or row[t - 1] == E:
                out.append(b * len(row) + t)
    return out + [inputs.size]


# Windows are T + 1 = 7 tokens (T = 6 inputs); the last token is only a label.
@pytest.mark.parametrize("rows, expected", [
    ([[5, 6, 7, 8, 9, 10, 11]], [0, 6]),                       # no EOS: one document
    ([[5, 6, 7, 8, 9, E, 11]], [0, 6]),                        # EOS at the last input: ends there, no new start
    ([[5, 6, 7, 8, 9, 10, E]], [0, 6]),                        # EOS only in the labels: nothing inside the window
    ([[E, 6, 7, 8, 9, 10, 11]], [0, 1, 6]),                    # EOS at position 0: the previous document's end
    ([[5, 6, E, E, 9, 10, 11]], [0, 3, 4, 6]),                 # two EOS in a row: a one-token document between
    ([[5, E, 7, 8, E, 10, 11], [E, E, 7, 8, 9, E, 11]], [0, 2, 5, 6, 7, 8, 12]),  # rows: b * T always a start
    ([[E, E, E, E, E, E, E]], [0, 1, 2, 3, 4, 5, 6]),          # only EOS: every token its own document
])
def test_hand_made_windows(rows, expected):
    assert _cu(rows) == expected
    assert _cu(rows) == _reference(np.array(rows)[:, :-1])


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("eos_rate", [0.0, 0.05, 0.5])
def test_invariants_on_random_windows(seed, eos_rate):
    rng = np.random.default_rng(seed)
    b, t = 5, 32
    windows = rng.integers(4, 100, size=(b, t + 1))
    windows[rng.random(windows.shape) < eos_rate] = E
    cu = split_for_sp(windows, eos_id=E)["cu_seqlens"]
    c = cu.numpy().astype(np.int64)
    assert c[0] == 0 and c[-1] == b * t
    assert (np.diff(c) > 0).all()  # strictly increasing: no empty documents
    assert set(range(0, b * t + 1, t)) <= set(c.tolist())  # every row border
    assert c.tolist() == _reference(windows[:, :-1])
    # Inside a document, EOS can only be its last token.
    flat = windows[:, :-1].reshape(-1)
    for lo, hi in zip(c[:-1], c[1:]):
        assert not (flat[lo : hi - 1] == E).any()
    assert max_document_length(cu) == int(np.diff(c).max())


def test_labels_inputs_and_positions_are_unchanged():
    rng = np.random.default_rng(0)
    windows = rng.integers(0, 50, size=(3, 17))
    windows[:, 5] = E
    plain, masked = split_for_sp(windows), split_for_sp(windows, eos_id=E)
    assert set(masked) == set(plain) | {"cu_seqlens"}
    for key in plain:
        assert torch.equal(plain[key], masked[key])
    # A document's last content token still predicts its EOS; the EOS predicts the next document.
    assert (masked["labels"][:, 4] == E).all() and torch.equal(masked["labels"][:, 5], masked["input_ids"][:, 6])


@pytest.mark.parametrize("sp_size", [2, 4])
def test_sp_ranks_get_identical_cu_seqlens_and_their_usual_chunks(sp_size):
    rng = np.random.default_rng(1)
    windows = rng.integers(0, 20, size=(3, 33))  # EOS = 2 appears about every 20 tokens
    whole = split_for_sp(windows, eos_id=E)
    chunks = [split_for_sp(windows, r, sp_size, eos_id=E) for r in range(sp_size)]
    for c, r in zip(chunks, range(sp_size)):
        assert torch.equal(c["cu_seqlens"], whole["cu_seqlens"])  # the global layout, not the chunk's
        plain = split_for_sp(windows, r, sp_size)
        for key in plain:
            assert torch.equal(c[key], plain[key])
    for key in ("input_ids", "labels", "position_ids"):
        assert torch.equal(torch.cat([c[key] for c in chunks], dim=1), whole[key])


def _stream(n: int = 3000, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    tokens = rng.integers(4, 300, size=n).astype(np.uint16)  # a memmap's dtype
    tokens[rng.random(n) < 0.03] = E
    return tokens


def test_loader_batches_carry_the_layout_of_their_windows():
    tokens = _stream()
    plain = PackedLoader(tokens, 16, 4, seed=3)
    masked = PackedLoader(tokens, 16, 4, seed=3, document_masking=True)
    for _ in range(5):
        p, m = plain.next_batch(), masked.next_batch()
        assert "cu_seqlens" not in p and set(m) == set(p) | {"cu_seqlens"}
        for key in p:
            assert torch.equal(p[key], m[key])
        assert m["cu_seqlens"].tolist() == _reference(m["input_ids"].numpy())


@pytest.mark.parametrize("consumed_batches", [1, 6])
def test_resume_gives_identical_batches_including_cu_seqlens(consumed_batches):
    tokens = _stream(1000, seed=1)
    kwargs = dict(dp_rank=1, dp_size=2, sp_rank=1, sp_size=2, seed=5, document_masking=True)
    full = PackedLoader(tokens, 16, 3, **kwargs)  # 62 windows, 31 per rank: batches cross epoch borders
    reference = [full.next_batch() for _ in range(consumed_batches + 4)]
    resumed = PackedLoader(tokens, 16, 3, start=consumed_batches * 3 * 2, **kwargs)  # as DataPipeline.skip_to (2 DP ranks)
    for ref in reference[consumed_batches:]:
        got = resumed.next_batch()
        assert set(got) == set(ref) and "cu_seqlens" in got
        for key in ref:
            assert torch.equal(ref[key], got[key])


def test_loader_uses_the_streams_eos_id():
    tokens = np.array([5, 6, 7, 1, 8, 9, 10, 11, 12], dtype=np.uint16)  # 1 ends documents here
    batch = PackedLoader(tokens, 8, 1, shuffle=False, loop=False, document_masking=True, eos_id=1).next_batch()
    assert batch["cu_seqlens"].tolist() == [0, 4, 8]


def test_cu_seqlens_shape_errors():
    with pytest.raises(ValueError, match=r"\(B, T\)"):
        document_cu_seqlens(np.zeros(8, dtype=np.int64), E)
    cu = document_cu_seqlens(gather_windows(np.arange(20) % 7, np.array([0, 1]), 8)[:, :-1], E)
    assert cu.tolist() == [0, 3, 8, 10, 16]


def test_config_default_and_validation():
    assert DataConfig().document_masking is False  # old configs keep plain packing; shipped configs say true
    assert DataConfig(document_masking=False).document_masking is False
    for bad in (1, "true", None):
        with pytest.raises(ValueError, match=r"\[data\]\.document_masking must be a bool \(true or false\)"):
            DataConfig(document_masking=bad)


def test_build_loader_follows_the_config():
    from types import SimpleNamespace

    from plsh_dist.data import build_loader

    stream = SimpleNamespace(tokens=_stream(), eos_id=E)  # what build_loader reads of a TokenStream
    on = build_loader(stream, DataConfig(seq_len=16, micro_batch_size=2, document_masking=True), sp_rank=1,
                      sp_size=2).next_batch()
    off = build_loader(stream, DataConfig(seq_len=16, micro_batch_size=2, document_masking=False),
                       sp_rank=1, sp_size=2).next_batch()
    assert "cu_seqlens" not in off and on["cu_seqlens"][-1] == 2 * 16
    for key in off:
        assert torch.equal(on[key], off[key])
