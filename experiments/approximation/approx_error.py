"""How close is positional LSH to ALiBi?  ||L* - M~|| and ||T* - T~|| versus s.

Measurements behind the paper's claims (arXiv 2605.09472) and ours:

- :func:`mask_error`: ``||L* - M~||`` in spectral and max norm, per number of
  samples ``s``, against the paper's bound
  ``Psi_sigma * (sqrt(log n / s) + log n / s)``;
- :func:`max_block_size`: the largest block against ``sigma * log(log(n))``;
- :func:`output_error`: ``||T* - T~||`` of the attention outputs on given
  queries, keys and values (random ones, or captured from a checkpoint with
  :func:`experiments.approximation.qkv_capture.capture_qkv`);
- :func:`truncated_mask_error` and :func:`truncated_output_error`: the same
  errors of the deterministic baseline at the same cost, exact ALiBi truncated
  at ``w_h = ceil((ln s + 0.58) sigma_h)`` (entries ``|i - j| >= w_h`` of ``L*``
  set to 0; :mod:`experiments.approximation.equal_cost`).  Records carry
  ``sampler="truncated"`` so that they sit beside the samplers' curves.

Mask errors are of the full symmetric matrices (non-causal ``L*``, ``M~``);
output errors are causal unless ``causal=False``.

Cost.  M~ is never built as a stack of ``s`` dense masks.  Buckets are
monotone, so for ``i <= j`` positions ``i`` and ``j`` collide in sample ``t``
iff ``j <= e_t(i)``, the last index of ``i``'s block.  A histogram of
``e_t(i)`` per row ``i`` (``O(s n)`` to fill) and one reverse cumulative sum
(``O(n^2)``) give the collision counts of every pair.  The i.i.d. sampler's
draws are a pure function of the sample index, so the first ``s`` samples of
a 1024-sample hash are exactly the ``s``-sample hash and s = 1, 2, ..., 1024
costs one pass of 1024 samples.  The stratified sampler's draws depend on
``s``, so it is redrawn per ``s`` (2047 samples for the same ladder).

Shape legend: H hash heads (1 for a scalar sigma), n positions, s samples,
B batch, T tokens, D head dim.
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence

import torch

from experiments.approximation.equal_cost import equal_cost_window
from plsh_dist.hashing import PositionalLSH, _as_sigma, block_ends, block_starts
from plsh_dist.ops.gqa import repeat_kv
from plsh_dist.ops.reference import alibi_weights

# ---------------------------------------------------------------------------
# The paper's bound.
# ---------------------------------------------------------------------------


def psi_sigma(sigma: float) -> float:
    """``Psi_sigma = 1 + sigma + (e^{1/sigma} + 1) / (e^{1/sigma} - 1)``."""
    if not sigma > 0:
        raise ValueError(f"sigma must be > 0, got {sigma!r}")
    # (e^x + 1) / (e^x - 1) = coth(x / 2); written with expm1 so that a large
    # sigma (small x) does not lose every digit to cancellation.
    x = 1.0 / sigma
    return 1.0 + sigma + (math.expm1(x) + 2.0) / math.expm1(x)


def paper_bound(sigma: float, n: int, s: int) -> float:
    """``Psi_sigma * (sqrt(log n / s) + log n / s)``: the paper's bound on E||L* - M~||."""
    if n < 2 or s < 1:
        raise ValueError(f"need n >= 2 and s >= 1, got n={n}, s={s}")
    r = math.log(n) / s
    return psi_sigma(sigma) * (math.sqrt(r) + r)


# ---------------------------------------------------------------------------
# M~ without stacking s dense masks.
# ---------------------------------------------------------------------------


class RunningMask:
    """Running sum of block masks; ``mean()`` is M~ of the samples added so far.

    Memory is one int64 (H, n, n) histogram whatever the number of samples.
    """

    def __init__(self, num_heads: int, n: int):
        if num_heads < 1 or n < 1:
            raise ValueError(f"num_heads and n must be >= 1, got {num_heads}, {n}")
        self.num_heads, self.n = num_heads, n
        self.count = 0
        # hist[h, i, e] = number of samples whose block of i ends at index e.
        self._hist = torch.zeros(num_heads * n * n, dtype=torch.int64)
        self._row = torch.arange(n).mul_(n)
        self._head = torch.arange(num_heads).mul_(n * n)

    def add(self, buckets: torch.Tensor) -> None:
        """Add the masks of LongTensor[s, H, n] buckets (non-decreasing in n)."""
        s, H, n = buckets.shape
        if (H, n) != (self.num_heads, self.n):
            raise ValueError(f"buckets have (H, n) = {(H, n)}, this RunningMask holds {(self.num_heads, self.n)}")
        idx = block_ends(buckets) + self._row + self._head[:, None]  # (s, H, n)
        self._hist += torch.bincount(idx.flatten(), minlength=self._hist.numel())
        self.count += s

    def mean(self) -> torch.Tensor:
        """M~, float64 (H, n, n): the fraction of samples in which i and j share a block."""
        if self.count == 0:
            raise ValueError("RunningMask.mean() before any add(): no samples yet")
        hist = self._hist.view(self.num_heads, self.n, self.n)
        # together[h, i, j] (j >= i) = #{t : e_t(i) >= j}: a reverse cumulative sum.
        together = hist.flip(-1).cumsum(-1).flip(-1).triu()
        eye = torch.eye(self.n, dtype=torch.int64)
        full = together + together.transpose(-1, -2) - self.count * eye  # diagonal counted twice
        return full.to(torch.float64) / self.count


def averaged_masks(
    sigma, n: int, samples: Sequence[int], seed: int, sampler: str = "iid"
) -> Iterable[tuple[int, torch.Tensor]]:
    """Yield ``(s, M~_s)`` for each ``s`` in increasing ``samples``; M~ float64 (H, n, n).

    Equal (to rounding) to ``PositionalLSH(sigma, s, seed, sampler).averaged_mask(arange(n))``.
    """
    samples = _check_samples(samples)
    positions = torch.arange(n)
    sig = _as_sigma(sigma)
    if sampler == "iid":
        # Draws are a pure function of the sample index: prefixes are the
        # smaller hashes, so grow one running sum.
        hash_ = PositionalLSH(sig, samples[-1], seed, "iid")
        buckets = hash_.buckets(positions)  # (s_max, H, n)
        run = RunningMask(sig.numel(), n)
        for s in samples:
            run.add(buckets[run.count : s])
            yield s, run.mean()
    else:
        for s in samples:
            run = RunningMask(sig.numel(), n)
            run.add(PositionalLSH(sig, s, seed, sampler).buckets(positions))
            yield s, run.mean()


# ---------------------------------------------------------------------------
# Spectral norm of a symmetric matrix.
# ---------------------------------------------------------------------------


def symmetric_spectral_norm(a: torch.Tensor, tol: float = 1e-12, max_iter: int = 400) -> float:
    """``||a||_2 = max |eigenvalue|`` of a symmetric float64 (n, n) matrix, by Lanczos.

    Same number as ``torch.linalg.matrix_norm(a, ord=2)`` (tested to 1e-9
    relative) but O(n^2) per iteration instead of an O(n^3) SVD: a dense SVD
    of n = 1024 costs seconds on two busy cores and the tool needs hundreds.
    Full reorthogonalisation keeps the Ritz values honest; iteration stops
    when the largest |Ritz value| changes by less than ``tol`` (relative) or
    the Krylov space is exhausted (then it is exact).
    """
    if a.dim() != 2 or a.shape[0] != a.shape[1]:
        raise ValueError(f"a must be square (n, n), got shape {tuple(a.shape)}")
    a = a.to(torch.float64)
    n = a.shape[0]
    m = min(n, max_iter)
    gen = torch.Generator().manual_seed(0)
    basis = torch.zeros(m + 1, n, dtype=torch.float64)
    v = torch.randn(n, generator=gen, dtype=torch.float64)
    basis[0] = v / v.norm()
    alphas: list[float] = []
    betas: list[float] = []
    prev = -1.0
    for k in range(m):
        w = a @ basis[k]
        alphas.append(float(w @ basis[k]))
        for _ in range(2):  # twice is enough (Kahan-Parlett)
            w = w - basis[: k + 1].T @ (basis[: k + 1] @ w)
        beta = float(w.norm())
        done = beta <= 1e-14 * max(1.0, abs(alphas[0]))
        if k % 8 == 7 or done or k == m - 1:
            tri = torch.diag(torch.tensor(alphas, dtype=torch.float64))
            if betas:
                off = torch.tensor(betas, dtype=torch.float64)
                tri = tri + torch.diag(off, 1) + torch.diag(off, -1)
            est = float(torch.linalg.eigvalsh(tri).abs().max())
            if done or abs(est - prev) <= tol * max(est, 1e-300):
                return est
            prev = est
        basis[k + 1] = w / beta
        betas.append(beta)
    return prev


# ---------------------------------------------------------------------------
# Mask error, block sizes, output error.
# ---------------------------------------------------------------------------


def mask_error(
    sigma: float,
    n: int,
    samples: Sequence[int],
    seeds: Sequence[int] | int,
    sampler: str = "iid",
    spectral: bool = True,
) -> list[dict]:
    """``||L* - M~||`` (spectral and max norm) versus ``s`` for one scalar ``sigma``.

    Args:
        sigma: kernel scale (ALiBi slope ``1 / sigma``), one hash for all heads.
        n: number of positions (0..n-1).
        samples: increasing sample counts ``s``.
        seeds: seed list, or a count ``k`` meaning seeds ``0..k-1``.
        sampler: ``"iid"`` or ``"stratified"``.
        spectral: also compute the spectral norm (the max norm is nearly free).
    Returns:
        One record per ``s``: mean and standard deviation over seeds of each
        norm, the paper's bound, and the per-seed values.
    """
    samples = _check_samples(samples)
    seeds = _check_seeds(seeds)
    target = alibi_weights(torch.tensor([1.0 / sigma], dtype=torch.float64), torch.arange(n))  # (1, n, n)
    per_s: dict[int, dict[str, list[float]]] = {s: {"max": [], "spectral": []} for s in samples}
    for seed in seeds:
        for s, approx in averaged_masks(sigma, n, samples, seed, sampler):
            diff = (target - approx)[0]
            per_s[s]["max"].append(float(diff.abs().max()))
            if spectral:
                per_s[s]["spectral"].append(symmetric_spectral_norm(diff))
    records = []
    for s in samples:
        rec = {"sigma": float(sigma), "n": n, "s": s, "sampler": sampler, "seeds": len(seeds),
               "bound": paper_bound(sigma, n, s)}
        for norm, vals in per_s[s].items():
            if vals:
                rec.update(_summary(norm, vals))
        records.append(rec)
    return records


def max_block_size(
    sigma: float, n: int, seeds: Sequence[int] | int, num_samples: int = 1, sampler: str = "iid"
) -> dict:
    """Largest block among positions 0..n-1 over ``num_samples`` samples, per seed.

    Returns mean / max / per-seed largest block, the mean block length, and
    the reference scale ``sigma * log(log(n))`` of the paper's claim.
    A block is cut by the range's ends, so for ``n`` much larger than the
    pitch the largest block is about the largest pitch drawn: Gamma(2, sigma)
    maxima grow like ``sigma * log(num_samples)``, not with ``n``.
    """
    if n < 3:
        raise ValueError(f"n must be >= 3 so that log(log(n)) > 0, got {n}")
    seeds = _check_seeds(seeds)
    positions = torch.arange(n)
    largest, mean_len = [], []
    for seed in seeds:
        hash_ = PositionalLSH(float(sigma), num_samples, seed, sampler)
        big, blocks = 0, 0
        # In chunks of samples: (s, n) bucket ids of s = 1024, n = 65536 would
        # be 0.5 GB at once.
        for lo in range(0, num_samples, _CHUNK):
            b = hash_.buckets(positions, slice(lo, lo + _CHUNK))[:, 0]  # (chunk, n)
            # Block starts per row, with a sentinel at n; lengths are the gaps
            # between consecutive starts of the same row (row-major order).
            edge = torch.ones(b.shape[0], 1, dtype=torch.bool)
            starts = torch.nonzero(torch.cat([block_starts(b), edge], dim=1))  # (K, 2)
            same_row = starts[1:, 0] == starts[:-1, 0]
            length = (starts[1:, 1] - starts[:-1, 1])[same_row]
            big = max(big, int(length.max()))
            blocks += int(same_row.sum())
        largest.append(big)
        mean_len.append(n * num_samples / blocks)
    scale = sigma * math.log(math.log(n))
    return {"sigma": float(sigma), "n": n, "num_samples": num_samples, "sampler": sampler,
            "seeds": len(seeds), "sigma_loglogn": scale, "mean_block": sum(mean_len) / len(mean_len),
            **_summary("largest", [float(x) for x in largest]),
            "largest_max": max(largest), "ratio_mean": sum(largest) / len(largest) / scale}


_CHUNK = 64  # samples per chunk in max_block_size


class _CachedAttention:
    """``dense_attention`` with the exponentiated logits computed once.

    ``T = D^-1 (E o W) V``: only ``W`` changes between calls, so keep
    ``E = exp(S - rowmax(S))`` (causal) in fp64.  Equal to
    :func:`plsh_dist.ops.reference.dense_attention` (tested).
    """

    def __init__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, softmax_scale: float | None):
        B, T, Hq, D = q.shape
        groups = Hq // k.shape[2]
        scale = softmax_scale if softmax_scale is not None else D**-0.5
        q64, k64, v64 = (x.to(torch.float64) for x in (q, k, v))
        self.v = repeat_kv(v64, groups)  # (B, T, Hq, D)
        logits = torch.einsum("bihd,bjhd->bhij", q64, repeat_kv(k64, groups)) * scale
        if causal:
            logits = logits.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
        self.e = torch.exp(logits - logits.amax(dim=-1, keepdim=True))  # (B, Hq, T, T)

    def __call__(self, weights: torch.Tensor) -> torch.Tensor:
        """(Hq or 1, T, T) weights -> (B, T, Hq, D) float64."""
        num = self.e * weights.to(torch.float64)[None]
        probs = num / num.sum(dim=-1, keepdim=True)
        return torch.einsum("bhij,bjhd->bihd", probs, self.v)


def output_error(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    sigma,
    samples: Sequence[int],
    seeds: Sequence[int] | int,
    sampler: str = "iid",
    causal: bool = True,
    softmax_scale: float | None = None,
) -> list[dict]:
    """``||T* - T~||`` of exact ALiBi attention and positional LSH attention.

    Args:
        q: (B, T, Hq, D); k, v: (B, T, Hkv, D) (grouped-query attention allowed).
        sigma: a float (one hash shared by all heads) or Tensor[Hq] (per head;
            ALiBi's ``1 / alibi_slopes(Hq)``).
        samples, seeds, sampler: as in :func:`mask_error`.
    Returns:
        One record per ``s``: relative Frobenius error ``||T* - T~||_F / ||T*||_F``
        and max error ``max |T* - T~|``, mean and std over seeds; and
        ``rel_fro_batch_mean`` / ``_std``, the relative error of each batch
        element alone (a batch may stack sources, e.g. layers: the masks are
        drawn once for all of them).

    T~ is dense attention with ``M~`` as the weights, which is what the
    positional LSH operator computes (its tests compare against exactly that).
    """
    B, T, Hq, D = q.shape
    sig = _as_sigma(sigma)
    if sig.numel() not in (1, Hq):
        raise ValueError(f"sigma has {sig.numel()} entries; give a float or one per query head ({Hq})")
    samples = _check_samples(samples)
    seeds = _check_seeds(seeds)
    attn = _CachedAttention(q, k, v, causal, softmax_scale)
    exact = attn(alibi_weights(1.0 / sig, torch.arange(T)))
    per_s: dict[int, list[dict]] = {s: [] for s in samples}
    for seed in seeds:
        for s, approx_mask in averaged_masks(sig, T, samples, seed, sampler):
            per_s[s].append(_output_errors(exact, attn(approx_mask)))
    return [{"s": s, "sampler": sampler, "seeds": len(seeds), "T": T, "heads": Hq, **_output_summary(per_s[s])}
            for s in samples]


def _output_errors(exact: torch.Tensor, approx: torch.Tensor) -> dict:
    """Relative Frobenius error (all, and per batch element) and max error of (B, T, H, D) outputs."""
    err = exact - approx
    per_batch = err.flatten(1).norm(dim=1) / exact.flatten(1).norm(dim=1)
    return {"rel_fro": float(err.norm() / exact.norm()), "max": float(err.abs().max()), "batch": per_batch}


def _output_summary(errors: list[dict]) -> dict:
    """Mean and std over seeds of :func:`_output_errors`' values."""
    batch = torch.stack([e["batch"] for e in errors])  # (seeds, B)
    std = batch.std(dim=0) if len(errors) > 1 else torch.zeros(batch.shape[1], dtype=batch.dtype)
    return {**_summary("rel_fro", [e["rel_fro"] for e in errors]), **_summary("max", [e["max"] for e in errors]),
            "rel_fro_batch_mean": batch.mean(dim=0).tolist(), "rel_fro_batch_std": std.tolist()}


# ---------------------------------------------------------------------------
# The deterministic baseline at the same cost: truncated ALiBi.
# ---------------------------------------------------------------------------

#: ``sampler`` of the truncated-ALiBi records (not a sampler of the hash).
TRUNCATED = "truncated"


def truncated_weights(sigma, n: int, window: torch.Tensor) -> torch.Tensor:
    """``L*`` with the entries ``|i - j| >= w_h`` set to 0, float64 (H, n, n).

    Args:
        sigma: float or Tensor[H]; window: LongTensor[H] (or [1]), one window per head.
    """
    sig = _as_sigma(sigma)
    window = torch.as_tensor(window, dtype=torch.long).reshape(-1)
    if window.numel() != sig.numel() or bool((window < 1).any()):
        raise ValueError(f"window must hold one int >= 1 per head ({sig.numel()}), got {window.tolist()}")
    return alibi_weights(1.0 / sig, torch.arange(n), window=window)


def truncated_mask_error(
    sigma: float, n: int, samples: Sequence[int], spectral: bool = True, windows: Sequence[int] | None = None
) -> list[dict]:
    """``||L* - L*_w||`` (spectral and max norm) for the window of each ``s``, one scalar ``sigma``.

    ``w = ceil((ln s + 0.58) sigma)``, or ``windows[i]`` for ``samples[i]`` (e.g. a
    sampler's measured band).  Deterministic, so one "seed" and std 0; the
    records have :func:`mask_error`'s keys plus ``window``.  The max norm is
    ``exp(-w / sigma)`` exactly while ``w < n`` (the largest dropped entry).
    """
    samples = _check_samples(samples)
    windows = _check_windows(windows, samples)
    target = alibi_weights(torch.tensor([1.0 / sigma], dtype=torch.float64), torch.arange(n))[0]
    records = []
    for s, given in zip(samples, windows):
        window = equal_cost_window(float(sigma), s) if given is None else torch.tensor([given])
        diff = target - truncated_weights(float(sigma), n, window)[0]
        rec = {"sigma": float(sigma), "n": n, "s": s, "sampler": TRUNCATED, "window": int(window), "seeds": 1,
               "bound": paper_bound(sigma, n, s), **_summary("max", [float(diff.abs().max())])}
        if spectral:
            rec.update(_summary("spectral", [symmetric_spectral_norm(diff)]))
        records.append(rec)
    return records


def truncated_output_error(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    sigma,
    samples: Sequence[int],
    causal: bool = True,
    softmax_scale: float | None = None,
    windows: Sequence[int] | None = None,
) -> list[dict]:
    """``||T* - T_w||`` of exact ALiBi and ALiBi truncated at the window of each ``s``.

    Arguments and records as :func:`output_error` (``sampler="truncated"``, one
    "seed", std 0), plus ``window``: the per-head windows
    ``w_h = ceil((ln s + 0.58) sigma_h)``, or ``windows[i]`` (one int for every
    head) for ``samples[i]``.
    """
    B, T, Hq, D = q.shape
    sig = _as_sigma(sigma)
    if sig.numel() not in (1, Hq):
        raise ValueError(f"sigma has {sig.numel()} entries; give a float or one per query head ({Hq})")
    samples = _check_samples(samples)
    windows = _check_windows(windows, samples)
    attn = _CachedAttention(q, k, v, causal, softmax_scale)
    exact = attn(alibi_weights(1.0 / sig, torch.arange(T)))
    records = []
    for s, given in zip(samples, windows):
        window = equal_cost_window(sig, s) if given is None else torch.full((sig.numel(),), given)
        errors = _output_errors(exact, attn(truncated_weights(sig, T, window)))
        records.append({"s": s, "sampler": TRUNCATED, "seeds": 1, "T": T, "heads": Hq,
                        "window": window.tolist() if window.numel() > 1 else int(window),
                        **_output_summary([errors])})
    return records


# ---------------------------------------------------------------------------
# Curves.
# ---------------------------------------------------------------------------


def fit_loglog_slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Least-squares slope of log(y) against log(x)."""
    if len(xs) != len(ys) or len(xs) < 2:
        raise ValueError(f"need >= 2 matching points, got {len(xs)} and {len(ys)}")
    lx = torch.tensor([math.log(x) for x in xs], dtype=torch.float64)
    ly = torch.tensor([math.log(y) for y in ys], dtype=torch.float64)
    lx, ly = lx - lx.mean(), ly - ly.mean()
    return float((lx * ly).sum() / (lx * lx).sum())


def samples_to_match(records: list[dict], level: float, key: str = "max_mean") -> float | None:
    """Smallest ``s`` at which the curve ``records[key]`` reaches ``level``.

    Interpolated log-log between the two measured ``s`` around the crossing
    (the curve is close to a power law there); None if never reached.
    """
    pts = sorted((r["s"], r[key]) for r in records)
    if pts[0][1] <= level:
        return float(pts[0][0])
    for (s0, e0), (s1, e1) in zip(pts, pts[1:]):
        if e1 <= level:
            if e1 == e0:
                return float(s1)
            frac = (math.log(level) - math.log(e0)) / (math.log(e1) - math.log(e0))
            return float(math.exp(math.log(s0) + frac * (math.log(s1) - math.log(s0))))
    return None


# ---------------------------------------------------------------------------
# Argument checks.
# ---------------------------------------------------------------------------


def _summary(name: str, vals: list[float]) -> dict:
    t = torch.tensor(vals, dtype=torch.float64)
    std = float(t.std()) if t.numel() > 1 else 0.0
    return {f"{name}_mean": float(t.mean()), f"{name}_std": std, f"{name}_values": vals}


def _check_samples(samples: Sequence[int]) -> list[int]:
    samples = [int(s) for s in samples]
    if not samples or any(s < 1 for s in samples) or samples != sorted(set(samples)):
        raise ValueError(f"samples must be strictly increasing ints >= 1, got {samples}")
    return samples


def _check_windows(windows: Sequence[int] | None, samples: list[int]) -> list[int | None]:
    if windows is None:
        return [None] * len(samples)
    windows = [int(w) for w in windows]
    if len(windows) != len(samples) or any(w < 1 for w in windows):
        raise ValueError(f"windows must be one int >= 1 per s ({len(samples)}), got {windows}")
    return windows


def _check_seeds(seeds: Sequence[int] | int) -> list[int]:
    if isinstance(seeds, int):
        if seeds < 1:
            raise ValueError(f"seeds as a count must be >= 1, got {seeds}")
        return list(range(seeds))
    seeds = [int(x) for x in seeds]
    if not seeds:
        raise ValueError("seeds must not be empty")
    return seeds
