"""The static cost model from compiled code (tools/kernel_model/sass.py, kernel_builds.py, sass_model.py,
tools/triton_sass_model.py): the SASS reader's loops and counts on a hand-written listing, and
one small real build, made as the JIT makes it, read consistently."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tools.kernel_model.sass import analyse, cuobjdump_path, dot_flops_per_trip, parse_sass
from tools.kernel_model.sass_model import causal_floor_tiles

ROOT = Path(__file__).resolve().parents[2]


def _listing(body: list[str]) -> str:
    lines = ["\tcode for sm_90a", "\t\tFunction : k"]
    lines += [f"        /*{16 * i:04x}*/                   {ins} ;   /* 0x0 */" for i, ins in enumerate(body)]
    return "\n".join(lines)


# a key loop 0x20..0xc0 holding a barrier wait 0x30..0x40 and a sample loop 0x50..0x90 (with a call)
LISTING = [
    "S2R R0, SR_TID.X",                         # 0x00
    "MOV R1, RZ",                               # 0x10
    "HGMMA.64x32x16.F32.BF16 R24, gdesc[UR4], RZ",  # 0x20  key loop starts
    "SYNCS.PHASECHK.TRANS64.TRYWAIT P1, [UR8], R3",  # 0x30  wait loop
    "@!P1 BRA 0x30",                            # 0x40
    "DFMA R4, R6, R8, R4",                      # 0x50  sample loop starts
    "MUFU.RCP64H R9, R7",                       # 0x60
    "CALL.REL.NOINC 0x200",                     # 0x70
    "FRND.F64.FLOOR R4, R4",                    # 0x80
    "@P0 BRA 0x50",                             # 0x90  sample loop ends
    "HMMA.16816.F32.BF16 R10, R12, R14, R10",   # 0xa0
    "LDGSTS.E.BYPASS.128 [R2], desc[UR6][R4.64]",  # 0xb0
    "@P2 BRA 0x20",                             # 0xc0  key loop ends
    "EXIT",                                     # 0xd0
    "BRA 0xe0",                                 # 0xe0  padding: a branch to itself
]


def test_reader_finds_the_key_loop_its_sample_loop_and_counts():
    fns = parse_sass(_listing(LISTING))
    k = analyse("k", fns["k"])
    lp = k.main
    assert (lp.loop.start, lp.loop.end) == (0x20, 0xc0)
    assert [(x.start, x.end) for x in lp.sample_loops] == [(0x50, 0x90)]
    assert [(x.start, x.end) for x in lp.wait_loops] == [(0x30, 0x40)]
    assert lp.per_sample == 5 and lp.per_tile == 11 - 5  # 11 body instructions, 5 in the sample loop
    assert lp.per_tile + lp.per_sample == (0xc0 - 0x20) // 16 + 1
    assert (lp.f64_per_tile, lp.f64_per_sample) == (0, 3)  # DFMA, MUFU.RCP64H, FRND.F64
    assert lp.calls == 1 and lp.pipelined == "cp.async"
    assert lp.mma == {"HGMMA.64x32x16.F32.BF16": 1, "HMMA.16816.F32.BF16": 1}
    # HGMMA: a warpgroup's 64x32x16 over its 4 warps; HMMA: one warp's 16x8x16
    assert lp.mma_flops_per_warp == 2 * 64 * 32 * 16 / 4 + 2 * 16 * 8 * 16
    assert lp.instructions(8) == lp.per_tile + 8 * lp.per_sample
    assert k.spill_stores == k.spill_loads == 0


def test_useful_work_is_the_dots_of_the_ir_loop():
    ttir = """
  tt.func public @k() {
    %0 = tt.dot %a, %b, %c : tensor<16x64xbf16> * tensor<64x16xbf16> -> tensor<16x16xf32> loc(#loc1)
    %1:2 = scf.for %i = %c0 to %n step %c1 iter_args(%x = %c) -> (tensor<64x32xf32>) : i32 {
      %q = tt.dot %a, %b, %c, inputPrecision = tf32 : tensor<64x128xbf16> * tensor<128x32xbf16> -> tensor<64x32xf32>
      %r = scf.for %t = %c0 to %s step %c1 iter_args(%y = %x) -> (tensor<64x32xi32>) : i32 {
        scf.yield %y : tensor<64x32xi32>
      } {tt.divisibility_arg1 = dense<16> : tensor<1xi32>}
      %o = tt.dot %p, %v, %acc : tensor<64x32xbf16> * tensor<32x128xbf16> -> tensor<64x128xf32>
      scf.yield %o : tensor<64x128xf32>
    }
    tt.return
  }"""
    assert dot_flops_per_trip(ttir) == 2 * (2 * 64 * 32 * 128)


# the count's two key loops: 0x00..0x30 the far tiles (its count a product: two HGMMA), then
# 0x40..0xc0 the near tiles with a sample loop 0x50..0xb0 whose block 0x70..0xa0 a branch skips
TWO_LOOPS = [
    "HGMMA.64x32x16.F32.BF16 R24, gdesc[UR4], RZ",  # 0x00  far loop
    "HGMMA.64x32x16.F32 R40, gdesc[UR8], RZ",       # 0x10  the count's product
    "IADD3 R1, R1, 0x1, RZ",                        # 0x20
    "@P0 BRA 0x0",                                  # 0x30
    "HGMMA.64x32x16.F32.BF16 R24, gdesc[UR4], RZ",  # 0x40  near loop
    "LDG.E R2, desc[UR6][R4.64]",                   # 0x50  sample loop
    "ISETP.GT.AND P1, PT, R2, R3, PT",              # 0x60
    "@P1 BRA 0xb0",                                 # 0x70  skips the sample's block
    "ISETP.GE.AND P2, PT, R5, R2, PT",              # 0x80
    "SEL R6, RZ, 0x1, !P2",                         # 0x90
    "IADD3 R7, R7, R6, RZ",                         # 0xa0
    "@P3 BRA 0x50",                                 # 0xb0  sample loop ends
    "@P4 BRA 0x40",                                 # 0xc0  near loop ends
    "EXIT",                                         # 0xd0
]


def test_reader_tells_the_far_loop_from_the_near_one():
    k = analyse("k", parse_sass(_listing(TWO_LOOPS))["k"])
    assert (k.far.loop.start, k.far.loop.end) == (0x00, 0x30)
    assert (k.main.loop.start, k.main.loop.end) == (0x40, 0xc0)
    assert k.far.mma_instructions == 2 and k.main.mma_instructions == 1
    lp = k.main
    assert [(x.start, x.end) for x in lp.sample_loops] == [(0x50, 0xb0)]
    assert lp.per_sample == 7 and lp.sample_skippable == 3  # the block after the forward branch
    # a quarter of the samples cut the tile: the skipped blocks count a quarter of the time
    assert lp.instructions(8, 0.25) == lp.per_tile + 8 * (7 - 0.75 * 3)
    assert lp.instructions(8) == lp.per_tile + 8 * 7


def test_useful_work_is_the_attention_loop_not_the_counts_product():
    ttir = """
    %1:2 = scf.for %i = %c0 to %n step %c1 iter_args(%x = %c) -> (tensor<64x32xf32>) : i32 {
      %q = tt.dot %a, %b, %c : tensor<64x128xbf16> * tensor<128x32xbf16> -> tensor<64x32xf32>
      %c = tt.dot %r, %s, %z : tensor<64x16xf16> * tensor<16x32xf16> -> tensor<64x32xf32>
      %o = tt.dot %p, %v, %acc : tensor<64x32xbf16> * tensor<32x128xbf16> -> tensor<64x128xf32>
      scf.yield %o : tensor<64x128xf32>
    }
    %2:2 = scf.for %i = %c0 to %n step %c1 iter_args(%x = %c) -> (tensor<64x32xf32>) : i32 {
      %q = tt.dot %a, %b, %c : tensor<64x128xbf16> * tensor<128x32xbf16> -> tensor<64x32xf32>
      %o = tt.dot %p, %v, %acc : tensor<64x32xbf16> * tensor<32x128xbf16> -> tensor<64x128xf32>
      scf.yield %o : tensor<64x128xf32>
    }"""
    assert dot_flops_per_trip(ttir) == 2 * (2 * 64 * 32 * 128)


# large s: 0x00..0x30 the far loop; 0x40..0xc0 the near loop, whose count is a block loop 0x60..0xa0
# (the near count's runs of blocks, a product a trip)
BLOCK_LOOP = [
    "HGMMA.64x32x16.F32.BF16 R24, gdesc[UR4], RZ",  # 0x00  far loop
    "HGMMA.64x32x16.F32 R40, gdesc[UR8], RZ",       # 0x10  the count's product
    "IADD3 R1, R1, 0x1, RZ",                        # 0x20
    "@P0 BRA 0x0",                                  # 0x30
    "HGMMA.64x32x16.F32.BF16 R24, gdesc[UR4], RZ",  # 0x40  near loop
    "@P5 BRA 0xb0",                                 # 0x50  no run: skip the block loop
    "LDG.E R2, desc[UR6][R4.64]",                   # 0x60  block loop
    "ISETP.GE.AND P2, PT, R5, R2, PT",              # 0x70
    "STS.U16 [R8], R6",                             # 0x80
    "HGMMA.64x32x16.F16 R60, R62, gdesc[UR10], R60",  # 0x90
    "@P3 BRA 0x60",                                 # 0xa0  block loop ends
    "FMUL R9, R9, R10",                             # 0xb0
    "@P4 BRA 0x40",                                 # 0xc0  near loop ends
    "EXIT",                                         # 0xd0
]


def test_reader_costs_the_near_count_block_loop_by_its_trips():
    k = analyse("k", parse_sass(_listing(BLOCK_LOOP))["k"])
    assert (k.far.loop.start, k.far.loop.end) == (0x00, 0x30)  # the most matrix work of its own
    lp = k.main
    assert (lp.loop.start, lp.loop.end) == (0x40, 0xc0)  # not the block loop nested in it
    assert [(x.start, x.end) for x in lp.block_loops] == [(0x60, 0xa0)] and not lp.sample_loops
    assert lp.per_block == 5 and lp.per_tile == 4
    assert lp.mma == {"HGMMA.64x32x16.F32.BF16": 1} and lp.block_mma == {"HGMMA.64x32x16.F16": 1}
    assert lp.instructions(100, 1.0, 2.5) == 4 + 2.5 * 5  # s does not enter: no sample loop
    assert lp.flops_per_warp(2.5) == (1 + 2.5) * 2 * 64 * 32 * 16 / 4


def test_useful_work_leaves_out_the_near_counts_fp16_products():
    ttir = """
    %1:2 = scf.for %i = %c0 to %n step %c1 iter_args(%x = %c) -> (tensor<64x32xf32>) : i32 {
      %q = tt.dot %a, %b, %c : tensor<64x128xbf16> * tensor<128x32xbf16> -> tensor<64x32xf32>
      %c = tt.dot %r, %s, %z : tensor<64x128xf16> * tensor<128x32xf16> -> tensor<64x32xf32>
      %o = tt.dot %p, %v, %acc : tensor<64x32xbf16> * tensor<32x128xbf16> -> tensor<64x128xf32>
      scf.yield %o : tensor<64x128xf32>
    }
    %2:2 = scf.for %i = %c0 to %n step %c1 iter_args(%x = %c) -> (tensor<64x32xf32>) : i32 {
      %q = tt.dot %a, %b, %c : tensor<64x128xbf16> * tensor<128x32xbf16> -> tensor<64x32xf32>
      %r = scf.for %t = %c0 to %s step %c16 iter_args(%y = %w) -> (tensor<64x32xf16>) : i32 {
        %y2 = tt.dot %u, %w, %y : tensor<64x16xf16> * tensor<16x32xf16> -> tensor<64x32xf16>
        scf.yield %y2 : tensor<64x32xf16>
      }
      %o = tt.dot %p, %v, %acc : tensor<64x32xbf16> * tensor<32x128xbf16> -> tensor<64x128xf32>
      scf.yield %o : tensor<64x128xf32>
    }"""
    assert dot_flops_per_trip(ttir) == 2 * (2 * 64 * 32 * 128)


def test_causal_floor_tiles_cover_the_triangle():
    # square tiles: the triangle's m (m + 1) / 2; dK/dV from the keys' side: the same area
    assert causal_floor_tiles("fwd", 1024, 128, 128) == 8 * 9 // 2
    assert causal_floor_tiles("bwd_dq", 1024, 128, 64) * 128 * 64 == causal_floor_tiles("bwd_dkdv", 1024, 64, 128) \
        * 64 * 128


def test_one_small_build_as_the_jit_makes_it(tmp_path):
    """The calibration kernels at T = 256, fp16, D = 64, sm_90: built through the JIT's own
    specialisation (alignment hints: 16-byte loads), read consistently; cubins and index written."""
    pytest.importorskip("triton")
    if cuobjdump_path() is None:
        pytest.skip("Triton's NVIDIA backend (cuobjdump) is not installed")
    env = {**os.environ, "TRITON_INTERPRET": "0", "PYTHONPATH": str(ROOT)}
    cubins, out = tmp_path / "cubins", tmp_path / "builds.json"
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "triton_sass_model.py"), "--arch", "90",
                           "--dtype", "fp16", "--head-dim", "64", "--bias", "none", "--tokens", "256", "--cubin-dir",
                           str(cubins), "--json", str(out)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    builds = {b["kernel"]: b for b in json.loads(out.read_text())}
    assert set(builds) == {"fwd", "bwd_dkdv", "bwd_dq"}
    for kernel, b in builds.items():
        lp = b["loop"]
        assert lp is not None, kernel
        assert b["regs"] > 0 and b["spill_stores"] == b["spill_loads"] == 0
        assert lp["sample_loops"] == 0 and lp["per_sample"] == 0
        assert lp["f64_per_tile"] == 0 and lp["calls"] == 0
        assert all(op.startswith("HGMMA") for op in lp["mma"])  # wgmma on sm_90
        assert sum(lp["mma"].values()) < lp["per_tile"] <= (lp["end"] - lp["start"]) // 16 + 1
        assert lp["pipelined"] == "cp.async"  # Triton pipelines the plain loop
        # the calibration repeats no matrix work: the instructions' FLOPs are the IR's dots
        assert b["executed_flops"] == b["useful_flops"] > 0
    f = builds["fwd"]
    assert f["useful_flops"] == 2 * 2 * f["block_m"] * f["block_n"] * 64  # q k^T and p v
    index = json.loads((cubins / "index.json").read_text())
    assert {e["kernel"] for e in index} == set(builds)
    for e in index:
        assert set(e) >= {"file", "kernel", "bias", "dtype", "head_dim", "block_m", "block_n", "num_warps",
                          "num_stages", "arch", "causal", "documents", "shipped"}
        assert (e["bias"], e["dtype"], e["head_dim"], e["arch"], e["causal"], e["documents"], e["shipped"]) == \
            ("none", "fp16", 64, 90, True, False, False)
        sass = subprocess.run([str(cuobjdump_path()), "-sass", str(cubins / e["file"])], capture_output=True,
                              text=True, check=True).stdout
        # the JIT's alignment hints: q, k, v reach shared memory in 16-byte copies, not 2-byte loads
        assert "LDGSTS.E.BYPASS.128" in sass or "LDGSTS.E.128" in sass
