"""Static cost model of the Triton kernels from their compiled SASS; no GPU needed.

    python tools/triton_sass_model.py --out results/triton/sass.md --cubin-dir gpu_results/cubins
    python tools/triton_sass_model.py --arch 90 --dtype bf16 --head-dim 128   # the targets' builds only

Builds every kernel the launchers run (forward, dK/dV, dQ) x bias (PLSH
count, ALiBi window, and ``none``: the plain causal flash calibration of
``tools/kernel_model/flash_calibration.py``) x dtype x head dim x arch exactly as
the JIT builds it at the benchmark's shapes (``tools/kernel_model/kernel_builds.py``),
reads its SASS (``tools/kernel_model/sass.py``) and costs one tile with the
issue-cycle model (``tools/kernel_model/sass_model.py``). Then predicts the
forward + backward speedup of PLSH over the causal flash floor (tiles from
``plsh_dist/plan/kernel_tiles.py`` times cycles per tile) and checks issue 32's
targets. ``--cubin-dir DIR`` writes every cubin and ``DIR/index.json``.

Must run without ``TRITON_INTERPRET`` (the interpreter replaces the compiler).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a clone: tools/ is not installed

from tools.kernel_model.kernel_builds import ARCHS, BIASES, DTYPES, HEAD_DIMS, Case, record  # noqa: E402

KERNELS = ("fwd", "bwd_dkdv", "bwd_dq")
#: The benchmark's shapes (benchmarks/bench_attention_gpu.py): one sequence, 16 heads.
TOKENS, HEADS, SAMPLES = 8192, 16, 8
#: Issue 32's targets, all at bf16, D = 128, sm_90, per-head sigma, causal.
TARGET = {"dtype": "bf16", "head_dim": 128, "arch": 90}
CALIBRATION_FWD, CALIBRATION_BWD = 0.70, 0.45
FWD_SHARE = {8: 0.50, 100: 0.25}
BWD_SHARE = 0.40
SPEEDUP = {(8, 8192): 8.0, (8, 131072): 100.0, (100, 8192): 3.0, (100, 131072): 40.0}


def _model(launch):
    from tools.kernel_model.sass_model import model_launch  # noqa: PLC0415

    return model_launch(launch)


def build_all(cases: list[Case], workers: int):
    """[(launch, model, cubin)] of every kernel the cases launch, in order."""
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise SystemExit("unset TRITON_INTERPRET: the interpreter does not compile")
    launches = record(cases, ROOT)
    with ProcessPoolExecutor(max_workers=workers) as pool:
        return [(launch, *built) for launch, built in zip(launches, pool.map(_model, launches))]


def _key(m):
    return (m.kernel, m.bias, m.dtype, m.head_dim, m.arch)


def cubin_name(m) -> str:
    return f"{m.kernel}_{m.bias}_{m.dtype}_d{m.head_dim}_sm{m.arch}.cubin"


def write_cubins(built, out: Path) -> None:
    """Every cubin and ``index.json`` (one object per cubin) under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    index = []
    for _, m, cubin in built:
        (out / cubin_name(m)).write_bytes(cubin)
        index.append({"file": cubin_name(m), "kernel": m.kernel, "bias": m.bias, "dtype": m.dtype,
                      "head_dim": m.head_dim, "block_m": m.block_m, "block_n": m.block_n, "num_warps": m.num_warps,
                      "num_stages": m.num_stages, "arch": m.arch, "causal": m.causal, "documents": m.documents > 0,
                      "shipped": m.shipped, "function": m.function})
    (out / "index.json").write_text(json.dumps(index, indent=1) + "\n")


# -- the count's branch share -------------------------------------------------------------------

_SHARES: dict = {}


def share(m, s: int, T: int = TOKENS) -> float:
    """Share of ``m``'s (tile, sample) pairs that run the count's per-score block (1 for other biases
    and for builds that count near tiles as a product: no per-sample block), from the benchmark's hash
    (per-head sigma, seed 0) at ``m``'s tiles (:func:`plsh_dist.plan.kernel_tiles.boundary_share`)."""
    if m.bias != "count" or _has_blocks(m):
        return 1.0
    key = (m.kernel, m.block_m, m.block_n, s, T)
    if key not in _SHARES:
        import torch  # noqa: PLC0415

        from plsh_dist.hashing import PositionalLSH, alibi_slopes  # noqa: PLC0415
        from plsh_dist.ops.triton.tile_bands import CountBias  # noqa: PLC0415
        from plsh_dist.plan.kernel_tiles import boundary_share  # noqa: PLC0415

        lsh = PositionalLSH(alibi_slopes(HEADS).double().reciprocal(), s, seed=0)
        _SHARES[key] = boundary_share(CountBias.of(lsh, torch.device("cpu")), T, m.kernel, m.block_m, m.block_n)
    return _SHARES[key]


_FAR: dict = {}
_BLOCKS: dict = {}


def _has_blocks(m) -> bool:
    return bool(m.loop and m.loop.block_loops)


def blocks(m, s: int, T: int = TOKENS) -> float:
    """Mean trips a near tile of ``m`` runs its block loop (the near count's runs of blocks, a product
    each trip) on the benchmark's hash at ``m``'s tiles (:func:`plsh_dist.plan.kernel_tiles.block_trips`,
    the launcher's own table); 0 without a block loop. Measured at the benchmark's T (at 128k the
    8k figure: the hash's statistics do not depend on position)."""
    if m.bias != "count" or not _has_blocks(m):
        return 0.0
    key = (m.kernel, m.block_m, m.block_n, s, T)
    if key not in _BLOCKS:
        import torch  # noqa: PLC0415

        from plsh_dist.hashing import PositionalLSH, alibi_slopes  # noqa: PLC0415
        from plsh_dist.ops.triton.tile_bands import CountBias  # noqa: PLC0415
        from plsh_dist.plan.kernel_tiles import block_trips  # noqa: PLC0415

        lsh = PositionalLSH(alibi_slopes(HEADS).double().reciprocal(), s, seed=0)
        _BLOCKS[key] = block_trips(CountBias.of(lsh, torch.device("cpu")), T, m.kernel, m.block_m, m.block_n)
    return _BLOCKS[key]


def far_share(m, s: int, T: int = TOKENS) -> float:
    """Share of ``m``'s tiles on its far loop (key tile wholly before the query tile's rows: the count's
    product form) for the benchmark's hash at ``m``'s tiles, T tokens (0 without a far loop)."""
    if m.bias != "count" or m.far is None:
        return 0.0
    key = (m.kernel, m.block_m, m.block_n, s, T)
    if key not in _FAR:
        import torch  # noqa: PLC0415

        from plsh_dist.hashing import PositionalLSH, alibi_slopes  # noqa: PLC0415
        from plsh_dist.ops.triton.tile_bands import CountBias, TileConfig  # noqa: PLC0415
        from plsh_dist.plan.kernel_tiles import bias_tiles  # noqa: PLC0415

        lsh = PositionalLSH(alibi_slopes(HEADS).double().reciprocal(), s, seed=0)
        tile = TileConfig(m.block_m, m.block_n, m.num_warps, m.num_stages)
        kt = bias_tiles(CountBias.of(lsh, torch.device("cpu")), T, HEADS, tiles=(tile, tile, tile))
        total, far = {"fwd": (kt.forward, kt.forward_far), "bwd_dkdv": (kt.backward_dkdv, kt.backward_dkdv_far),
                      "bwd_dq": (kt.backward_dq, kt.backward_dq_far)}[m.kernel]
        _FAR[key] = far / total if total else 0.0
    return _FAR[key]


# -- predictions --------------------------------------------------------------------------------


def predict(models: dict, by_s: dict, lengths, samples_list) -> list[dict]:
    """Forward + backward clocks of PLSH (count, per-head sigma) against the calibration over the full
    causal triangle, at the targets' dtype / D / arch, per (s, T): each s on its own build
    (``by_s[(kernel, s)]``), the count's branch share measured at the benchmark's T (the hash's
    statistics do not depend on position; at 128k the share is the 8k one)."""
    import torch  # noqa: PLC0415

    from plsh_dist.hashing import PositionalLSH, alibi_slopes  # noqa: PLC0415
    from plsh_dist.ops.triton.tile_bands import CountBias, TileConfig  # noqa: PLC0415
    from plsh_dist.plan.kernel_tiles import bias_tiles  # noqa: PLC0415
    from tools.kernel_model.sass_model import causal_floor_tiles  # noqa: PLC0415

    at = lambda k, b: models[(k, b, TARGET["dtype"], TARGET["head_dim"], TARGET["arch"])]  # noqa: E731
    fwd, dkdv, dq = (at(k, "count") for k in KERNELS)
    tiles = tuple(TileConfig(m.block_m, m.block_n, m.num_warps, m.num_stages) for m in (fwd, dkdv, dq))
    calib = [at(k, "none") for k in KERNELS]
    rows = []
    for T in lengths:
        floor = {c.kernel: HEADS * causal_floor_tiles(c.kernel, T, c.block_m, c.block_n) for c in calib}
        floor_fwd = floor["fwd"] * calib[0].tile_cycles(1)
        floor_bwd = sum(floor[c.kernel] * c.tile_cycles(1) for c in calib[1:])
        for s in samples_list:
            lsh = PositionalLSH(alibi_slopes(HEADS).double().reciprocal(), s, seed=0)
            kt = bias_tiles(CountBias.of(lsh, torch.device("cpu")), T, HEADS, tiles=tiles)
            plsh = {}
            for k, total, far in (("fwd", kt.forward, kt.forward_far), ("bwd_dkdv", kt.backward_dkdv,
                                  kt.backward_dkdv_far), ("bwd_dq", kt.backward_dq, kt.backward_dq_far)):
                m = by_s[(k, s)]
                plsh[k] = total * m.mixed_cycles(s, share(m, s), far / total if m.far and total else 0.0,
                                                 blocks(m, s))
            plsh_fwd, plsh_bwd = plsh["fwd"], plsh["bwd_dkdv"] + plsh["bwd_dq"]
            rows.append({"T": T, "s": s, "tiles": (kt.forward, kt.backward_dkdv, kt.backward_dq),
                         "far_tiles": (kt.forward_far, kt.backward_dkdv_far, kt.backward_dq_far),
                         "floor_tiles": tuple(floor[k] for k in KERNELS), "plsh_cycles": plsh_fwd + plsh_bwd,
                         "floor_cycles": floor_fwd + floor_bwd, "speedup_fwd": floor_fwd / plsh_fwd,
                         "speedup_bwd": floor_bwd / plsh_bwd,
                         "speedup": (floor_fwd + floor_bwd) / (plsh_fwd + plsh_bwd)})
    return rows


# -- targets ------------------------------------------------------------------------------------


def _verdict(value: float, target: float, speedup: bool = False) -> str:
    if value >= target:
        return "met"
    show = (lambda v: f"{v:.3g}x") if speedup else (lambda v: f"{v:.1%}")  # noqa: E731
    return f"**missed** by {target / value:.1f}x ({show(value)} of {show(target)})"


def _why(m, s: int) -> str:
    """What sets a build's bound at s samples, from its counts."""
    lp = m.loop
    t = share(m, s)
    near = _why_loop(m, lp, s, t, False)
    if m.far is None:
        return near
    f = far_share(m, s)
    how = "as a product over the runs of blocks that meet them" if _has_blocks(m) else "sample by sample"
    return f"{f:.0%} of the tiles on the far loop: {_why_loop(m, m.far, s, t, True)}; the others {how}: {near}"


def _why_loop(m, lp, s: int, t: float, far: bool) -> str:
    b = 0.0 if far else blocks(m, s)
    if m.tensor_bound(s, t, far, b):
        return f"tensor-bound, executed / useful {m.executed(far, b) / m.useful_flops:.2f}"
    work = f"{lp.per_tile}"
    if lp.block_loops and not far:
        work = (f"{lp.per_tile} + {b:.1f} block-loop trips (measured) x {lp.per_block} = "
                f"{lp.instructions(s, 1.0, b):.0f}")
    elif lp.sample_loops and m.bias == "count" and lp.sample_skippable and not far:
        work = (f"{lp.per_tile} + {s} x ({lp.per_sample - lp.sample_skippable} + {t:.0%} of "
                f"{lp.sample_skippable}) = {lp.instructions(s, t):.0f}")
    elif lp.sample_loops:
        work = f"{lp.per_tile} + {s} x {lp.per_sample}"
    elif 0 < lp.skippable_blocks <= s and m.bias == "count" and not far:
        work = (f"{lp.per_tile - lp.skippable} + {t:.0%} of {lp.skippable} in {s} per-sample blocks = "
                f"{lp.instructions(s, t):.0f}")
    f64 = f", {lp.f64_per_tile + s * lp.f64_per_sample} f64" if lp.f64_per_tile or lp.f64_per_sample else ""
    return (f"issue-bound: {work} instructions / warp / tile{f64}, executed / useful "
            f"{m.executed(far, b) / m.useful_flops:.2f}")


def targets(models: dict, by_s: dict, predictions: list[dict]) -> list[tuple[str, str, str]]:
    """(target, model's figure, verdict) of issue 32's static targets."""
    from tools.kernel_model.sass_model import area_rate  # noqa: PLC0415

    at = lambda k, b: models.get((k, b, TARGET["dtype"], TARGET["head_dim"], TARGET["arch"]))  # noqa: E731
    out = []
    calib = [at(k, "none") for k in KERNELS]
    if all(calib):
        peak = calib[0].machine.peak_tflops
        cal_fwd, cal_bwd = calib[0].bound_tflops(1), area_rate(calib[1:], 1)
        out.append(("calibration forward >= 70% of the tensor peak", f"{cal_fwd:.0f} TFLOP/s = "
                    f"{cal_fwd / peak:.0%}", _verdict(cal_fwd / peak, CALIBRATION_FWD)))
        out.append(("calibration backward >= 45% of the tensor peak", f"{cal_bwd:.0f} TFLOP/s = "
                    f"{cal_bwd / peak:.0%}", _verdict(cal_bwd / peak, CALIBRATION_BWD)))
        for s, want in FWD_SHARE.items():
            fwd = by_s.get(("fwd", s))
            if fwd:
                bound = fwd.bound_tflops(s, share(fwd, s), far_share(fwd, s), blocks(fwd, s))
                out.append((f"PLSH forward, s = {s}: >= {want:.0%} of the calibration forward",
                            f"{bound:.0f} TFLOP/s = {bound / cal_fwd:.1%} ({_why(fwd, s)})",
                            _verdict(bound / cal_fwd, want)))
        for k in KERNELS[1:]:
            m = at(k, "count")
            if m:
                bound = m.bound_tflops(8, share(m, 8), far_share(m, 8), blocks(m, 8))
                got = bound / cal_bwd
                out.append((f"PLSH {k}, s = 8: >= {BWD_SHARE:.0%} of the calibration backward",
                            f"{bound:.0f} TFLOP/s = {got:.1%} ({_why(m, 8)})",
                            _verdict(got, BWD_SHARE)))
                out.append((f"PLSH {k} uses wgmma", ", ".join(m.loop.mma) or "none",
                            "met" if m.uses_wgmma else "**missed**: mma.sync (HMMA), not wgmma (HGMMA)"))
    shipped = [m for m in models.values() if m.shipped and m.loop]
    f64 = [m for m in shipped if any(lp.f64_per_tile or lp.f64_per_sample for lp in (m.loop, m.far) if lp)]
    out.append(("no float64 instruction in any key loop (every shipped build)",
                f"{len(f64)} of {len(shipped)} builds have some",
                "met" if not f64 else f"**missed**: e.g. {f64[0].kernel} {f64[0].bias} sm_{f64[0].arch}: "
                f"{f64[0].loop.f64_per_tile} a tile + {f64[0].loop.f64_per_sample} a sample"))
    for r in predictions:
        want = SPEEDUP.get((r["s"], r["T"]))
        if want:
            out.append((f"predicted speedup, fwd + bwd, s = {r['s']}, T = {r['T'] // 1024}k: >= {want:.0f}x",
                        f"{r['speedup']:.3g}x", _verdict(r["speedup"], want, True)))
    return out


# -- the page -----------------------------------------------------------------------------------


def _mma(m) -> str:
    if not m.loop or not m.loop.mma:
        return "none"
    return " + ".join(f"{n} {op.split('.')[0]}.{op.split('.')[1]}" for op, n in m.loop.mma.items())


def _bound(m, s) -> str:
    if not m.loop:
        return "-"
    t, f, b = share(m, s), far_share(m, s), blocks(m, s)
    mark = " (tensor)" if m.tensor_bound(s, t, blocks=b) and (not m.far or m.tensor_bound(s, t, True)) else ""
    return f"{m.bound_tflops(s, t, f, b):.0f}{mark}"


def _far(m, s) -> str:
    """The far loop's instructions / tile, its share of the tiles at s and its own bound."""
    if m.far is None:
        return "-"
    mark = " (tensor)" if m.tensor_bound(s, 1.0, True) else ""
    bound = m.useful_flops / m.tile_cycles(s, 1.0, True) * m.machine.sms * m.machine.clock_hz / 1e12
    return f"{m.far.per_tile} ({far_share(m, s):.0%}, {bound:.0f}{mark})"


def kernel_table(models: list) -> list[str]:
    head = ("| arch | dtype | D | kernel | bias | tile | warps | stages | regs | smem KiB | spill STL/LDL | "
            "instr / tile | instr / sample | f64 / tile | f64 / sample | calls | matrix instr / tile | "
            "executed / useful | pipelined | skippable instr / tile (blocks) | branch share s=8 | "
            "far loop: instr / tile (tile share s=8, bound) | bound s=8 | static bound s=8 |")
    lines = [head, "|" + "|".join(["---"] * (head.count("|") - 1)) + "|"]
    for m in models:
        lp = m.loop
        cells = [f"sm_{m.arch}", m.dtype, str(m.head_dim), m.kernel, m.bias, f"{m.block_m}x{m.block_n}",
                 str(m.num_warps), str(m.num_stages), str(m.regs), f"{m.smem / 1024:.1f}",
                 f"{m.spill_stores}/{m.spill_loads}"]
        if lp:
            cells += [str(lp.per_tile), str(lp.per_sample) if lp.sample_loops else "-", str(lp.f64_per_tile),
                      str(lp.f64_per_sample) if lp.sample_loops else "-", str(lp.calls), _mma(m),
                      f"{m.mma_ratio:.2f}", lp.pipelined,
                      f"{lp.skippable} ({lp.skippable_blocks})" if lp.skippable else "-",
                      f"{share(m, 8):.0%}" if m.bias == "count" and not _has_blocks(m) else "-", _far(m, 8),
                      _bound(m, 8), f"{m.bound_tflops(8, 1.0, far_share(m, 8), blocks(m, 8)):.0f}"]
        else:
            cells += ["no loop with matrix instructions"] + ["-"] * 12
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def markdown(models: list, by_key: dict, predictions: list[dict], checks, command: str, by_s: dict) -> str:
    import triton  # noqa: PLC0415

    from tools.kernel_model.sass_model import MACHINES  # noqa: PLC0415

    h200, a100 = MACHINES[90], MACHINES[80]
    lines = [
        "# Triton kernels: static cost model from the compiled SASS",
        "",
        f"Generated by `{command}` (Triton {triton.__version__}, no GPU). Every figure is read from the code "
        "the JIT compiles; nothing here was measured on a GPU.",
        "",
        "## How",
        "",
        f"- **Builds.** The launchers run on CPU tensors of the benchmark's shapes (batch 1, T = {TOKENS}, "
        f"{HEADS} query = key/value heads, causal, one document, per-head sigma = 1 / ALiBi slope, s = {SAMPLES}; "
        "the window bias with the truncated mode's per-head windows at s samples' cost) with their kernel launches "
        "recorded, not run; each kernel's own `JITFunction.run(..., warmup=True)` then specialises on the recorded "
        "arguments (16-byte aligned pointers, integers divisible by 16, constexprs, `num_warps`, `num_stages`) and "
        "compiles for `GPUTarget('cuda', arch, 32)` (`tools/kernel_model/kernel_builds.py`). The tiles are the "
        "launchers' own for that arch and head dim.",
        "- **Reading.** `cuobjdump -sass` (shipped in Triton's NVIDIA backend) on each cubin "
        "(`tools/kernel_model/sass.py`). A loop is a backward `BRA`; the *main loop* is the outermost loop holding "
        "matrix instructions of its own, outside its nested loops (HGMMA: wgmma; HMMA: mma.sync): one trip per key "
        "tile (forward, dQ) or query tile (dK/dV). Loops nested in it without matrix instructions are per-sample "
        "loops (run s times a trip); those with matrix instructions are *block loops* (the near count beyond 16 "
        "samples, one product of 16 runs of blocks a trip), run their measured mean trips a tile (`block_trips` "
        "in `plsh_dist/plan/kernel_tiles.py`); instructions are counted statically, every body instruction once "
        "per trip. *calls*: `CALL` sites in the "
        "body (the float64 division's slow path, taken only for special operands; not counted). *f64*: D* "
        "arithmetic, conversions and rounding on F64, `MUFU.RCP64H`. *executed / useful*: matrix FLOPs the "
        "instructions issue (HGMMA.MxNxK: a 4-warp warpgroup's M x N x K; HMMA.16816: one warp's 16 x 8 x 16) over "
        "the tile's `tt.dot` products in the Triton IR (not the count's fp16-accumulated ones). *pipelined*: the "
        "loop body loads with cp.async "
        "(`LDGSTS`) or TMA (`UTMALDG`). The count walks a band in two key loops: the *far loop* (key tiles "
        "wholly before the query tile's rows, whose count is a product on the tensor cores: the loop with more "
        "matrix work) and the main loop (the tiles that meet the rows, counted sample by sample up to 16 samples, "
        "beyond as a product over the runs of blocks that meet them: `_count_blocks` in the kernels); a tile's clocks "
        "are the two loops' averaged by their share of the band's tiles (`far_tiles` in "
        "`plsh_dist/plan/kernel_tiles.py`, the kernels' own split), and the branch share is the main loop's.",
        f"- **Issue-cycle model** (`tools/kernel_model/sass_model.py`). An SM has 4 schedulers, each issuing one warp "
        "instruction per clock; a tile of a W-warp kernel with I instructions per warp takes W I / 4 clocks "
        "(I = per tile + s per sample + b per block-loop trip). Its matrix work takes executed FLOPs / tensor peak "
        "clocks "
        f"({h200.name}: {h200.tensor_flops_per_clock:,.0f} dense bf16 FLOP per clock per SM, HGMMA and HMMA alike, "
        f"which flatters mma.sync on Hopper; sm_80 rows use {a100.name}: {a100.tensor_flops_per_clock:,.0f}). A tile "
        "takes the larger; *bound* is the tile's useful FLOPs at that rate on every SM, in TFLOP/s "
        f"({h200.name}: {h200.sms} SMs at {h200.clock_hz / 1e9:.2f} GHz, peak {h200.peak_tflops:.0f}; {a100.name}: "
        f"{a100.sms} SMs at {a100.clock_hz / 1e9:.2f} GHz, peak {a100.peak_tflops:.0f}); *(tensor)*: the matrix "
        "work, not the issue, sets it. Assumed away: memory and instruction latency, occupancy, load imbalance, "
        "divergence, the slow paths, the tail. It is an upper bound that ranks the work per tile.",
        "- **Calibration** (`bias = none`): plain causal attention without bias in the style of Triton's "
        "fused-attention tutorial (`tools/kernel_model/flash_calibration.py`, for this model only), compiled the same "
        "way. The shipped kernels with the window bias are not tensor-bound (below), so they cannot serve.",
        "",
        "## Every build",
        "",
        f"Bounds in useful TFLOP/s at s = {SAMPLES} (the count's sample count is a constexpr: its per-sample blocks "
        "are unrolled, so each s is its own build; the s = 100 builds of the targets are below). *skippable*: "
        "instructions inside the regions the loop's forward conditional branches skip (the count's per-sample "
        "blocks: run only where a sample's blocks cut the tile), and how many regions. *branch share*: the share of "
        "(visited tile, sample) pairs that run one, measured on the benchmark's hash at the build's tiles "
        "(`plsh_dist/plan/kernel_tiles.py`, `boundary_share`: the kernels' own test on the launcher's own tables). "
        "*bound*: the skippable regions weighted by that share (the branch is uniform over the program: no "
        "divergence); *static bound*: every instruction counted every trip.",
        "",
        *kernel_table(models),
        "",
    ]
    others = [m for (k, n), m in sorted(by_s.items(), key=lambda x: (x[0][1], KERNELS.index(x[0][0])))
              if n != SAMPLES]
    if others:
        lines += ["Builds of the targets at other s (bf16, D = 128, sm_90). Beyond "
                  "16 samples a near tile counts as a product over the runs of blocks that meet it (`_count_blocks`), "
                  "a nested loop with matrix instructions, one product of 16 runs a trip: its *block loop* "
                  "(instructions of one trip, and its mean trips a near tile, measured on the benchmark's hash at "
                  "the build's tiles: `block_trips` in `plsh_dist/plan/kernel_tiles.py`, the launcher's own table). "
                  "*key-loop spills*: `STL` / `LDL` inside the two key loops.", "",
                  "| kernel | s | regs | spill STL/LDL | key-loop spills | instr / tile | instr / sample (skippable) | "
                  "block loop: instr / trip (trips / tile) | skippable (blocks) | branch share | "
                  "far loop: instr / tile (tile share, bound) | bound | static bound | pipelined |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for (k, n), m in sorted(by_s.items(), key=lambda x: (x[0][1], KERNELS.index(x[0][0]))):
            if n == SAMPLES:
                continue
            lp = m.loop
            b = blocks(m, n)
            per_sample = f"{lp.per_sample} ({lp.sample_skippable})" if lp.sample_loops else "-"
            per_block = f"{lp.per_block} ({b:.1f})" if lp.block_loops else "-"
            branch = "-" if _has_blocks(m) else f"{share(m, n):.0%}"
            lines.append(f"| {k} | {n} | {m.regs} | {m.spill_stores}/{m.spill_loads} | {m.loop_spills} | "
                         f"{lp.per_tile} | {per_sample} | {per_block} | {lp.skippable} ({lp.skippable_blocks}) | "
                         f"{branch} | {_far(m, n)} | {m.bound_tflops(n, share(m, n), far_share(m, n), b):.0f} | "
                         f"{m.bound_tflops(n, 1.0, far_share(m, n), b):.0f} | {lp.pipelined} |")
        lines.append("")
    if predictions:
        lines += [
            "## Predicted speedup over the causal flash floor",
            "",
            f"Forward + backward at {TARGET['dtype']}, D = {TARGET['head_dim']}, sm_{TARGET['arch']}, {HEADS} heads, "
            "per-head sigma, causal: tiles times clocks per tile. PLSH's tiles are the band's "
            "(`plsh_dist/plan/kernel_tiles.py`, the launcher's band function, at the builds' tile shapes); the "
            "floor's are the calibration kernels' over the full causal triangle, each at its tile's clocks (its "
            "diagonal tiles costed as the rest).",
            "",
            "| T | s | PLSH tiles fwd / dK/dV / dQ | of which far | floor tiles fwd / dK/dV / dQ | speedup fwd | "
            "speedup bwd | speedup fwd + bwd | target | verdict |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in predictions:
            want = SPEEDUP.get((r["s"], r["T"]))
            lines.append(f"| {r['T']:,} | {r['s']} | {' / '.join(f'{x:,}' for x in r['tiles'])} | "
                         f"{' / '.join(f'{x:,}' for x in r['far_tiles'])} | "
                         f"{' / '.join(f'{x:,}' for x in r['floor_tiles'])} | {r['speedup_fwd']:.3g}x | "
                         f"{r['speedup_bwd']:.3g}x | {r['speedup']:.3g}x | "
                         f"{f'>= {want:.0f}x' if want else '-'} | "
                         f"{_verdict(r['speedup'], want, True) if want else '-'} |")
        lines.append("")
    if checks:
        lines += [
            "## Issue 32's targets",
            "",
            f"At {TARGET['dtype']}, D = {TARGET['head_dim']}, sm_{TARGET['arch']} (the float64 check: every shipped "
            "build above).",
            "",
            "| target | model | verdict |",
            "|---|---|---|",
            *[f"| {t} | {v} | {ok} |" for t, v, ok in checks],
            "",
        ]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, help="markdown page to write (default: print)")
    ap.add_argument("--cubin-dir", type=Path, help="write every cubin and index.json here")
    ap.add_argument("--json", type=Path, help="write the per-build figures as JSON here")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--arch", type=int, nargs="*", default=list(ARCHS), choices=ARCHS)
    ap.add_argument("--dtype", nargs="*", default=list(DTYPES), choices=DTYPES)
    ap.add_argument("--head-dim", type=int, nargs="*", default=list(HEAD_DIMS), choices=HEAD_DIMS)
    ap.add_argument("--bias", nargs="*", default=list(BIASES), choices=BIASES)
    ap.add_argument("--tokens", type=int, default=TOKENS, help="T of the recorded launches (the benchmark's)")
    ap.add_argument("--lengths", type=int, nargs="*", default=[8192, 131072], help="T of the predictions")
    ap.add_argument("--samples", type=int, nargs="*", default=[8, 100], help="s of the predictions")
    args = ap.parse_args(argv)
    if args.tokens < 256 or args.tokens % 256:
        print(f"--tokens must be a positive multiple of 256 (the calibration's tiles), got {args.tokens}",
              file=sys.stderr)
        return 2
    grid = [Case(b, d, h, a, tokens=args.tokens, heads=HEADS, samples=SAMPLES) for a in args.arch
            for d in args.dtype for h in args.head_dim for b in args.bias]
    target_case = lambda c: all(getattr(c, k) == v for k, v in TARGET.items())  # noqa: E731
    extra = [Case("count", c.dtype, c.head_dim, c.arch, tokens=args.tokens, heads=HEADS, samples=s)
             for c in grid if c.bias == "count" and target_case(c) for s in args.samples if s != SAMPLES]
    built = build_all(grid + extra, args.workers)
    main_builds = [b for b in built if b[0].case["samples"] == SAMPLES]
    by_key = {_key(m): m for _, m, _ in main_builds}
    cubins = {_key(m): c for _, m, c in main_builds}
    order = {k: i for i, k in enumerate(KERNELS)}
    models = sorted(by_key.values(), key=lambda m: (-m.arch, m.dtype, m.head_dim, order.get(m.kernel, 9),
                                                    BIASES.index(m.bias)))
    complete = all(_key_t in by_key for _key_t in
                   [(k, b, TARGET["dtype"], TARGET["head_dim"], TARGET["arch"]) for k in KERNELS
                    for b in ("count", "none")])
    by_s = {(m.kernel, l.case["samples"]): m for l, m, _ in built
            if m.bias == "count" and all(getattr(m, k) == v for k, v in TARGET.items())}
    predictions = predict(by_key, by_s, args.lengths, args.samples) if complete else []
    checks = targets(by_key, by_s, predictions)
    command = "python tools/triton_sass_model.py" + (f" --out {args.out}" if args.out else "")
    text = markdown(models, by_key, predictions, checks, command, by_s)
    if args.cubin_dir:
        write_cubins(main_builds, args.cubin_dir)
    if args.json:
        args.json.write_text(json.dumps([_as_json(m) for m in models], indent=1) + "\n")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    print(text)
    return 0


def _as_json(m) -> dict:
    lp = m.loop
    return {"kernel": m.kernel, "bias": m.bias, "dtype": m.dtype, "head_dim": m.head_dim, "arch": m.arch,
            "block_m": m.block_m, "block_n": m.block_n, "num_warps": m.num_warps, "num_stages": m.num_stages,
            "regs": m.regs, "smem": m.smem, "spill_stores": m.spill_stores, "spill_loads": m.spill_loads,
            "useful_flops": m.useful_flops, "executed_flops": m.executed_flops,
            "loop": None if lp is None else {
                "start": lp.loop.start, "end": lp.loop.end, "per_tile": lp.per_tile, "per_sample": lp.per_sample,
                "sample_loops": len(lp.sample_loops), "f64_per_tile": lp.f64_per_tile,
                "f64_per_sample": lp.f64_per_sample, "mma": lp.mma, "calls": lp.calls, "pipelined": lp.pipelined},
            "far_loop": None if m.far is None else {
                "start": m.far.loop.start, "end": m.far.loop.end, "per_tile": m.far.per_tile, "mma": m.far.mma,
                "executed_flops": m.executed(True), "pipelined": m.far.pipelined},
            "bound_tflops_s8": m.bound_tflops(8, 1.0, far_share(m, 8)) if lp else None}


if __name__ == "__main__":
    sys.exit(main())
