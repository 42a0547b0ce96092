"""The fused kernel's inputs built on the device: the hash's draws, the band tables, the layer seeds.

Pure data: compared with ``torch.equal`` against the host references (numpy draws,
``KernelBias.of``'s torch tables, ``hash_seed``) under Triton's interpreter. Then the op
itself on a device without a GPU: the meta device (tensors with a shape and no data, so any read
of their data fails, as ``FakeTensorMode`` would; its fake CUDA tensors need CUDA's device guards
for Python indexing), with the kernel launches recorded, not run and the strategy the table gives
CUDA: it must read nothing back to the host, and issue few eager ops."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

pytest.importorskip("triton")

from plsh_dist.hashing import FixedBlocks, PositionalLSH, alibi_slopes  # noqa: E402
from plsh_dist.ops import device_tables, kernel_bias_cache, plsh, triton_onepass  # noqa: E402
from plsh_dist.ops.custom_ops import layer_seed, signed64  # noqa: E402
from plsh_dist.ops.device_tables import device_kernel_bias, device_near_blocks, draw_on_device  # noqa: E402
from plsh_dist.ops.documents import Documents  # noqa: E402
from plsh_dist.ops.kernel_bias import KernelBias, padded_samples  # noqa: E402
from plsh_dist.ops.near_runs import near_blocks  # noqa: E402
from plsh_dist.ops.plsh import block_attention_op, block_attention_op_backward  # noqa: E402
from plsh_dist.ops.tile_bands import CountBias, TokenLayout, block_bounds, tiles_for  # noqa: E402
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
        drawn = draw_on_device(PositionalLSH(SIGMA, samples, given), CPU)
        assert torch.equal(drawn.pitch, host.pitch) and torch.equal(drawn.shift, host.shift)
    shared = PositionalLSH(256.0, samples, seed)
    drawn = draw_on_device(shared, CPU)
    assert torch.equal(drawn.pitch, shared.pitch) and torch.equal(drawn.shift, shared.shift)


def test_fixed_blocks_and_other_samplers_draw_as_the_host():
    fixed = FixedBlocks(SIGMA)
    drawn = draw_on_device(fixed, CPU)
    assert torch.equal(drawn.pitch, fixed.pitch) and torch.equal(drawn.shift, fixed.shift)
    stratified = PositionalLSH(SIGMA, 9, 3, sampler="stratified")  # drawn on the host, copied
    drawn = draw_on_device(stratified, CPU)
    assert torch.equal(drawn.pitch, stratified.pitch) and torch.equal(drawn.shift, stratified.shift)


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
    bias = CountBias.of(PositionalLSH(SIGMA, 8, seed=11), CPU)
    for head_dim in (64, 128):
        tiles = tiles_for(head_dim)
        ref, got = KernelBias.of(bias, layout, causal, tiles), device_kernel_bias(bias, layout, causal, tiles)
        for name in ("fwd", "dkdv", "dq"):
            r, g = getattr(ref, name), getattr(got, name)
            assert torch.equal(r.lo, g.lo) and torch.equal(r.hi, g.hi), name
            for a, b in zip(r.args[:4], g.args[:4]):  # key spans, starts, lasts, row spans
                assert a.dtype == b.dtype and torch.equal(a, b), name
            assert [a.dtype for a in r.args[4:]] == [b.dtype for b in g.args[4:]]  # one kernel build
            assert r.consts == g.consts


@pytest.mark.parametrize(("layout_kind", "tokens"), [("row", "16_a_program"), ("documents", "2_a_program")])
def test_runs_table_equals_the_torch_reference(monkeypatch, layout_kind, tokens):
    """The near tiles' runs table from the four launches equals ``near_runs.near_blocks`` wherever the
    kernels read it: the offsets, and the runs they index (first token, end, weight), ordered alike.
    ``2_a_program``: the lanes of a program shrunk so that most programs hold no anchor."""
    n, s = 40, 20
    docs = None
    if layout_kind == "documents":  # 1-token documents, a document opening between anchors
        cu = torch.tensor([0, 1, 2, 20, 21, n])
        docs = Documents.from_cu_seqlens(cu, torch.cat([torch.arange(int(c)) for c in cu[1:] - cu[:-1]]))
    if tokens == "2_a_program":
        monkeypatch.setattr(device_tables, "_RUN_LANES", 2 * padded_samples(s))
    positions = docs.positions if docs is not None else 300 + torch.arange(n)
    layout = TokenLayout.build(positions, CPU, docs)
    starts, _ = block_bounds(CountBias.of(PositionalLSH(SIGMA, s, seed=2), CPU), layout, True)
    ref, got = near_blocks(starts, layout.doc), device_near_blocks(starts.contiguous(), layout.doc)
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
        device_tables.launch(CPU).layer_seed_kernel[(1,)](steps, out, signed64(splitmix64_int(run_seed & MASK64)),
                                                          layer)
        assert int(out) == hash_seed(run_seed & MASK64, step, micro_step, layer)


# -- the op on a device, without data --------------------------------------------------------------------


class _HostReads(TorchDispatchMode):
    """Fails on any read of device data by the host (what syncs a CUDA stream: ``.item()``, a copy to
    the CPU, an op whose output shape depends on device data); counts the non-view ops."""

    SHAPE_FROM_DATA = {"aten.nonzero.default", "aten.unique", "aten._unique2.default", "aten.masked_select.default"}

    def __init__(self):
        super().__init__()
        self.count, self.paused = 0, False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
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
def test_the_op_reads_nothing_back_on_a_device(monkeypatch, fixed, shape):
    """Forward and backward of ``plsh_dist::block_attention`` with q, k, v, raw position_ids, the seed and
    sigma on a device, as a compiled model calls it on a GPU (the fused kernel's strategy): no host read
    of device data, every table built by a launch and at most 40 eager ops for both (36, whatever the
    shapes; 38 beyond 16 samples, where the near tiles' runs table takes one allocation more), the
    tables built in each (a graph's forward and backward are separate calls)."""
    launches: list = []
    monkeypatch.setattr(triton_onepass, "_launch", lambda device: _Recorder(launches))
    monkeypatch.setattr(device_tables, "launch", lambda device: _Recorder(launches))
    monkeypatch.setattr(triton_onepass, "_arch", lambda device: 9)
    monkeypatch.setattr(plsh, "choose_strategy", lambda *args, **kwargs: triton_onepass.TritonOnePass())
    kernel_bias_cache.clear()
    B, T, Hq, Hkv, D, s = shape
    meta = torch.device("meta")
    q = torch.empty(B, T, Hq, D, dtype=torch.bfloat16, device=meta)
    k, v = (torch.empty(B, T, Hkv, D, dtype=torch.bfloat16, device=meta) for _ in range(2))
    position_ids = torch.empty(B, T, dtype=torch.int64, device=meta)
    seed = torch.empty((), dtype=torch.int64, device=meta)
    sigma = torch.empty(Hq, dtype=torch.float64, device=meta)
    args = (position_ids, None, seed, sigma, s, "iid", fixed, True, None, "auto", "auto", True)
    with _HostReads() as reads:
        out, lse = block_attention_op._init_fn(q, k, v, *args)
        forward_ops = reads.count
        dq, dk, dv = block_attention_op_backward._init_fn(torch.empty_like(out), q, k, v, out, lse, *args)
    assert out.shape == q.shape and lse.shape == (B, Hq, T) and dk.shape == k.shape and dq.device == meta
    tables = ["hash_draw_kernel"] + ["band_tables_kernel"] * 3  # fixed blocks: pitch 2 sigma, shift 0, one launch
    if not fixed and s > triton_onepass.UNROLLED_SAMPLES:  # + the near tiles' runs table, one allocation more
        tables += ["block_ends_kernel", "near_runs_kernel", "run_offsets_kernel", "near_runs_kernel"]
        assert (forward_ops, reads.count) == (16, 38)  # whatever B, T, H, D and s
    else:
        assert (forward_ops, reads.count) == (15, 36)  # whatever B, T, H, D and s
    assert launches == tables + ["onepass_fwd_kernel"] + tables + ["onepass_bwd_dkdv_kernel", "onepass_bwd_dq_kernel"]


def test_layer_seed_on_a_device_is_one_launch(monkeypatch):
    launches: list = []
    monkeypatch.setattr(device_tables, "launch", lambda device: _Recorder(launches))
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
    drawn = draw_on_device(PositionalLSH(sigma, s, seed), CPU)
    assert torch.equal(drawn.pitch, run.pitch) and torch.equal(drawn.shift, run.shift)


_COMPILE = r"""
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from plsh_dist.ops import table_kernels as tk

TABLES = {"Pos": "*i64", "Virtual": "*i64", "DocFirst": "*i64", "DocEnd": "*i64", "KPos": "*i32", "Pitch": "*fp64",
          "Shift": "*fp64", "Table": "*i32", "Rows": "*i32", "KSpan": "*i32", "Lo": "*i32", "Hi": "*i32", "n": "i32",
          "num_samples": "i32", "num_heads": "i32", "num_row_tiles": "i32", "num_key_tiles": "i32",
          "table_stride": "i32"}
RUNS_IN = {"Starts": "*i32", "Doc": "*i32", "OpenEnd": "*i32", "AnchorFirst": "*i32", "AnchorEnd": "*i32"}
RUNS = {"OpenEnd": "*i32", "AnchorFirst": "*i32", "AnchorEnd": "*i32", "Offsets": "*i32", "EnterOffsets": "*i32",
        "Totals": "*i32", "First": "*i32", "End": "*i32", "Weight": "*fp16", "n": "i32", "num_samples": "i32",
        "num_heads": "i32", "num_anchors": "i32", "entering_at": "i32"}
for arch in (90, 80):
    target = GPUTarget("cuda", arch, 32)
    builds = [(tk.hash_draw_kernel, {"Seed": "*i64", "Sigma": "*fp64", "Pitch": "*fp64", "Shift": "*fp64",
                                     "num_samples": "i32", "num_heads": "i32"}, dict(FIXED=False, BLOCK=256)),
              (tk.layer_seed_kernel, {"Steps": "*i64", "Out": "*i64", "run_key": "i64", "layer": "i32"}, {})]
    for query_side in (True, False):
        for causal in (True, False):
            builds.append((tk.band_tables_kernel, TABLES, dict(ROW_TILE=64, KEY_TILE=32, CAUSAL=causal,
                                                               QUERY_SIDE=query_side, HAS_DOCS=True, WRITE_TABLE=True)))
    builds.append((tk.block_ends_kernel, dict(RUNS_IN, n="i32", num_samples="i32", num_anchors="i32"),
                   dict(HAS_DOCS=True, ANCHOR=16, CHUNK=1024)))
    for write in (False, True):
        builds.append((tk.near_runs_kernel, RUNS, dict(TOKENS=16, SAMPLES=128, HEADS=16, ANCHOR=16, WRITE=write)))
    builds.append((tk.run_offsets_kernel, {"Offsets": "*i32", "EnterOffsets": "*i32", "Totals": "*i32", "n": "i32",
                                           "num_heads": "i32", "num_anchors": "i32"}, dict(CHUNK=1024)))
    for fn, signature, consts in builds:
        ptx = triton.compile(ASTSource(fn, signature={**signature, **{k: "constexpr" for k in consts}},
                                       constexprs=consts), target=target).asm["ptx"]
        print(arch, fn.__name__, "shr.s64" in ptx, "div.rn.f64" in ptx, "div.approx" in ptx or "div.full" in ptx)
"""


#: integer kernels (the runs table's): no hash arithmetic, signed shifts allowed
RUNS_KERNELS = ("block_ends_kernel", "near_runs_kernel", "run_offsets_kernel")


def test_table_kernels_compile_for_hopper_and_ampere():
    """The table kernels build for sm_90 and sm_80 as the JIT builds them (no GPU needed): SplitMix64's
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
    assert len(rows) == 2 * 10
    for arch, name, arithmetic_shift, div_rn, approximate in rows:
        tables = name == "band_tables_kernel"  # signed halvings in its search: arithmetic shifts are right there
        assert approximate == "False" and div_rn == str(tables), (arch, name)
        assert tables or name in RUNS_KERNELS or arithmetic_shift == "False", (arch, name)
