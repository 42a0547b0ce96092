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
from typing import Callable, ClassVar, NamedTuple, Sequence

import numpy as np
import torch

from plsh_dist.plugins import import_plugin_module
from plsh_dist.splitmix import MASK64, splitmix64

#: A sampler: ``draw(lsh, t, h) -> (gamma, unit_shift)``. ``t``, ``h``: int ndarray[s, H] of
#: sample and head indices; returns float64 ndarray[s, H] each: the pitches in units of sigma
#: (every sample's marginal must be Gamma(2, 1)) and the shifts in units of the pitch (U[0, 1)
#: given the pitch). Draw from :func:`counter_uniform` with ``lsh.seed`` so the masks stay a
#: pure function of (seed, sample, head); streams 0-8 are taken.
SamplerDraw = Callable[["PositionalLSH", np.ndarray, np.ndarray], "tuple[np.ndarray, np.ndarray]"]

#: A sampler's device form: ``device_draw(lsh, device) -> (gamma, unit_shift)``, float64 Tensor[s, H]
#: each on ``device``, equal to its :data:`SamplerDraw` over the full grid of (sample, head). It
#: reads ``lsh.num_samples``, ``lsh.num_heads`` and the seed as a tensor
#: (:func:`plsh_dist.ops.triton.device_draws.seed_on`), never ``lsh.seed``, ``lsh.sigma`` or
#: ``lsh.pitch`` (host reads), and draws with the kernels and rules of :mod:`plsh_dist.ops.triton.device_draws`.
SamplerDeviceDraw = Callable[["PositionalLSH", torch.device], "tuple[torch.Tensor, torch.Tensor]"]


class Sampler(NamedTuple):
    """A registered sampler: its numpy form and its device form (None: drawn on the host only)."""

    draw: SamplerDraw
    device_draw: SamplerDeviceDraw | None


#: Samplers of :class:`PositionalLSH` (``sampler=``) by name: this module's own (``"iid"``,
#: ``"stratified"``), and any that a module outside the package registers when it is imported
#: (:func:`register_sampler`). The registry imports no module by itself: a run config names the
#: module that defines its sampler (``[attention].sampler_module``, :func:`import_sampler_module`).
_SAMPLERS: dict[str, Sampler] = {}


def register_sampler(name: str, draw: SamplerDraw, device_draw: SamplerDeviceDraw | None = None) -> None:
    """Make ``sampler=name`` draw its pitches and shifts with ``draw`` (see :data:`SamplerDraw`) on the
    host, and with ``device_draw`` (see :data:`SamplerDeviceDraw`) where the fused kernel draws them on
    its device (a GPU: the default there).

    The device form draws what ``draw`` draws with no host read or copy once its constants are on the
    device, so a compiled step (a CUDA graph) draws each step's masks from the step's seed. Write it
    with :mod:`plsh_dist.ops.triton.device_draws` (``uniforms``, ``log``, ``gamma2_ppf``, ``constants``,
    ``seed_on``) and correctly rounded torch ops, mirroring ``draw`` line by line; the package's
    samplers are examples. A sampler registered without
    one is refused on a GPU with a ValueError saying so (a host draw there would be copied at every
    call, and replayed stale by a captured graph); on a CPU its host draws serve.

    Registering a name twice with the same functions is a no-op (a module imported twice);
    with others it is an error, so a name always means one set of masks.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"sampler name must be a non-empty str, got {name!r}")
    entry = Sampler(draw, device_draw)
    known = _SAMPLERS.get(name, entry)
    if known.draw is not draw or known.device_draw is not device_draw:
        raise ValueError(f"sampler {name!r} is already registered with other draw functions")
    _SAMPLERS[name] = entry


def register_device_draw(name: str, device_draw: SamplerDeviceDraw) -> None:
    """Give the registered sampler ``name`` its device form (:data:`SamplerDeviceDraw`), where that form
    is defined apart from the sampler (the package's own: ``plsh_dist.ops.triton.device_draws``). The
    same form again is a no-op; another one is an error, as in :func:`register_sampler`."""
    known = _SAMPLERS.get(name)
    if known is None:
        raise ValueError(f"sampler {name!r} is not registered; register_sampler(name, draw) first")
    if known.device_draw not in (None, device_draw):
        raise ValueError(f"sampler {name!r} already has another device form")
    _SAMPLERS[name] = Sampler(known.draw, device_draw)


def import_sampler_module(module: str, setting: str = "sampler_module") -> None:
    """Import ``module``, which registers its samplers when imported (:func:`register_sampler`);
    ValueError naming ``setting`` and the fix when it cannot be (:mod:`plsh_dist.plugins`)."""
    import_plugin_module(module, setting, registers="samplers", register="plsh_dist.hashing.register_sampler",
                         example="mylab.samplers", own="plsh_dist's own samplers ('iid', 'stratified')")


def sampler_names() -> tuple[str, ...]:
    """Every sampler name registered so far, in registration order."""
    return tuple(_SAMPLERS)


def get_sampler(name: str, field: str = "sampler") -> SamplerDraw:
    """The draw function of sampler ``name``; a ValueError naming ``field`` (the config key)
    and the fix when no imported module has registered it."""
    if not isinstance(name, str) or name not in _SAMPLERS:
        raise ValueError(f"{field} must be one of {sampler_names()}, got {name!r}; a sampler defined outside "
                         f"plsh_dist registers itself when its module is imported (register_sampler): name that "
                         f"module in [attention].sampler_module (e.g. sampler_module = \"mylab.samplers\"), or "
                         f"import it before this call")
    return _SAMPLERS[name].draw


def get_device_draw(name: str) -> SamplerDeviceDraw | None:
    """The device form of sampler ``name`` (None where it registered none); a ValueError as
    :func:`get_sampler`'s when no imported module has registered it."""
    get_sampler(name)
    return _SAMPLERS[name].device_draw


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
        if sigma.dim() > 1:
            raise ValueError(f"sigma must be a float or a 1-D Tensor[H], got shape {tuple(sigma.shape)}")
        sig = sigma.detach().to("cpu", torch.float64).reshape(-1)
        values = sig.tolist()
    else:  # Python numbers are checked before any tensor is made (a traced graph makes a constant of them)
        values = [float(sigma)] if isinstance(sigma, (int, float)) else [float(x) for x in sigma]
        sig = None
    if not values:
        raise ValueError("sigma must not be empty")
    # checked in Python: no torch op per call (the ops rebuild a hash at every call)
    if not all(math.isfinite(x) and x > 0 for x in values):
        raise ValueError(f"sigma must be finite and > 0 for every head, got {values}; "
                         "use alibi_slopes(H).reciprocal() for ALiBi's per-head scales")
    return sig if sig is not None else torch.tensor(values, dtype=torch.float64)


class PositionalLSH:
    """``s`` random binnings of positions (independent for "iid"), per head.

    Args:
        sigma: kernel scale. A float gives one hash shared by all heads
            (``H = 1``: one varlen call serves every head); a Tensor[H] gives an
            independent hash per head (ALiBi: ``sigma_h = 1 / slope_h``).
        num_samples: ``s``, the number of masks averaged.
        seed: any int, or an int64 scalar tensor (on any device: the fused kernel's
            path draws on the device from it without reading it back); the masks are
            a pure function of (seed mod 2^64, sample, head, position).
        sampler: how the ``s`` pitches and shifts are drawn. ``"iid"`` (the
            paper's estimator) or ``"stratified"`` (:func:`_stratified_draws`:
            shared-pitch groups with stratified pitches and equally spaced
            shifts; every sample's marginal is still Gamma(2, sigma) x
            Uniform[0, delta), so M~ stays unbiased while its max-norm error
            drops). Other names come from :func:`register_sampler`.
    """

    fixed: ClassVar[bool] = False
    """The paper's fixed blocks (:class:`FixedBlocks`: no seed, one sample), not a random hash."""

    def __init__(self, sigma, num_samples: int, seed: int | torch.Tensor = 0, sampler: str = "iid"):
        # a device sigma stays there unread (checked when the host needs it), and so does any tensor sigma
        # while torch.compile traces: a graph can carry it
        unread = sigma.device.type != "cpu" or torch.compiler.is_compiling() if isinstance(sigma, torch.Tensor) else False
        self._sigma_in = sigma if unread else None
        self._sigma = None if self._sigma_in is not None else _as_sigma(sigma)
        if self._sigma_in is not None and (sigma.dim() > 1 or sigma.numel() == 0):
            raise ValueError(f"sigma must be a float or a non-empty 1-D Tensor[H], got shape {tuple(sigma.shape)}")
        if not isinstance(num_samples, int) or num_samples < 1:
            raise ValueError(f"num_samples must be an int >= 1, got {num_samples!r}")
        get_sampler(sampler)
        self.num_samples = num_samples
        if isinstance(seed, torch.Tensor):
            if seed.dtype != torch.int64 or seed.numel() != 1:
                raise ValueError(f"seed must be an int or an int64 scalar tensor, got {seed.dtype} of shape "
                                 f"{tuple(seed.shape)}")
            self._seed, self._seed_tensor = None, seed.reshape(())
        else:
            self._seed, self._seed_tensor = int(seed), None
        self.sampler = sampler
        self._draws: tuple[torch.Tensor, torch.Tensor] | None = None

    @property
    def sigma(self) -> torch.Tensor:
        """float64 Tensor[H] on the CPU (a device sigma is copied and checked here: a sync)."""
        if self._sigma is None:
            self._sigma = _as_sigma(self._sigma_in)
        return self._sigma

    @property
    def seed(self) -> int:
        """The seed as an int (a seed given as a device tensor is read here: a sync)."""
        if self._seed is None:
            self._seed = int(self._seed_tensor)
        return self._seed

    @property
    def seed_tensor(self) -> torch.Tensor:
        """The seed as an int64 scalar tensor, mod 2^64 as a signed int64 (where it was given, if a tensor)."""
        if self._seed_tensor is None:
            seed = self._seed & MASK64
            self._seed_tensor = torch.tensor(seed - (1 << 64) if seed >> 63 else seed, dtype=torch.int64)
        return self._seed_tensor

    @property
    def given(self) -> tuple[int | torch.Tensor, torch.Tensor]:
        """(seed, sigma) as given, unread: the int or tensor seed, and sigma's device tensor or its
        checked CPU copy (what identifies the hash without a device read)."""
        seed = self._seed if self._seed is not None else self._seed_tensor
        return seed, self._sigma_in if self._sigma_in is not None else self._sigma

    @property
    def pitch(self) -> torch.Tensor:
        """float64 Tensor[s, H]: every (sample, head)'s pitch, drawn on the host at first use."""
        return self._host_draws()[0]

    @property
    def shift(self) -> torch.Tensor:
        """float64 Tensor[s, H]: every (sample, head)'s shift in [0, pitch)."""
        return self._host_draws()[1]

    def _host_draws(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._draws is None:
            self._draws = self._draw()
        return self._draws

    @property
    def num_heads(self) -> int:
        """H of the buckets: 1 for a shared float sigma, else len(sigma)."""
        return (self._sigma if self._sigma is not None else self._sigma_in).numel()

    def _draw(self) -> tuple[torch.Tensor, torch.Tensor]:
        s, H = self.num_samples, self.num_heads
        t, h = np.meshgrid(np.arange(s), np.arange(H), indexing="ij")
        gamma, c = self._unit_draws(t, h)
        pitch = torch.from_numpy(gamma) * self.sigma[None, :]
        shift = torch.from_numpy(c) * pitch
        return pitch, shift

    def _unit_draws(self, t: np.ndarray, h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Unit pitches and shifts, ndarray[s, H] each, from the sampler (see :data:`SamplerDraw`)."""
        return get_sampler(self.sampler)(self, t, h)

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
        return _bucket_start_checked(b_SH, self.pitch, self.shift)

    def block_bounds(self, positions: torch.Tensor, head: int, ends: bool = True):
        """First position of the block holding each of ``positions`` (CPU LongTensor[m]) and
        (``ends``) the first position after it, LongTensor[s, m] each (None when not
        ``ends``), in every sample of hash head ``head``.

        O(s m) without the buckets of any other position, so a query chunk can
        find its blocks without the whole sequence's tables.
        """
        pitch, shift = self.pitch[:, head : head + 1], self.shift[:, head : head + 1]
        b = _bucket(positions[None, :], pitch, shift)
        starts = _bucket_start_checked(b, pitch, shift)
        return starts, _bucket_start_checked(b + 1, pitch, shift) if ends else None

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

    fixed = True

    def __init__(self, sigma):
        super().__init__(sigma, num_samples=1)

    def _draw(self) -> tuple[torch.Tensor, torch.Tensor]:
        pitch = (2.0 * self.sigma)[None, :].clone()
        return pitch, torch.zeros_like(pitch)


def bucket(p: torch.Tensor, pitch: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """The bucket formula, ``floor((p - shift) / pitch)``, float64 holding integers (broadcasting).

    The package's one copy of it: the host tables, the fused kernel's band tables and Flex's
    ``score_mod`` call it (torch ops only, so FlexAttention can trace it); the Triton kernels'
    copy (``table_kernels._bucket``) mirrors it and is held bit-equal by the tests.
    Tensor / tensor in float64 is correctly rounded on CPU and CUDA alike, so
    every device computes the same buckets (a CPU *scalar* divisor would not
    do: CUDA turns it into a multiplication by the reciprocal).
    """
    return torch.floor((p.to(torch.float64) - shift) / pitch)


def _bucket(p: torch.Tensor, pitch: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """:func:`bucket` as LongTensor bucket ids."""
    return bucket(p, pitch, shift).to(torch.long)


def _bucket_start_checked(b: torch.Tensor, pitch: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
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


def bucket_start(b: torch.Tensor, pitch: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """Smallest integer position whose bucket is >= ``b`` (float64 holding integers, broadcasting
    with pitch, shift), float64: :func:`_bucket_start_checked` without its convergence check (a
    host sync on CUDA), for the device tables.

    The estimate ``ceil(shift + b pitch)`` is within one position of the rule: its float64 error
    is a few ulps of numbers below 2^49 (positions below 2^31, pitches below 2^48), far less than
    one. So one correction against :func:`bucket` at the estimate minus one and at the estimate,
    counted in one pass, lands on it; the tests hold the result equal to
    ``PositionalLSH.block_bounds``. The Triton kernels' copy (``table_kernels._block_start``)
    mirrors it."""
    c = torch.ceil(shift + b * pitch)
    cand = c + torch.arange(-1, 1, dtype=c.dtype, device=c.device).view(2, *[1] * c.dim())  # c - 1, c
    return cand[0] + (bucket(cand, pitch, shift) < b).sum(0)


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


def gamma2_ppf(q: np.ndarray) -> np.ndarray:
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


# ---------------------------------------------------------------------------
# Samplers: (lsh, t, h) -> (unit pitch, unit shift), ndarray[s, H] each.
# ---------------------------------------------------------------------------


def _iid_draws(lsh: PositionalLSH, t: np.ndarray, h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The paper's estimator: every (sample, head) draws its own pitch and shift (streams 0-2)."""
    a = counter_uniform(lsh.seed, t, h, 0)
    b = counter_uniform(lsh.seed, t, h, 1)
    c = counter_uniform(lsh.seed, t, h, 2)
    # Gamma(2, 1) = sum of two Exp(1).
    return -np.log(a) - np.log(b), c


def _stratified_draws(lsh: PositionalLSH, t: np.ndarray, h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Grouped, stratified Gamma(2, 1) draws and unit shifts (streams 3-5).

    Why groups: for a pair ``(i, j)`` the shift's collision window sits at
    ``frac(i / delta)``, which moves with every pitch, so stratified shifts
    of different pitches do not cancel; shifts only cancel under a shared
    pitch. So:

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
    Uniform[0, delta) and E[M~] = L* exactly. ``G ~ k ~ sqrt(s)`` balances
    the pitch part of the error (falls with ``G``) against the shift part
    (falls with ``k``).
    """
    s = lsh.num_samples
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
    stratum = np.argsort(counter_uniform(lsh.seed, g, hg, 5), axis=0)
    quantile = (stratum + counter_uniform(lsh.seed, g, hg, 3)) / num_groups
    base_shift = counter_uniform(lsh.seed, g, hg, 4)
    # x - floor(x) is exact for x in [0, 2), so the shift stays in [0, 1).
    unit_shift = np.mod(base_shift[group, h] + member / group_size, 1.0)
    return gamma2_ppf(quantile)[group, h], unit_shift


# their device forms are registered where they are defined, by the module that draws on the device
# (plsh_dist.ops.triton.device_draws: register_device_draw), so this module imports nothing above it
register_sampler("iid", _iid_draws)
register_sampler("stratified", _stratified_draws)
