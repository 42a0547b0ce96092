"""The kernel's host side: eager torch ops per attention call, and band tables built once per hash.

Ops are counted with ``TorchDispatchMode`` on CPU, views excluded, outside the kernel
launches: under the interpreter a launch copies its tensors through numpy (torch ops a
compiled launch does not issue)."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

pytest.importorskip("triton")

from plsh_dist.hashing import PositionalLSH, alibi_slopes  # noqa: E402
from plsh_dist.ops.triton import tile_bands  # noqa: E402
from plsh_dist.ops.triton import kernel_bias  # noqa: E402
from plsh_dist.ops.triton import cache as kernel_bias_cache  # noqa: E402
from plsh_dist.ops.triton import attention as triton_onepass  # noqa: E402
from plsh_dist.ops.documents import Documents  # noqa: E402
from plsh_dist.ops.triton.kernel_bias import KernelBias  # noqa: E402
from plsh_dist.ops.plsh import plsh_attention  # noqa: E402
from plsh_dist.ops.triton.tile_bands import (CountBias, WindowBias, block_bounds, key_spans,  # noqa: E402
                                      key_tile_bands, query_tile_bands, row_spans, tiles_for)
from plsh_dist.ops.triton.token_layout import TokenLayout  # noqa: E402
from plsh_dist.ops.triton.attention import alibi_window_attention  # noqa: E402

from kernel_cases import kernel_device  # noqa: E402

#: the issue's budget: eager torch ops of one attention call, forward and backward
HOST_OPS = 40


class _Ops(TorchDispatchMode):
    """Counts the non-view torch ops issued outside the kernels' launches."""

    def __init__(self):
        super().__init__()
        self.count, self.paused = 0, False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not func.is_view and not self.paused:
            self.count += 1
        return func(*args, **(kwargs or {}))


class _Launches:
    """The kernels module with every launch run while ``ops`` is paused."""

    def __init__(self, mod, ops: _Ops):
        self.mod, self.ops = mod, ops

    def __getattr__(self, name):
        kernel, ops = getattr(self.mod, name), self.ops

        class Grid:
            def __getitem__(self, grid):
                def launch(*args, **kwargs):
                    ops.paused = True
                    try:
                        return kernel[grid](*args, **kwargs)
                    finally:
                        ops.paused = False
                return launch
        return Grid()


@pytest.fixture
def count_ops(monkeypatch):
    """``count_ops(fn)``: the torch ops ``fn()`` issues outside the kernel launches."""
    if kernel_device().type != "cpu":
        pytest.skip("counts the host's ops on CPU")
    real, real_tables, real_bands = triton_onepass._launch, tile_bands.launch, kernel_bias.launch

    def count(fn) -> int:
        ops = _Ops()
        monkeypatch.setattr(triton_onepass, "_launch", lambda device: _Launches(real(device), ops))
        monkeypatch.setattr(tile_bands, "launch", lambda device: _Launches(real_tables(device), ops))
        monkeypatch.setattr(kernel_bias, "launch", lambda device: _Launches(real_bands(device), ops))
        with ops:
            fn()
        return ops.count
    return count


def _layer(H: int, n: int, s: int, seed: int, positions: torch.Tensor, causal: bool = True):
    """One attention call (a layer) on fresh inputs: returns a function running forward + backward."""
    g = torch.Generator().manual_seed(seed + H)
    q, k, v = (torch.randn(1, n, H, 32, generator=g, requires_grad=True) for _ in range(3))
    sigma = 3 * alibi_slopes(H).double().reciprocal()

    def run():
        out = plsh_attention(q, k, v, sigma=sigma, num_samples=s, seed=seed, positions=positions, causal=causal,
                             backend="triton", method="onepass")
        out.backward(torch.ones_like(out))
    return run


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_host_ops_do_not_grow_with_heads_samples_or_tokens(count_ops, causal):
    """A call that builds its hash's tables and one that finds them (a second layer sharing the
    hash) both issue at most HOST_OPS ops, neither count depending on H, s or n."""
    counts = []
    for H, s, n in ((2, 2, 40), (6, 9, 100)):
        kernel_bias_cache.clear()
        positions = 10 + torch.arange(n)
        first = count_ops(_layer(H, n, s, 1, positions, causal))
        again = count_ops(_layer(H, n, s, 1, positions, causal))
        assert first <= HOST_OPS and again <= HOST_OPS, (H, s, n, first, again)
        counts.append((first, again))
    assert counts[0] == counts[1], counts


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_host_ops_at_large_s_do_not_grow_with_heads_samples_or_tokens(count_ops, causal):
    """Beyond 16 samples the first call of a hash also builds the runs table of the near tiles once per
    kernel bias (on CPU tensors its torch form, ``NearBlocks.of``: a fixed number of ops
    more; on a device one allocation, ``test_device_tables.py``); a call that finds its hash's tables
    issues what it does at small s."""
    counts = []
    for H, s, n in ((2, 20, 40), (6, 40, 100)):
        kernel_bias_cache.clear()
        positions = 10 + torch.arange(n)
        first = count_ops(_layer(H, n, s, 1, positions, causal))
        again = count_ops(_layer(H, n, s, 1, positions, causal))
        assert again <= HOST_OPS, (H, s, n, again)
        counts.append((first, again))
    assert counts[0] == counts[1], counts
    kernel_bias_cache.clear()
    positions = 10 + torch.arange(40)
    small = (count_ops(_layer(2, 40, 2, 1, positions, causal)), count_ops(_layer(2, 40, 2, 1, positions, causal)))
    assert counts[0][1] == small[1] and counts[0][0] > small[0], (counts, small)


def test_window_ops_do_not_grow_with_heads(count_ops):
    counts = []
    for H, n in ((2, 40), (6, 100)):
        q, k, v = (torch.randn(1, n, H, 32, requires_grad=True) for _ in range(3))

        def run():
            out, _ = alibi_window_attention(q, k, v, sigma=torch.linspace(1, 9, H), window=torch.arange(H) * 9 + 1)
            out.backward(torch.ones_like(out))
        counts.append(count_ops(run))
    assert counts[0] == counts[1], counts


def test_band_tables_built_once_per_hash():
    """Two layers sharing a hash and a third with its own: forward of all three, then their
    backward, builds the tables twice; a positions tensor changed in place is a new key."""
    kernel_bias_cache.clear()
    positions = torch.arange(90)
    before = kernel_bias_cache.builds()
    layers = [_layer(2, 90, 4, seed, positions) for seed in (5, 5, 6)]
    for run in layers:
        run()
    assert kernel_bias_cache.builds() - before == 2
    layers[2]()  # the last plan is kept
    assert kernel_bias_cache.builds() - before == 2
    positions.add_(7)
    layers[2]()
    assert kernel_bias_cache.builds() - before == 3


def test_cache_holds_only_the_last_plan_beyond_autograd():
    """A plan lives while a graph holds it; the cache keeps only the most recent one besides."""
    import gc
    import weakref

    kernel_bias_cache.clear()
    n, positions = 60, torch.arange(60)
    q, k, v = (torch.randn(1, n, 2, 32, requires_grad=True) for _ in range(3))
    lsh = PositionalLSH(torch.tensor([2.0, 9.0], dtype=torch.float64), 3, seed=1)
    out_a = plsh_attention(q, k, v, sigma=lsh.sigma, num_samples=3, seed=1, positions=positions,
                           backend="triton", method="onepass")
    plan_a = weakref.ref(kernel_bias_cache._last[0])
    plsh_attention(q.detach(), k.detach(), v.detach(), sigma=lsh.sigma, num_samples=3, seed=2,
                   positions=positions, backend="triton", method="onepass")
    gc.collect()
    assert plan_a() is not None  # out_a's graph holds it for the backward
    out_a.sum().backward()
    del out_a
    gc.collect()
    assert plan_a() is None


def _documents(n: int) -> Documents:
    cu = torch.tensor([0, 1, 2, 40, 41, 97, n])
    lengths = cu[1:] - cu[:-1]
    return Documents.from_cu_seqlens(cu, torch.cat([torch.arange(int(L)) + 5 * i for i, L in enumerate(lengths)]))


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("docs", [False, True], ids=["row", "documents"])
def test_kernel_tables_equal_the_cost_models(causal, docs):
    """The launcher's tables (every head at once, from every token's block bounds) equal the
    cost model's bands (from the tiles' end tokens only) and the per-kernel spans."""
    n = 150
    documents = _documents(n) if docs else None
    positions = documents.positions if docs else 1000 + torch.arange(n)
    layout = TokenLayout.build(positions, torch.device("cpu"), documents)
    sigma = torch.tensor([0.8, 3.0, 40.0, 700.0], dtype=torch.float64)
    biases = [CountBias.of(PositionalLSH(sigma, 8, seed=11), torch.device("cpu")),
              WindowBias.of(sigma.float(), torch.tensor([1, 5, 40, 1000]), torch.device("cpu"))]
    for bias in biases:
        for head_dim in (64, 128):
            tiles = tiles_for(head_dim)
            plan = KernelBias.of(bias, layout, causal, tiles)
            for t, cfg, bands in zip((plan.fwd, plan.dkdv, plan.dq), tiles,
                                     (query_tile_bands, key_tile_bands, query_tile_bands)):
                lo, hi = bands(bias, layout, cfg.block_m, cfg.block_n, causal)
                assert torch.equal(t.lo, lo) and torch.equal(t.hi, hi)
                assert t.lo.is_contiguous() and t.hi.is_contiguous()
                assert torch.equal(t.args[0], key_spans(layout, cfg.block_n))
                if isinstance(bias, CountBias):
                    starts, lasts = block_bounds(bias, layout, causal)
                    assert torch.equal(t.args[1], starts)
                    assert torch.equal(t.args[2], starts if lasts is None else lasts)
                    assert torch.equal(t.args[3], row_spans(starts, lasts, cfg.block_m))
