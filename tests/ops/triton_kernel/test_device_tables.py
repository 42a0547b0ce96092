"""The fused kernel's inputs built on the device: the hash's draws, the band tables, the layer seeds.

Pure data: compared with ``torch.equal`` against the host references (numpy draws,
``KernelBias.of``'s torch tables, ``hash_seed``) under Triton's interpreter. Then the op
itself on a device without a GPU: the meta device (tensors with a shape and no data, so any read
of their data fails, as ``FakeTensorMode`` would; its fake CUDA tensors need CUDA's device guards
for Python indexing), with the kernel launches recorded, not run and the strategy the table gives
CUDA: it must read nothing back to the host, and issue few eager ops."""

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

pytest.importorskip("triton")

from plsh_dist.hashing import (FixedBlocks, PositionalLSH, alibi_slopes, gamma2_ppf, get_device_draw,  # noqa: E402
                               get_sampler, sampler_names)
from plsh_dist.ops import alibi  # noqa: E402
from plsh_dist.ops.triton import device_draws  # noqa: E402
from plsh_dist.ops.triton import runtime  # noqa: E402
from plsh_dist.ops.triton import tile_bands  # noqa: E402
from plsh_dist.ops.triton import kernel_bias  # noqa: E402
from plsh_dist.ops.triton import near_runs  # noqa: E402
from plsh_dist.ops.triton import token_layout  # noqa: E402
from plsh_dist.ops.triton import cache as kernel_bias_cache  # noqa: E402
from plsh_dist.ops.triton import attention as triton_onepass  # noqa: E402
from plsh_dist.ops.custom_ops import layer_seed, signed64  # noqa: E402
from plsh_dist.ops.documents import Documents, flat_documents  # noqa: E402
from plsh_dist.ops.triton.kernel_bias import UNROLLED_SAMPLES, KernelBias, padded_samples  # noqa: E402
from plsh_dist.ops.triton.near_runs import NearBlocks  # noqa: E402
from plsh_dist.ops.plsh import block_attention_op, block_attention_op_backward  # noqa: E402
from plsh_dist.ops.triton.tile_bands import CountBias, WindowBias, block_bounds, tiles_for  # noqa: E402
from plsh_dist.ops.triton.token_layout import TokenLayout  # noqa: E402
from plsh_dist.splitmix import MASK64, hash_seed  # noqa: E402

from kernel_cases import kernel_device  # noqa: E402

CPU = torch.device("cpu")
SIGMA = torch.tensor([0.8, 3.0, 40.0, 700.0, 1e12], dtype=torch.float64)


@pytest.fixture(autouse=True)
def _interpreter():
    if kernel_device().type != "cpu":
        pytest.skip("compares the interpreter's arithmetic with the host's (the CUDA tests run the kernels)")


@pytest.mark.parametrize("seed", [0, 11, -5, 2**63 + 7, 2**64 - 1])
@pytest.mark.parametrize("samples", [1, 8, 100])
def test_hash_draws_equal_the_hosts(seed, samples):
    host = PositionalLSH(SIGMA, samples, seed)
    for given in (seed, host.seed_tensor.clone()):
        drawn = CountBias.of(PositionalLSH(SIGMA, samples, given), CPU, by="kernels")
        assert torch.equal(drawn.pitch, host.pitch) and torch.equal(drawn.shift, host.shift)
    shared = PositionalLSH(256.0, samples, seed)
    drawn = CountBias.of(shared, CPU, by="kernels")
    assert torch.equal(drawn.pitch, shared.pitch) and torch.equal(drawn.shift, shared.shift)


def test_fixed_blocks_draw_as_the_host():
    fixed = FixedBlocks(SIGMA)
    drawn = CountBias.of(fixed, CPU, by="kernels")
    assert torch.equal(drawn.pitch, fixed.pitch) and torch.equal(drawn.shift, fixed.shift)


@pytest.mark.parametrize("samples", [1, 2, 9, 100])
def test_every_samplers_device_form_draws_as_its_host_form(samples):
    """The package's samplers and the lab's (the suite's conftest imports them): the device form's unit
    draws, and the hash drawn on the device, equal the host's bit for bit under the interpreter."""
    names = sampler_names()
    assert {"iid", "stratified", "stratified_ramp", "stratified_ramp_alt"} <= set(names)
    for name in names:
        for seed in (0, -5, 2**63 + 7):
            host = PositionalLSH(SIGMA, samples, seed, sampler=name)
            t, h = np.meshgrid(np.arange(samples), np.arange(SIGMA.numel()), indexing="ij")
            gamma, unit_shift = get_sampler(name)(host, t, h)
            device_gamma, device_shift = get_device_draw(name)(PositionalLSH(SIGMA, samples, seed, name), CPU)
            assert np.array_equal(device_gamma.numpy(), gamma) and np.array_equal(device_shift.numpy(), unit_shift)
            for given in (seed, host.seed_tensor.clone()):
                drawn = CountBias.of(PositionalLSH(SIGMA, samples, given, sampler=name), CPU, by="kernels")
                assert torch.equal(drawn.pitch, host.pitch) and torch.equal(drawn.shift, host.shift), (name, seed)


def test_gamma2_ppf_on_the_device_is_the_hosts():
    """Over more than one block of the kernel's one program, with the clipped ends and both starting
    guesses: the same Newton steps, stopped when every element has converged."""
    q = np.random.default_rng(0).random(3000)
    q[:8] = [0.0, 1e-320, 1e-300, 1e-12, 0.5, 1.0 - 1e-16, 1.0 - 1e-17, 1.0]
    drawn = device_draws.gamma2_ppf(torch.from_numpy(q))
    assert np.array_equal(drawn.numpy(), gamma2_ppf(q))
    assert np.array_equal(device_draws.gamma2_ppf(torch.from_numpy(q[8:20])).numpy(), gamma2_ppf(q[8:20]))


def _documents(n: int) -> Documents:
    cu = torch.tensor([0, 1, 2, 40, 41, 97, n])
    lengths = cu[1:] - cu[:-1]
    return Documents.from_cu_seqlens(cu, torch.cat([torch.arange(int(L)) + 5 * i for i, L in enumerate(lengths)]))


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("layout_kind", ["row", "documents", "near_2_31"])
def test_tables_equal_the_torch_reference(causal, layout_kind):
    n = 150
    docs = _documents(n) if layout_kind == "documents" else None
    start = 2**31 - n - 1 if layout_kind == "near_2_31" else 1000
    positions = docs.positions if docs is not None else start + torch.arange(n)
    layout = TokenLayout.build(positions, CPU, docs)
    count = CountBias.of(PositionalLSH(SIGMA, 8, seed=11), CPU)
    # ALiBi windows: 1 (the token alone), short, wider than a tile, exact ALiBi's (every key)
    window = WindowBias.of(SIGMA[:4].float(), torch.tensor([1, 5, 40, 2**31 - 1]), CPU)
    for bias in (count, window):
        for head_dim in (64, 128):
            tiles = tiles_for(head_dim)
            ref, got = (KernelBias.of(bias, layout, causal, tiles, by=by) for by in ("torch", "kernels"))
            for name in ("fwd", "dkdv", "dq"):
                r, g = getattr(ref, name), getattr(got, name)
                assert torch.equal(r.lo, g.lo) and torch.equal(r.hi, g.hi), name
                # key spans, then (count) starts, lasts, row spans; (window) sigma, windows
                read = (0, 1, 2, 3) if bias is count else (0, 4, 5)
                for a, b in ((r.args[i], g.args[i]) for i in read):
                    assert a.dtype == b.dtype and torch.equal(a, b), name
                assert [a.dtype for a in r.args] == [b.dtype for b in g.args]  # one kernel build
                assert r.consts == g.consts


def _packed(B: int, T: int, cu: list[int]) -> torch.Tensor:
    """position_ids (B, T) of documents at offsets ``cu`` over the flat row, each from a position of its own."""
    flat = torch.zeros(B * T, dtype=torch.int64)
    for a, b in zip(cu[:-1], cu[1:]):
        flat[a:b] = torch.arange(b - a) + 3 * a
    return flat.view(B, T)


@pytest.mark.parametrize("offsets", [torch.int32, torch.int64])
def test_documents_laid_out_on_the_device_equal_the_hosts(offsets):
    """``TokenLayout.build_on_device`` (one launch) gives the host's layout of packed documents (1-token
    ones, a row of one document, documents across a 16-token program's edge): positions, documents,
    their first and end tokens equal; virtual positions strictly increasing, with a constant per
    document; the tables built from it equal the host layout's."""
    B, T, cu = 2, 50, [0, 1, 2, 30, 50, 51, 97, 100]
    position_ids = _packed(B, T, cu)
    docs = flat_documents(position_ids, torch.tensor(cu), B, T)
    host = TokenLayout.build(docs.positions, CPU, docs)
    device = TokenLayout.build_on_device(position_ids, torch.tensor(cu, dtype=offsets), B, T)
    for name in ("positions", "kernel_positions", "doc", "doc_first", "doc_end"):
        a, b = getattr(host, name), getattr(device, name)
        assert a.dtype == b.dtype and torch.equal(a, b), name
    shift = device.virtual - device.positions
    assert bool((device.virtual[1:] > device.virtual[:-1]).all()) and torch.equal(shift, shift[device.doc_first])
    bias = CountBias.of(PositionalLSH(SIGMA, 8, seed=11), CPU)
    ref, got = (KernelBias.of(bias, layout, True, tiles_for(64), by="kernels") for layout in (host, device))
    for name in ("fwd", "dkdv", "dq"):
        r, g = getattr(ref, name), getattr(got, name)
        assert torch.equal(r.lo, g.lo) and torch.equal(r.hi, g.hi), name
        assert all(torch.equal(a, b) for a, b in zip(r.args[:4], g.args[:4])), name
    one_row = TokenLayout.build_on_device(torch.arange(T)[None], torch.tensor([0, 10, 50, 75, 100]), B,
                                          T)  # (1, T) ids
    assert torch.equal(one_row.positions, torch.arange(T).repeat(B)) and one_row.doc.tolist()[::25] == [0, 1, 2, 3]


@pytest.mark.parametrize("fault", ["row_start_missing", "short_of_n", "empty_document", "positions_repeat",
                                   "position_2_31"])
def test_a_bad_document_layout_stops_the_step(fault):
    """What the host's ``check_cu_seqlens`` refuses is refused on the device (``torch._assert_async``)."""
    B, T, cu = 2, 50, [0, 1, 2, 30, 50, 51, 97, 100]
    position_ids = _packed(B, T, cu)
    bad_cu = {"row_start_missing": [0, 1, 2, 30, 49, 51, 97, 100], "short_of_n": [0, 1, 2, 30, 50, 51, 97, 99],
              "empty_document": [0, 2, 2, 30, 50, 100]}.get(fault, cu)
    if fault == "positions_repeat":
        position_ids[0, 5] = position_ids[0, 4]
    if fault == "position_2_31":
        position_ids[1, 20:] += 2**31 - 100
    with pytest.raises(RuntimeError, match="offsets must run from 0 to B"):
        TokenLayout.build_on_device(position_ids, torch.tensor(bad_cu), B, T)


@pytest.mark.parametrize("bias", ["plsh", "window"])
def test_the_kernels_on_a_device_layout_of_documents_equal_the_hosts(bias):
    """The kernels' output, lse and gradients on documents laid out on the device equal those on the host's
    layout (a PLSH hash through the tables' cache; an ALiBi window bias)."""
    B, T, cu = 2, 40, [0, 1, 2, 30, 40, 41, 77, 80]
    position_ids = _packed(B, T, cu)
    docs = flat_documents(position_ids, torch.tensor(cu), B, T)
    g = torch.Generator().manual_seed(0)
    q, k, v, dout = (torch.randn(1, B * T, 2, 16, generator=g) for _ in range(4))
    results = []
    for layout in (docs, TokenLayout.build_on_device(position_ids, torch.tensor(cu), B, T)):
        kernel_bias_cache.clear()
        if bias == "plsh":
            lsh = PositionalLSH(SIGMA[:2], 3, seed=4)
            out, lse = triton_onepass.triton_onepass_forward(q, k, v, lsh, docs.positions, causal=True, scale=0.25,
                                                             docs=layout)
            grads = triton_onepass.triton_onepass_backward(dout, q, k, v, out, lse, lsh, docs.positions, causal=True,
                                                           scale=0.25, docs=layout)
        else:
            window = WindowBias.of(SIGMA[:2].float(), torch.tensor([3, 2**31 - 1]), CPU)
            tokens = layout if isinstance(layout, TokenLayout) else TokenLayout.build(docs.positions, CPU, docs)
            kb = KernelBias.of(window, tokens, True, tiles_for(16), by="kernels")
            out, lse = triton_onepass.banded_forward(q, k, v, window, tokens, causal=True, scale=0.25, kernel_bias=kb)
            grads = triton_onepass.banded_backward(dout, q, k, v, out, lse, window, tokens, causal=True, scale=0.25,
                                                   kernel_bias=kb)
        results.append((out, lse, *grads))
    for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), *results):
        assert torch.equal(a, b), name


@pytest.mark.slow  # the interpreter runs tl.sort as a Python network (about 20 s a case)
@pytest.mark.parametrize(("layout_kind", "tokens"), [("row", "16_a_program"), ("documents", "2_a_program")])
def test_runs_table_equals_the_torch_reference(monkeypatch, layout_kind, tokens):
    """The near tiles' runs table from the four launches (``NearBlocks.of(..., by="kernels")``) equals its
    torch form wherever the kernels read it: the offsets, and the runs they index (first token, end,
    weight), ordered alike.
    ``2_a_program``: the lanes of a program shrunk so that most programs hold no anchor."""
    n, s = 40, 20
    docs = None
    if layout_kind == "documents":  # 1-token documents, a document opening between anchors
        cu = torch.tensor([0, 1, 2, 20, 21, n])
        docs = Documents.from_cu_seqlens(cu, torch.cat([torch.arange(int(c)) for c in cu[1:] - cu[:-1]]))
    if tokens == "2_a_program":
        monkeypatch.setattr(near_runs, "_RUN_LANES", 2 * padded_samples(s))
    positions = docs.positions if docs is not None else 300 + torch.arange(n)
    layout = TokenLayout.build(positions, CPU, docs)
    starts, _ = block_bounds(CountBias.of(PositionalLSH(SIGMA, s, seed=2), CPU), layout, True)
    ref, got = NearBlocks.of(starts, layout.doc), NearBlocks.of(starts.contiguous(), layout.doc, by="kernels")
    assert torch.equal(ref.offsets, got.offsets) and torch.equal(ref.enter_offsets, got.enter_offsets)
    for lo, hi in ((0, int(ref.offsets[-1, -1])), (int(ref.enter_offsets[0, 0]), int(ref.enter_offsets[-1, -1]))):
        for name in ("first", "end", "weight"):
            a, b = getattr(ref, name)[lo:hi], getattr(got, name)[lo:hi]
            assert a.dtype == b.dtype and torch.equal(a, b), name


@pytest.mark.parametrize("run_seed", [0, 7, -3, 2**64 - 1])
def test_layer_seed_kernel_equals_hash_seed(run_seed):
    from plsh_dist.splitmix import splitmix64_int

    for step, micro_step, layer in ((0, 0, 0), (5, 1, 27), (2**40, 3, 1)):
        steps, out = torch.tensor([step, micro_step]), torch.empty((), dtype=torch.int64)
        runtime.launcher("table_kernels", CPU).layer_seed_kernel[(1,)](
            steps, out, signed64(splitmix64_int(run_seed & MASK64)), layer)
        assert int(out) == hash_seed(run_seed & MASK64, step, micro_step, layer)


# -- the op on a device, without data --------------------------------------------------------------------


class _HostReads(TorchDispatchMode):
    """Fails on any read of device data by the host (what syncs a CUDA stream: ``.item()``, a copy to
    the CPU, an op whose output shape depends on device data); counts the non-view ops, and lists the
    copies of host tensors to the device in ``uploads`` (a CUDA graph's capture refuses one from
    pageable memory: a warm call may make them, a captured one must not)."""

    SHAPE_FROM_DATA = {"aten.nonzero.default", "aten.unique", "aten._unique2.default", "aten.masked_select.default"}

    def __init__(self):
        super().__init__()
        self.count, self.paused, self.uploads = 0, False, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        to = kwargs.get("device")
        if name_of(func) == "aten._to_copy" and args[0].device.type == "cpu" and to is not None and to.type != "cpu":
            self.uploads.append(tuple(args[0].shape))
        if name_of(func) == "aten.copy_" and args[0].device.type != "cpu" and args[1].device.type == "cpu":
            self.uploads.append(tuple(args[1].shape))
        on_device = any(t.device.type != "cpu" for t in tensors)
        name = str(func)
        if on_device and (name.startswith("aten._local_scalar_dense") or name in self.SHAPE_FROM_DATA):
            raise AssertionError(f"host read of device data: {name}")
        if name.startswith("aten._to_copy") and on_device and kwargs.get("device") == torch.device("cpu"):
            raise AssertionError("device-to-host copy")
        if name.startswith("aten.copy_") and args[0].device.type == "cpu" and args[1].device.type != "cpu":
            raise AssertionError("device-to-host copy")
        if not func.is_view and not self.paused:
            self.count += 1
        return func(*args, **kwargs)


def name_of(func) -> str:
    """``aten.copy_`` for ``aten.copy_.default``."""
    return str(func).rsplit(".", 1)[0]


class _Recorder:
    """A kernels module whose launches are recorded, not run (fake tensors hold no data)."""

    def __init__(self, launches: list):
        self.launches = launches

    def __getattr__(self, name):
        launches = self.launches

        class Grid:
            def __getitem__(self, grid):
                return lambda *args, **kwargs: launches.append(name)
        return Grid()


@pytest.mark.parametrize("shape", [(2, 4096, 16, 8, 128, 100), (1, 300, 4, 4, 64, 16), (1, 300, 4, 4, 64, 3)],
                         ids=["s100", "s16", "s3"])
@pytest.mark.parametrize("fixed", [False, True], ids=["plsh", "fixed_blocks"])
@pytest.mark.parametrize("docs", [False, True], ids=["row", "documents"])
def test_the_op_reads_nothing_back_on_a_device(monkeypatch, fixed, shape, docs):
    """Forward and backward of ``plsh_dist::block_attention`` with q, k, v, raw position_ids and the seed on
    a device and sigma on the host, as a compiled model calls it on a GPU (the fused kernel's strategy):
    no host read of device data, every table built by a launch and at most 40 eager ops for both (36,
    whatever the shapes; 38 beyond 16 samples, where the near tiles' runs table takes one allocation more),
    the tables built in each (a graph's forward and backward are separate calls). sigma is copied to the
    device by the first call only (one op more): a later one, a CUDA graph's capture, copies nothing.
    Packed documents (``cu_seq_lens_q`` on the device) are laid out there by one launch more in each."""
    launches: list = []
    monkeypatch.setattr(triton_onepass, "_launch", lambda device: _Recorder(launches))
    monkeypatch.setattr(tile_bands, "launch", lambda device: _Recorder(launches))
    monkeypatch.setattr(kernel_bias, "launch", lambda device: _Recorder(launches))
    monkeypatch.setattr(near_runs, "launch", lambda device: _Recorder(launches))
    monkeypatch.setattr(token_layout, "launch", lambda device: _Recorder(launches))
    monkeypatch.setattr(triton_onepass, "_arch", lambda device: 9)
    kernel_bias_cache.clear()  # constants and tables made afresh: the cold call makes them
    B, T, Hq, Hkv, D, s = shape
    meta = torch.device("meta")
    q = torch.empty(B, T, Hq, D, dtype=torch.bfloat16, device=meta)
    k, v = (torch.empty(B, T, Hkv, D, dtype=torch.bfloat16, device=meta) for _ in range(2))
    position_ids = torch.empty(B, T, dtype=torch.int64, device=meta)
    seed = torch.empty((), dtype=torch.int64, device=meta)
    sigma = torch.linspace(1.0, 900.0, Hq, dtype=torch.float64)
    cu_seqlens = torch.empty(5, dtype=torch.int32, device=meta) if docs else None
    args = (position_ids, cu_seqlens, seed, sigma, s, "iid", fixed, True, None, "TritonOnePass()", True)
    counts = []
    for call in ("cold", "warm"):
        launches.clear()
        with _HostReads() as reads:
            out, lse = block_attention_op._init_fn(q, k, v, *args)
            forward_ops = reads.count
            dq, dk, dv = block_attention_op_backward._init_fn(torch.empty_like(out), q, k, v, out, lse, *args)
        counts.append((forward_ops, reads.count))
        assert reads.uploads == ([(Hq,)] if call == "cold" else []), call
    assert out.shape == q.shape and lse.shape == (B, Hq, T) and dk.shape == k.shape and dq.device == meta
    tables = ["hash_draw_kernel"] + ["band_tables_kernel"] * 3  # fixed blocks: pitch 2 sigma, shift 0, one launch
    if docs:
        tables = ["document_layout_kernel"] + tables
    if not fixed and s > UNROLLED_SAMPLES:  # + the near tiles' runs table, one allocation more
        tables += ["block_ends_kernel", "near_runs_kernel", "run_offsets_kernel", "near_runs_kernel"]
    # (forward, forward + backward) of a warm call, whatever T, H, D and s: 15 and 36 (documents: 7 and 20,
    # the layout's one launch replacing the positions' checks); one allocation more each for the runs table,
    # and with documents in rows of a batch, the flat row's copy back to the batch (lse; dq, dk, dv)
    near = not fixed and s > UNROLLED_SAMPLES
    warm = ((7, 20) if docs else (15, 36), (1, 2) if near else (0, 0), (1, 3) if docs and B > 1 else (0, 0))
    warm = tuple(sum(x) for x in zip(*warm))
    assert counts == [(warm[0] + 1, warm[1] + 1), warm] and warm[1] <= 38
    assert launches == tables + ["onepass_fwd_kernel"] + tables + ["onepass_bwd_dkdv_kernel", "onepass_bwd_dq_kernel"]


#: the kernels each sampler's draws launch, and the eager ops of a warm call (the iid kernel's allocation;
#: the device forms' allocations and torch ops between their launches)
SAMPLER_DRAWS = {
    "iid": (["hash_draw_kernel"], 1),
    "stratified": (["uniform_kernel", "gamma2_ppf_kernel"], 11),
    "stratified_ramp": (["uniform_kernel"] * 3 + ["gamma2_ppf_kernel"], 19),
    "stratified_ramp_alt": (["uniform_kernel"] * 3 + ["gamma2_ppf_kernel"], 19),
}


def recorded_draws(monkeypatch, lsh_of, calls=("cold", "warm")) -> list[tuple[int, list, list]]:
    """``(eager ops, host copies, launches)`` of ``CountBias.of(lsh_of(seed), meta, by="kernels")`` at each
    call, with a seed on the meta device and the device constants made afresh."""
    launches: list = []
    monkeypatch.setattr(tile_bands, "launch", lambda device: _Recorder(launches))
    monkeypatch.setattr(device_draws, "launch", lambda device: _Recorder(launches))
    kernel_bias_cache.clear()  # constants and tables made afresh: the cold call makes them
    meta = torch.device("meta")
    seed = torch.empty((), dtype=torch.int64, device=meta)
    recorded = []
    for _ in calls:
        launches.clear()
        with _HostReads() as reads:
            drawn = CountBias.of(lsh_of(seed), meta, by="kernels")
        assert drawn.pitch.device == meta and drawn.shift.shape == drawn.pitch.shape
        recorded.append((reads.count, reads.uploads, list(launches)))
    return recorded


@pytest.mark.parametrize("sampler", list(SAMPLER_DRAWS))
def test_every_sampler_draws_on_a_device_and_copies_nothing_after_its_first_call(monkeypatch, sampler):
    """A seed on the device (a compiled model's): no host read, and only the first call copies host data
    there (sigma; the device form's index grids and group sizes), so a CUDA graph's capture copies
    nothing and a replay draws the new seed's masks."""
    sigma = torch.linspace(1.0, 900.0, 4, dtype=torch.float64)
    (_, cold, _), (ops, warm, launches) = recorded_draws(monkeypatch, lambda seed: PositionalLSH(sigma, 16, seed,
                                                                                                 sampler))
    assert (4,) in cold and warm == []
    assert (launches, ops) == SAMPLER_DRAWS[sampler]


#: A lab's module, outside the package: one sampler with a device form, one without.
LAB = """
import numpy as np
import torch

from plsh_dist.hashing import counter_uniform, gamma2_ppf, register_sampler
from plsh_dist.ops.triton import device_draws


def draw(lsh, t, h):  # Gamma(2, 1) by inversion, antithetic shifts in pairs of samples
    c = counter_uniform(lsh.seed, t // 2, h, 2)
    return gamma2_ppf(counter_uniform(lsh.seed, t, h, 0)), np.where(t % 2 == 1, 1.0 - c, c)


def pairs(s, H):
    t, _ = np.meshgrid(np.arange(s), np.arange(H), indexing="ij")
    return t // 2, t % 2 == 1


def device_draw(lsh, device):
    s, H = lsh.num_samples, lsh.num_heads
    t, h = device_draws.grid(s, H, device)
    pair, odd = device_draws.constants(("lab_inverse", s, H), lambda: pairs(s, H), device)
    seed = device_draws.seed_on(lsh, device)
    c = device_draws.uniforms(seed, pair, h, 2)[0]
    return device_draws.gamma2_ppf(device_draws.uniforms(seed, t, h, 0)[0]), torch.where(odd, 1.0 - c, c)


register_sampler("lab_inverse", draw, device_draw)
register_sampler("lab_host_only", draw)
"""


@pytest.fixture
def lab_samplers(tmp_path, monkeypatch):
    """``LAB`` registered the documented way: a config naming it in ``sampler_module`` (the registry and
    ``sys.modules`` restored after the test)."""
    import sys

    from plsh_dist import hashing
    from plsh_dist.models import AttentionConfig

    (tmp_path / "lab_device_samplers.py").write_text(LAB)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(hashing, "_SAMPLERS", dict(hashing._SAMPLERS))
    monkeypatch.delitem(sys.modules, "lab_device_samplers", raising=False)
    AttentionConfig(sampler="lab_inverse", sampler_module="lab_device_samplers")


def test_a_lab_sampler_named_by_its_setting_draws_on_the_device(lab_samplers, monkeypatch):
    for samples in (1, 7, 40):
        host = PositionalLSH(SIGMA, samples, 3, "lab_inverse")
        lsh = PositionalLSH(SIGMA, samples, host.seed_tensor.clone(), "lab_inverse")
        drawn = CountBias.of(lsh, CPU, by="kernels")
        assert torch.equal(drawn.pitch, host.pitch) and torch.equal(drawn.shift, host.shift)
    sigma = torch.linspace(1.0, 900.0, 4, dtype=torch.float64)
    (_, cold, _), (ops, warm, launches) = recorded_draws(monkeypatch, lambda seed: PositionalLSH(sigma, 16, seed,
                                                                                                 "lab_inverse"))
    assert (4,) in cold and warm == []
    assert launches == ["uniform_kernel", "uniform_kernel", "gamma2_ppf_kernel"] and ops <= 10


def test_a_sampler_without_a_device_form_is_refused_on_a_device(lab_samplers, monkeypatch):
    """Its host draws serve on a CPU; on a device the op says how to give it a device form (a host copy
    at every call would be replayed stale by a captured graph)."""
    host = PositionalLSH(SIGMA, 4, 3, "lab_host_only")
    drawn = CountBias.of(host, CPU, by="kernels")
    assert torch.equal(drawn.pitch, host.pitch) and torch.equal(drawn.shift, host.shift)
    with pytest.raises(ValueError, match=r"'lab_host_only' has no device form.*register_sampler\(name, draw, "
                                         r"device_draw\)"):
        recorded_draws(monkeypatch, lambda seed: PositionalLSH(SIGMA, 4, seed, "lab_host_only"))


@pytest.mark.parametrize("sampler", ["stratified", "stratified_ramp"])
def test_the_op_with_another_sampler_reads_nothing_back_on_a_device(monkeypatch, sampler):
    """``plsh_dist::block_attention``'s forward and backward with a sampler other than "iid", as a compiled
    model calls it on a GPU: no host read, the draws' kernels in each, and no host copy after the first
    call."""
    launches: list = []
    monkeypatch.setattr(triton_onepass, "_launch", lambda device: _Recorder(launches))
    monkeypatch.setattr(tile_bands, "launch", lambda device: _Recorder(launches))
    monkeypatch.setattr(kernel_bias, "launch", lambda device: _Recorder(launches))
    monkeypatch.setattr(near_runs, "launch", lambda device: _Recorder(launches))
    monkeypatch.setattr(token_layout, "launch", lambda device: _Recorder(launches))
    monkeypatch.setattr(device_draws, "launch", lambda device: _Recorder(launches))
    monkeypatch.setattr(triton_onepass, "_arch", lambda device: 9)
    kernel_bias_cache.clear()  # constants and tables made afresh: the cold call makes them
    B, T, H, D, s = 1, 300, 4, 64, 16
    meta = torch.device("meta")
    q, k, v = (torch.empty(B, T, H, D, dtype=torch.bfloat16, device=meta) for _ in range(3))
    seed = torch.empty((), dtype=torch.int64, device=meta)
    args = (torch.empty(B, T, dtype=torch.int64, device=meta), None, seed, torch.linspace(1.0, 900.0, H,
            dtype=torch.float64), s, sampler, False, True, None, "TritonOnePass()", True)
    for call in ("cold", "warm"):
        launches.clear()
        with _HostReads() as reads:
            out, lse = block_attention_op._init_fn(q, k, v, *args)
            block_attention_op_backward._init_fn(torch.empty_like(out), q, k, v, out, lse, *args)
        assert (reads.uploads == []) == (call == "warm"), (call, reads.uploads)
    draws = SAMPLER_DRAWS[sampler][0]
    tables = draws + ["band_tables_kernel"] * 3
    assert launches == tables + ["onepass_fwd_kernel"] + tables + ["onepass_bwd_dkdv_kernel", "onepass_bwd_dq_kernel"]


@pytest.mark.parametrize("shape", [(2, 4096, 16, 8, 128), (1, 300, 4, 4, 64)], ids=["4096", "300"])
@pytest.mark.parametrize("window", ["exact", "window", "truncated"])
@pytest.mark.parametrize("docs", [False, True], ids=["row", "documents"])
def test_the_alibi_op_reads_nothing_back_on_a_device(monkeypatch, window, shape, docs):
    """Forward and backward of ``plsh_dist::alibi_attention`` as a compiled model calls it on a GPU (q, k, v
    and raw position_ids on the device, the slopes and windows host constants): the fused kernel, no host
    read of device data, the tables built by three launches in each (packed documents laid out by one
    more), at most 34 eager ops for both whatever the shapes and the window, and the constants checked
    and copied to the device by the first call only (two ops more: a later call, a CUDA graph's capture,
    copies nothing)."""
    launches: list = []
    monkeypatch.setattr(triton_onepass, "_launch", lambda device: _Recorder(launches))
    monkeypatch.setattr(tile_bands, "launch", lambda device: _Recorder(launches))
    monkeypatch.setattr(kernel_bias, "launch", lambda device: _Recorder(launches))
    monkeypatch.setattr(near_runs, "launch", lambda device: _Recorder(launches))
    monkeypatch.setattr(token_layout, "launch", lambda device: _Recorder(launches))
    monkeypatch.setattr(triton_onepass, "_arch", lambda device: 9)
    kernel_bias_cache.clear()  # constants and tables made afresh: the cold call makes them
    B, T, Hq, Hkv, D = shape
    meta = torch.device("meta")
    q = torch.empty(B, T, Hq, D, dtype=torch.bfloat16, device=meta)
    k, v = (torch.empty(B, T, Hkv, D, dtype=torch.bfloat16, device=meta) for _ in range(2))
    position_ids = torch.empty(B, T, dtype=torch.int64, device=meta)
    slopes = alibi_slopes(Hq)
    windows = {"exact": [], "window": [64], "truncated": [int(w) for w in torch.ceil(4.0 / slopes)]}[window]
    cu_seqlens = torch.empty(5, dtype=torch.int32, device=meta) if docs else None
    args = (position_ids, cu_seqlens, slopes, windows, True, None, None, "fused", True)
    counts = []
    for call in ("cold", "warm"):
        launches.clear()
        with _HostReads() as reads:
            out, lse = alibi.alibi_attention_op._init_fn(q, k, v, *args)
            forward_ops = reads.count
            dq, dk, dv = alibi.alibi_attention_op_backward._init_fn(torch.empty_like(out), q, k, v, out, lse, *args)
        counts.append((forward_ops, reads.count))
        assert len(reads.uploads) == (2 if call == "cold" else 0), (call, reads.uploads)  # sigma, windows
        tables = ["document_layout_kernel"] * docs + ["band_tables_kernel"] * 3
        kernels = ["onepass_fwd_kernel"] + tables + ["onepass_bwd_dkdv_kernel", "onepass_bwd_dq_kernel"]
        assert launches == tables + kernels
    assert out.shape == q.shape and lse.shape == (B, Hq, T) and dk.shape == k.shape and dq.device == meta
    # a warm call: 14 and 34 (documents: 6 and 18, the layout's one launch replacing the positions' checks,
    # and the flat row's copy back to a batch of rows: 1 and 3 more), whatever T, H, D and the window
    warm = ((6, 18) if docs else (14, 34)) if not (docs and B > 1) else (7, 21)
    assert counts == [(warm[0] + 2, warm[1] + 2), warm]


def test_layer_seed_on_a_device_is_one_launch(monkeypatch):
    launches: list = []
    monkeypatch.setattr(runtime, "launcher", lambda name, device: _Recorder(launches))
    steps = torch.empty(2, dtype=torch.int64, device="meta")
    with _HostReads():
        seed = layer_seed._init_fn(steps, 5, torch.tensor(3))
    assert seed.device.type == "meta" and seed.dtype == torch.int64 and launches == ["layer_seed_kernel"]


def test_a_device_seed_draws_what_the_host_draws():
    """The op's hash from a seed tensor (as ``plsh_dist::layer_seed`` gives it) is the int seed's hash."""
    H, s = 4, 6
    sigma = alibi_slopes(H).double().reciprocal()
    run = PositionalLSH(sigma, s, hash_seed(3, 2, 1, 5))
    seed = layer_seed(torch.tensor([2, 1]), 3, torch.tensor(5))
    drawn = CountBias.of(PositionalLSH(sigma, s, seed), CPU, by="kernels")
    assert torch.equal(drawn.pitch, run.pitch) and torch.equal(drawn.shift, run.shift)


_COMPILE = r"""
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from plsh_dist.ops.triton import sampler_kernels as sk
from plsh_dist.ops.triton import table_kernels as tk

TABLES = {"Pos": "*i64", "Virtual": "*i64", "DocFirst": "*i64", "DocEnd": "*i64", "KPos": "*i32", "Pitch": "*fp64",
          "Shift": "*fp64", "Window": "*i64", "Table": "*i32", "Rows": "*i32", "KSpan": "*i32", "Lo": "*i32",
          "Hi": "*i32", "n": "i32", "num_samples": "i32", "num_heads": "i32", "num_row_tiles": "i32", "num_key_tiles": "i32",
          "table_stride": "i32"}
RUNS_IN = {"Starts": "*i32", "Doc": "*i32", "OpenEnd": "*i32", "AnchorFirst": "*i32", "AnchorEnd": "*i32"}
RUNS = {"OpenEnd": "*i32", "AnchorFirst": "*i32", "AnchorEnd": "*i32", "Offsets": "*i32", "EnterOffsets": "*i32",
        "Totals": "*i32", "First": "*i32", "End": "*i32", "Weight": "*fp16", "n": "i32", "num_samples": "i32",
        "num_heads": "i32", "num_anchors": "i32", "entering_at": "i32"}
for arch in (90, 80):
    target = GPUTarget("cuda", arch, 32)
    builds = [(tk.hash_draw_kernel, {"Seed": "*i64", "Sigma": "*fp64", "Pitch": "*fp64", "Shift": "*fp64",
                                     "num_samples": "i32", "num_heads": "i32"}, dict(FIXED=False, BLOCK=256)),
              (tk.layer_seed_kernel, {"Steps": "*i64", "Out": "*i64", "run_key": "i64", "layer": "i32"}, {}),
              (sk.uniform_kernel, {"Seed": "*i64", "T": "*i64", "H": "*i64", "Out": "*fp64", "n": "i32",
                                   "first_stream": "i32"}, dict(NUM_STREAMS=3, BLOCK=256)),
              (sk.log_kernel, {"X": "*fp64", "Y": "*fp64", "n": "i32"}, dict(BLOCK=256)),
              (sk.gamma2_ppf_kernel, {"Q": "*fp64", "X": "*fp64", "n": "i32"}, dict(BLOCK=1024))]
    for query_side in (True, False):
        for causal in (True, False):
            builds.append((tk.band_tables_kernel, TABLES, dict(ROW_TILE=64, KEY_TILE=32, CAUSAL=causal,
                                                               QUERY_SIDE=query_side, HAS_DOCS=True, WRITE_TABLE=True,
                                                               WINDOW=False)))
        window = {**TABLES, "Pitch": "*fp32", "Shift": "*fp32"}  # an ALiBi window bias: sigma, never read
        builds.append((tk.band_tables_kernel, window, dict(ROW_TILE=64, KEY_TILE=32, CAUSAL=True, QUERY_SIDE=query_side,
                                                           HAS_DOCS=True, WRITE_TABLE=True, WINDOW=True)))
    builds.append((tk.block_ends_kernel, dict(RUNS_IN, n="i32", num_samples="i32", num_anchors="i32"),
                   dict(HAS_DOCS=True, ANCHOR=16, CHUNK=1024)))
    for write in (False, True):
        builds.append((tk.near_runs_kernel, RUNS, dict(TOKENS=16, SAMPLES=128, HEADS=16, ANCHOR=16, WRITE=write)))
    builds.append((tk.document_layout_kernel, {"PositionIds": "*i64", "Cu": "*i32", "Pos": "*i64", "Virtual": "*i64",
                                               "DocFirst": "*i64", "DocEnd": "*i64", "KPos": "*i32", "Doc": "*i32",
                                               "Bad": "*i32", "n": "i32", "seqlen": "i32", "row_stride": "i32",
                                               "col_stride": "i32", "num_cu": "i32"},
                   dict(BLOCK=1024)))
    builds.append((tk.run_offsets_kernel, {"Offsets": "*i32", "EnterOffsets": "*i32", "Totals": "*i32", "n": "i32",
                                           "num_heads": "i32", "num_anchors": "i32"}, dict(CHUNK=1024)))
    for fn, signature, consts in builds:
        ptx = triton.compile(ASTSource(fn, signature={**signature, **{k: "constexpr" for k in consts}},
                                       constexprs=consts), target=target).asm["ptx"]
        name = fn.__name__ + ("_window" if consts.get("WINDOW") else "")
        print(arch, name, "shr.s64" in ptx, "div.rn.f64" in ptx, "div.approx" in ptx or "div.full" in ptx)
"""


#: integer kernels (the runs table's, the documents'): no hash arithmetic, signed shifts allowed
INTEGER_KERNELS = ("block_ends_kernel", "near_runs_kernel", "run_offsets_kernel", "document_layout_kernel")


def test_table_kernels_compile_for_hopper_and_ampere():
    """The table and sampler kernels build for sm_90 and sm_80 as the JIT builds them (no GPU needed): SplitMix64's
    shifts logical, every float64 division the correctly rounded one (the hash's own rule)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    env = {**os.environ, "TRITON_INTERPRET": "0", "PYTHONPATH": str(root)}  # this process interprets
    proc = subprocess.run([sys.executable, "-c", _COMPILE], cwd=root, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = [line.split() for line in proc.stdout.splitlines()]
    assert len(rows) == 2 * 16
    for arch, name, arithmetic_shift, div_rn, approximate in rows:
        # signed halvings in the tables' search: arithmetic shifts are right there; the window's has no hash
        tables = name.startswith("band_tables_kernel")
        divides = name in ("band_tables_kernel", "gamma2_ppf_kernel")  # gamma2_ppf's series and Newton steps
        assert approximate == "False" and div_rn == str(divides), (arch, name)
        assert tables or name in INTEGER_KERNELS or arithmetic_shift == "False", (arch, name)
