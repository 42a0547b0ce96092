"""Positional LSH: hash token positions into contiguous blocks.

Random binning of the Laplacian kernel on the line (Rahimi & Recht, 2007):
for each (sample t, head h) draw a pitch ``delta ~ Gamma(shape=2, scale=sigma_h)``
and a shift ``u ~ Uniform[0, delta)``; position ``p`` goes to bucket
``floor((p - u) / delta)``.  Then

    P[bucket(i) == bucket(j)] = E[max(0, 1 - |i - j| / delta)] = exp(-|i - j| / sigma)

which is ALiBi's multiplicative weight with ``sigma_h = 1 / m_h``.  Buckets are
monotone in position, so every bucket is a contiguous run (a block).

Randomness is a pure function of (seed, sample, head): the pitch and shift of
sample ``t`` and head ``h`` come from a counter-based generator (SplitMix64 of
the tuple), never from a stateful RNG, so any rank, any sub-range of positions
and any resumed run sees exactly the same blocks.

Shape legend: s = num_samples, H = hash heads (1 for a shared float sigma),
n = number of positions.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import torch

from plsh_dist.splitmix import MASK64, splitmix64

__all__ = [
    "alibi_slopes",
    "PositionalLSH",
    "FixedBlocks",
    "SAMPLERS",
    "cu_seqlens_from_buckets",
    "block_starts",
    "block_ends",
]

#: Samplers of :class:`PositionalLSH` (``sampler=``).
SAMPLERS = ("iid", "stratified", "stratified_ramp", "stratified_ramp_alt")

def alibi_slopes(num_heads: int) -> torch.Tensor:
    """ALiBi slopes of Press et al. (2022), Tensor[H] float32.

    For a power of two ``n`` the slopes are the geometric sequence starting at
    ``2^(-8/n)``; otherwise take the slopes of the closest smaller power of two
    and fill up with every other slope of twice that power.
    """
    if not isinstance(num_heads, int) or num_heads < 1:
        raise ValueError(f"num_heads must be a positive int, got {num_heads!r}")

    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-(2.0 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    def slopes(n: int) -> list[float]:
        if math.log2(n).is_integer():
            return power_of_two(n)
        closest = 2 ** math.floor(math.log2(n))
        return power_of_two(closest) + slopes(2 * closest)[0::2][: n - closest]

    return torch.tensor(slopes(num_heads), dtype=torch.float32)


# ---------------------------------------------------------------------------
# Counter-based randomness: uniform(seed, sample, head, stream) in (0, 1).
# ---------------------------------------------------------------------------


def counter_uniform(seed: int, samples: np.ndarray, heads: np.ndarray, stream: int) -> np.ndarray:
    """Float64 uniforms in the open interval (0, 1), one per (sample, head).

    A pure function of (seed, sample, head, stream): the same inputs give the
    same numbers on every machine, independent of how many samples or heads
    are asked for at once.
    """
    key = splitmix64(np.full(samples.shape, int(seed) & MASK64, dtype=np.uint64))
    key = splitmix64(key ^ samples.astype(np.uint64))
    key = splitmix64(key ^ heads.astype(np.uint64))
    key = splitmix64(key ^ np.uint64(stream))
    # 53 random bits -> (0, 1), never exactly 0 or 1 (so log() below is finite).
    return ((key >> np.uint64(11)).astype(np.float64) + 0.5) / float(1 << 53)


def _as_sigma(sigma: float | Sequence[float] | torch.Tensor) -> torch.Tensor:
    """sigma -> float64 Tensor[H] (H = 1 for a scalar), validated."""
    if isinstance(sigma, torch.Tensor):
        sig = sigma.detach().to("cpu", torch.float64).reshape(-1)
        if sigma.dim() > 1:
            raise ValueError(f"sigma must be a float or a 1-D Tensor[H], got shape {tuple(sigma.shape)}")
    elif isinstance(sigma, (int, float)):
        sig = torch.tensor([float(sigma)], dtype=torch.float64)
    else:
        sig = torch.tensor(list(sigma), dtype=torch.float64)
    if sig.numel() == 0:
        raise ValueError("sigma must not be empty")
    if not bool(torch.isfinite(sig).all()) or bool((sig <= 0).any()):
        raise ValueError(f"sigma must be finite and > 0 for every head, got {sig.tolist()}; "
                         "use alibi_slopes(H).reciprocal() for ALiBi's per-head scales")
    return sig


class PositionalLSH:
    """``s`` random binnings of positions (independent for "iid"), per head.

    Args:
        sigma: kernel scale. A float gives one hash shared by all heads
            (``H = 1``: one varlen call serves every head); a Tensor[H] gives an
            independent hash per head (ALiBi: ``sigma_h = 1 / slope_h``).
        num_samples: ``s``, the number of masks averaged.
        seed: any int; the masks are a pure function of (seed, sample, head,
            position).
        sampler: ``"iid"`` (the paper's estimator) or ``"stratified"``:
            ``round(sqrt(s))`` groups of samples each share one stratified
            pitch quantile and take equally spaced shifts; every sample's
            marginal is still exactly Gamma(2, sigma) x Uniform[0, delta), so
            M~ stays unbiased while its variance drops (the max-norm error of
            iid at s = 64 is reached at s ~ 14-18).
            ``"stratified_ramp"``: the same shared-pitch groups, fewer of
            them with sizes growing with the pitch quantile and antithetic
            pitch jitter (see :meth:`_ramp_unit_draws`); unbiased likewise.
            ``"stratified_ramp_alt"``: the ramp's groups, sizes and shifts, but
            one pitch jitter for all groups, alternating ``v, 1 - v`` between
            neighbouring strata (see :meth:`_ramp_unit_draws`); unbiased
            likewise.
    """

    def __init__(self, sigma, num_samples: int, seed: int = 0, sampler: str = "iid"):
        self.sigma = _as_sigma(sigma)
        if not isinstance(num_samples, int) or num_samples < 1:
            raise ValueError(f"num_samples must be an int >= 1, got {num_samples!r}")
        if sampler not in SAMPLERS:
            raise ValueError(f"sampler must be one of {SAMPLERS}, got {sampler!r}")
        self.num_samples = num_samples
        self.seed = int(seed)
        self.sampler = sampler
        self.pitch, self.shift = self._draw()  # float64 Tensor[s, H] each

    @property
    def num_heads(self) -> int:
        """H of the buckets: 1 for a shared float sigma, else len(sigma)."""
        return self.sigma.numel()

    def _draw(self) -> tuple[torch.Tensor, torch.Tensor]:
        s, H = self.num_samples, self.num_heads
        t, h = np.meshgrid(np.arange(s), np.arange(H), indexing="ij")
        if self.sampler == "iid":
            a = counter_uniform(self.seed, t, h, 0)
            b = counter_uniform(self.seed, t, h, 1)
            c = counter_uniform(self.seed, t, h, 2)
            # Gamma(2, 1) = sum of two Exp(1).
            gamma = -np.log(a) - np.log(b)
        elif self.sampler == "stratified_ramp":
            gamma, c = self._ramp_unit_draws(t, h)
        elif self.sampler == "stratified_ramp_alt":
            gamma, c = self._ramp_unit_draws(t, h, jitter="alternate")
        else:
            gamma, c = self._stratified_unit_draws(t, h)
        pitch = torch.from_numpy(gamma) * self.sigma[None, :]
        shift = torch.from_numpy(c) * pitch
        return pitch, shift

    def _stratified_unit_draws(self, t: np.ndarray, h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Grouped, stratified Gamma(2, 1) draws and unit shifts, ndarray[s, H] each.

        Independent stratification of pitch and shift barely helps: for a pair
        ``(i, j)`` the shift's collision window sits at ``frac(i / delta)``,
        which moves with every pitch, so stratified shifts of different
        pitches do not cancel (measured: max-norm error at s = 16 within 3% of
        i.i.d.).  Shifts only cancel under a shared pitch.  So:

        - the ``s`` samples form ``G = round(sqrt(s))`` groups of consecutive
          samples, sizes ``k_g`` as even as possible (``s // G`` or one more);
        - group ``g`` of head ``h`` takes one pitch quantile from stratum
          ``perm_h(g)`` of ``G`` equal strata, uniformly jittered inside it;
        - its ``k_g`` samples share that pitch and take the equally spaced unit
          shifts ``frac(c_g + m / k_g)``, ``m < k_g``, ``c_g ~ U(0, 1)``: the
          collision fraction of a pair is then ``max(0, 1 - d / delta)`` up
          to one ``1 / k_g`` step, whatever ``i``.

        Each sample's marginal is exact: with ``perm_h`` a uniform random
        permutation the quantile is U(0, 1), and ``frac(c_g + m / k_g)`` is
        U(0, 1) independently of it, so every sample is Gamma(2, sigma) x
        Uniform[0, delta) and E[M~] = L* exactly.  ``G ~ k ~ sqrt(s)`` balances
        the pitch part (falls with ``G``) against the shift part (falls with
        ``k``); measured best among k in {2..32} at s = 16 and 64.
        """
        s = self.num_samples
        num_groups = max(1, round(math.sqrt(s)))
        # Sizes as even as possible (differ by at most one): the first
        # ``s % G`` groups hold ``s // G + 1`` samples, the others ``s // G``.
        sizes = np.full(num_groups, s // num_groups)
        sizes[: s % num_groups] += 1
        first = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        group = np.searchsorted(first, t, side="right") - 1  # (s, H)
        member = t - first[group]
        group_size = sizes[group]
        g, hg = np.meshgrid(np.arange(num_groups), h[0], indexing="ij")  # (G, H)
        stratum = np.argsort(counter_uniform(self.seed, g, hg, 5), axis=0)
        quantile = (stratum + counter_uniform(self.seed, g, hg, 3)) / num_groups
        base_shift = counter_uniform(self.seed, g, hg, 4)
        # x - floor(x) is exact for x in [0, 2), so the shift stays in [0, 1).
        unit_shift = np.mod(base_shift[group, h] + member / group_size, 1.0)
        return _gamma2_ppf(quantile)[group, h], unit_shift

    def _ramp_unit_draws(self, t: np.ndarray, h: np.ndarray, jitter: str = "mirror") -> tuple[np.ndarray, np.ndarray]:
        """Ramped, antithetic stratified Gamma(2, 1) draws and unit shifts, ndarray[s, H] each.

        Why: with ``k`` equally spaced shifts under one pitch, a group's
        collision fraction of a pair is off by ``(B - f) / k``, ``B`` a coin
        and ``f`` the fractional part of ``k (1 - d / delta)``; weighted by
        its share ``k / s`` of the samples, each group adds ``(B - f) / s``
        whatever its size.  Over ``n`` positions some pair sees every group's
        error with the same sign, so the max-norm error of the shift part is
        about ``0.75 G / s``: fewer groups help, while the pitch part (a
        ``G``-point quadrature of ``E[max(0, 1 - d / delta)]``) wants more.
        So, against :meth:`_stratified_unit_draws`:

        - ``G = round(0.75 sqrt(s))`` groups (fewer), sizes ``k_g``
          proportional to ``g + 1`` (a ramp: more shifts under the larger
          pitches), each at least 1;
        - group ``g`` owns the pitch-quantile stratum
          ``[K_g / s, (K_g + k_g) / s)`` (``K_g`` = samples in the groups
          before it), the width of its share of the samples;
        - the jitters of groups ``g`` and ``G - 1 - g`` are antithetic
          (``v`` and ``1 - v`` inside their strata; the collision fraction
          is monotone in the pitch, so their errors partly cancel);
        - each group's ``k_g`` samples share that pitch and take the equally
          spaced unit shifts ``frac(c_g + m / k_g)``;
        - which sample falls in which group's slot is a uniform random
          permutation per head.

        Unbiased: given its stratum a group's quantile is uniform there (``v``
        and ``1 - v`` are both U(0, 1)), and its shifts are U(0, 1) given the
        pitch, so ``E[M~] = sum_g (k_g / s) E[M | stratum g] = L*``; with the
        random slot each sample's own marginal is exactly Gamma(2, sigma) x
        Uniform[0, delta) too.  The sizes and ``0.75`` are measured choices
        (``launchers/sampler_ratio.py``).

        ``jitter="alternate"`` (sampler ``"stratified_ramp_alt"``) replaces the
        mirror pairs by antithetic *neighbours*: one ``v ~ U(0, 1)`` per head
        for all groups, group ``g`` at ``v`` for even ``g`` and ``1 - v`` for
        odd ``g``.  The collision fraction ``max(0, 1 - d / delta)`` has
        nearly the same slope in the quantile over two adjacent strata, so
        their first-order jitter errors cancel, while the mirror pair
        ``g, G - 1 - g`` sits where the slopes differ most.  Still unbiased
        by the same argument: each group's ``v`` or ``1 - v`` is U(0, 1), so
        its quantile is uniform in its stratum, and the shifts are U(0, 1)
        given the pitch; the groups' jitters are dependent, which stratified
        sampling allows (``E[M~]`` is a sum of per-group expectations).
        Measured (n = 1024, 20 seeds): about 1.1x fewer samples than the
        mirror jitter at sigma >= 8 (``results/sampler/``).
        """
        if jitter not in ("mirror", "alternate"):
            raise ValueError(f"jitter must be 'mirror' or 'alternate', got {jitter!r}")
        s = self.num_samples
        num_groups = max(1, round(0.75 * math.sqrt(s)))
        sizes = _ramp_sizes(s, num_groups)
        first = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        g, hg = np.meshgrid(np.arange(num_groups), h[0], indexing="ij")  # (G, H)
        if jitter == "alternate":
            v = counter_uniform(self.seed, np.zeros_like(g), hg, 6)  # one v per head, (G, H)
            v = np.where(g % 2 == 1, 1.0 - v, v)
        else:
            mirror = num_groups - 1 - g
            v = counter_uniform(self.seed, np.minimum(g, mirror), hg, 6)
            v = np.where(g > mirror, 1.0 - v, v)
        quantile = (first[g] + sizes[g] * v) / s
        base_shift = counter_uniform(self.seed, g, hg, 7)
        # slot[t, h]: rank of sample t among the head's s uniforms, a uniform random permutation.
        slot = np.argsort(np.argsort(counter_uniform(self.seed, t, h, 8), axis=0, kind="stable"), axis=0,
                          kind="stable")
        group = np.searchsorted(first, slot, side="right") - 1
        member = slot - first[group]
        unit_shift = np.mod(base_shift[group, h] + member / sizes[group], 1.0)
        return _gamma2_ppf(quantile)[group, h], unit_shift

    # -- buckets and blocks -------------------------------------------------

    def buckets(self, positions: torch.Tensor, samples: slice | None = None) -> torch.Tensor:
        """Bucket ids, LongTensor[s, H, n], for a LongTensor[n] of positions.

        Computed on ``positions``' device. Element-wise in position, so a
        sub-range of positions gives exactly the slice of the full range's
        buckets. ``samples`` (a slice) computes only those samples' rows,
        exactly ``buckets(positions)[samples]``.
        """
        if positions.dim() != 1:
            raise ValueError(f"positions must be 1-D LongTensor[n], got shape {tuple(positions.shape)}")
        pitch, shift = (self.pitch, self.shift) if samples is None else (self.pitch[samples], self.shift[samples])
        # non_blocking: a host-to-device copy that does not wait for queued GPU work
        pitch = pitch.to(positions.device, non_blocking=True)[:, :, None]
        shift = shift.to(positions.device, non_blocking=True)[:, :, None]
        return _bucket(positions[None, None, :], pitch, shift)

    def sample_buckets(self, positions: torch.Tensor, sample: int) -> torch.Tensor:
        """Bucket ids of one sample, LongTensor[H, n]: exactly ``buckets(positions)[sample]``
        (same arithmetic), without computing the other samples."""
        return self.buckets(positions, slice(sample, sample + 1))[0]

    def bucket_of(self, p_SH: torch.Tensor) -> torch.Tensor:
        """Bucket of one position per (sample, head), LongTensor[s, H] for a
        LongTensor[s, H] (CPU): the same arithmetic as :meth:`buckets`, element
        by element, so the two agree bit for bit."""
        return _bucket(p_SH, self.pitch, self.shift)

    def bucket_start(self, b_SH: torch.Tensor) -> torch.Tensor:
        """Smallest integer position whose bucket is >= ``b``, LongTensor[s, H]."""
        return _bucket_start(b_SH, self.pitch, self.shift)

    def block_bounds(self, positions: torch.Tensor, head: int, ends: bool = True):
        """First position of the block holding each of ``positions`` (CPU LongTensor[m]) and
        (``ends``) the first position after it, LongTensor[s, m] each (None when not
        ``ends``), in every sample of hash head ``head``.

        O(s m) without the buckets of any other position, so a query chunk can
        find its blocks without the whole sequence's tables.
        """
        pitch, shift = self.pitch[:, head : head + 1], self.shift[:, head : head + 1]
        b = _bucket(positions[None, :], pitch, shift)
        return _bucket_start(b, pitch, shift), _bucket_start(b + 1, pitch, shift) if ends else None

    def block_start_of(self, position: int) -> torch.Tensor:
        """First position of the block holding ``position``, LongTensor[s, H] (one per sample and head)."""
        return self.bucket_start(self.bucket_of(torch.full(self.shift.shape, position, dtype=torch.long)))

    def next_block_start(self, position: int) -> torch.Tensor:
        """First position after the block holding ``position``, LongTensor[s, H]."""
        return self.bucket_start(self.bucket_of(torch.full(self.shift.shape, position, dtype=torch.long)) + 1)

    def cu_seqlens(self, positions: torch.Tensor) -> list[list[torch.Tensor]]:
        """Block boundaries as int32 offsets ``[0, ..., n]``, indexed [sample][head].

        ``positions`` must be increasing (a contiguous or gapped range), so
        each bucket is one contiguous run of indices.
        """
        b = self.buckets(positions)
        return [[cu_seqlens_from_buckets(b[t, h]) for h in range(b.shape[1])] for t in range(b.shape[0])]

    def averaged_mask(self, positions: torch.Tensor) -> torch.Tensor:
        """M~ = (1/s) sum_t [bucket_t(i) == bucket_t(j)], float64 Tensor[H, n, n].

        Dense and O(n^2): for tests and the approximation tools only.
        """
        b = self.buckets(positions)
        same = (b[:, :, :, None] == b[:, :, None, :]).to(torch.float64)
        return same.mean(dim=0)

    def __repr__(self) -> str:
        sig = self.sigma.tolist()
        return f"{type(self).__name__}(sigma={sig if len(sig) > 1 else sig[0]}, num_samples={self.num_samples}, seed={self.seed})"


class FixedBlocks(PositionalLSH):
    """The paper's fixed-blocks baseline: pitch ``2 * sigma_h``, shift 0, one sample.

    Same interface as :class:`PositionalLSH`; nothing is random, so there is no seed.
    """

    def __init__(self, sigma):
        super().__init__(sigma, num_samples=1)

    def _draw(self) -> tuple[torch.Tensor, torch.Tensor]:
        pitch = (2.0 * self.sigma)[None, :].clone()
        return pitch, torch.zeros_like(pitch)


def _bucket(p: torch.Tensor, pitch: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """The bucket formula, ``floor((p - shift) / pitch)``, in float64 (broadcasting).

    Tensor / tensor in float64 is correctly rounded on CPU and CUDA alike, so
    every device computes the same buckets (a CPU *scalar* divisor would not
    do: CUDA turns it into a multiplication by the reciprocal).
    """
    return torch.floor((p.to(torch.float64) - shift) / pitch).to(torch.long)


def _bucket_start(b: torch.Tensor, pitch: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """Smallest integer position whose bucket is >= ``b`` (broadcasting with pitch, shift).

    The float estimate ``ceil(shift + b * pitch)`` can be off by one ulp's
    worth at a boundary, so it is corrected against :func:`_bucket` (the hash's
    own rule), which is monotone in position.
    """
    c = torch.ceil(shift + b.to(torch.float64) * pitch).to(torch.long)
    for _ in range(16):
        down = _bucket(c - 1, pitch, shift) >= b
        up = _bucket(c, pitch, shift) < b
        if not bool(down.any() or up.any()):
            return c
        c = c - down.long() + up.long()
    raise RuntimeError("bucket_start did not converge; pitch or position out of float64 range")


def block_starts(buckets: torch.Tensor) -> torch.Tensor:
    """True where a token starts a block, BoolTensor like ``buckets`` (non-decreasing
    LongTensor[..., n]): token 0 and every token whose bucket differs from the one before."""
    first = torch.ones_like(buckets[..., :1], dtype=torch.bool)
    return torch.cat([first, buckets[..., 1:] != buckets[..., :-1]], dim=-1)


def cu_seqlens_from_buckets(buckets: torch.Tensor) -> torch.Tensor:
    """Non-decreasing bucket ids LongTensor[n] -> int32 block offsets ``[0, b1, ..., n]``."""
    n = buckets.numel()
    if not n:
        return torch.zeros(1, dtype=torch.int32, device=buckets.device)
    starts = torch.nonzero(block_starts(buckets)).flatten()
    end = torch.full((1,), n, dtype=starts.dtype, device=buckets.device)
    return torch.cat([starts, end]).to(torch.int32)


def block_ends(buckets: torch.Tensor) -> torch.Tensor:
    """Index of the last member of each token's block, LongTensor like ``buckets``
    (non-decreasing LongTensor[..., n])."""
    n = buckets.shape[-1]
    flat = buckets.reshape(-1, n).contiguous()
    return (torch.searchsorted(flat, flat, right=True) - 1).reshape(buckets.shape)


def _ramp_sizes(s: int, num_groups: int) -> np.ndarray:
    """Group sizes of the "stratified_ramp" sampler: proportional to 1, 2, ..., G,
    rounded by largest remainder to integers >= 1 that sum to ``s`` (``G <= s``)."""
    weight = np.arange(1, num_groups + 1, dtype=np.float64)
    raw = s * weight / weight.sum()
    sizes = np.maximum(1, np.floor(raw)).astype(np.int64)
    while sizes.sum() < s:
        sizes[np.argmax(raw - sizes)] += 1
    while sizes.sum() > s:
        sizes[np.argmax(np.where(sizes > 1, sizes - raw, -np.inf))] -= 1
    return sizes


def _gamma2_ppf(q: np.ndarray) -> np.ndarray:
    """Inverse CDF of Gamma(2, 1): solve 1 - (1 + x) e^{-x} = q by Newton, float64."""
    q = np.clip(q, 1e-300, 1.0 - 1e-16)
    # Start from the exponential tail / small-x expansion, then polish.
    x = np.where(q < 0.5, np.sqrt(2.0 * q), -np.log1p(-q) + np.log1p(-np.log1p(-q)))
    for _ in range(60):
        cdf = _gamma2_cdf(x)
        pdf = x * np.exp(-x)
        step = (cdf - q) / np.maximum(pdf, 1e-300)
        x_new = np.maximum(x - step, x * 0.5)
        # Quadratic convergence: a handful of steps; stop once nothing moves.
        if np.all(np.abs(x_new - x) <= 1e-15 * x):
            return x_new
        x = x_new
    return x


def _gamma2_cdf(x: np.ndarray) -> np.ndarray:
    """CDF of Gamma(2, 1), ``1 - (1 + x) e^{-x}``, accurate to a few ulps for every x >= 0.

    For x < 1 the closed form cancels (relative error ~eps / x, 5e-9 at
    q = 1e-15), so sum the positive series ``e^{-x} sum_{k>=2} x^k / k!``
    instead; 20 terms reach float64 precision there.
    """
    x = np.asarray(x, dtype=np.float64)
    xs = np.minimum(x, 1.0)
    term, series = xs * xs / 2.0, np.zeros_like(xs)
    for k in range(3, 23):
        series, term = series + term, term * xs / k
    return np.where(x < 1.0, np.exp(-xs) * series, -np.expm1(-x) - x * np.exp(-x))
