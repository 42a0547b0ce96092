"""Static cost model of the Triton kernels from their compiled code (no GPU).

Every kernel is built as the JIT builds it (:mod:`tools.kernel_model.kernel_builds`),
its SASS read (:mod:`tools.kernel_model.sass`), and one trip of its main loop
(one tile) costed with an **issue-cycle model**:

- an SM has 4 schedulers, each issuing one warp instruction per clock, and
  nothing else limits it: latencies are hidden, loads arrive in time,
  occupancy is enough, branches are free. A tile of a W-warp kernel whose
  loop body has I instructions per warp takes ``W I / 4`` SM clocks to issue
  (``I = per tile + s per sample + b per block-loop trip``, b the measured mean
  trips of the near count's block loop);
- its matrix instructions take ``executed FLOPs / tensor peak`` SM clocks
  (H200: 3,023 dense bf16 / fp16 FLOP per clock per SM, for HGMMA and HMMA
  alike, which flatters mma.sync; A100: 2,048);
- a tile takes the larger of the two; the bound in useful TFLOP/s is the
  tile's useful FLOPs (its ``tt.dot`` products) over that time on every SM
  (H200: 132 SMs at 1.98 GHz, 790 TFLOP/s peak; A100: 108 at 1.41 GHz).

It is an upper bound: a real kernel also waits on memory and latencies. It
ranks the work per tile, which the tile counts (:mod:`plsh_dist.plan.kernel_tiles`)
multiply into a run's time.

Legend: W warps, s samples, T tokens, H heads, BM x BN a kernel's tile.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tools.kernel_model.kernel_builds import Launch, build
from tools.kernel_model.sass import LoopCost, analyse, disassemble, dot_flops_per_trip, parse_sass, resource_usage


@dataclass(frozen=True)
class Machine:
    """The issue model's GPU: SMs, clock, dense tensor FLOPs per clock per SM, schedulers per SM."""

    name: str
    sms: int
    clock_hz: float
    tensor_flops_per_clock: float
    schedulers: int = 4

    @property
    def peak_tflops(self) -> float:
        return self.tensor_flops_per_clock * self.sms * self.clock_hz / 1e12


#: The machine each compute capability is modelled on.
MACHINES = {90: Machine("H200", 132, 1.98e9, 3023.0), 80: Machine("A100", 108, 1.41e9, 2048.0)}


@dataclass(frozen=True)
class KernelModel:
    """One compiled kernel and its tile's cost.

    Attributes:
        kernel: "fwd", "bwd_dkdv" or "bwd_dq" (or the function's name). bias: "count",
            "window" or "none" (the calibration). dtype, head_dim, arch, causal, documents: the case.
        block_m, block_n, num_warps, num_stages: the launch's tile and options.
        shipped: a launch of the project's launcher (False: the calibration kernel).
        regs: registers per thread; local: local memory per thread (B; spills, stack);
        spill_stores, spill_loads: local stores / loads (``STL`` / ``LDL``) in the code;
        smem: shared memory per block (B).
        loop: the main loop's counts (None when the kernel has no loop with matrix instructions).
        far: the count's second key loop (tiles wholly before the query tile's rows, the count a
            product: :attr:`tools.kernel_model.sass.SassKernel.far`), or None.
        useful_flops: FLOPs of the tile's ``tt.dot`` products.
        function: the kernel's name in the cubin.
        f64_division: the PTX divides in IEEE float64 (``div.rn.f64``: the hash's bucket arithmetic).
    """

    kernel: str
    bias: str
    dtype: str
    head_dim: int
    arch: int
    causal: bool
    documents: int
    block_m: int | None
    block_n: int | None
    num_warps: int
    num_stages: int
    shipped: bool
    regs: int
    local: int
    spill_stores: int
    spill_loads: int
    smem: int
    loop: LoopCost | None
    useful_flops: float
    function: str
    f64_division: bool
    far: LoopCost | None = None

    @property
    def machine(self) -> Machine:
        return MACHINES[self.arch]

    @property
    def loop_spills(self) -> int:
        """Spill stores and loads inside the key loops (those outside run once a program)."""
        return sum(lp.spills for lp in (self.loop, self.far) if lp)

    def _loop(self, far: bool) -> LoopCost:
        return self.far if far else self.loop

    def executed(self, far: bool = False, blocks: float = 0.0) -> float:
        """Matrix FLOPs one tile of the main (``far``: the far) loop issues (every warp's instructions), its
        block loops run ``blocks`` times."""
        lp = self._loop(far)
        return lp.flops_per_warp(blocks) * self.num_warps if lp else 0.0

    @property
    def executed_flops(self) -> float:
        """Matrix FLOPs one tile of the main loop issues."""
        return self.executed()

    @property
    def mma_ratio(self) -> float:
        """Executed over useful matrix work of a tile (1.0: nothing repeated)."""
        return self.executed_flops / self.useful_flops if self.useful_flops else math.nan

    @property
    def uses_wgmma(self) -> bool:
        return bool(self.loop) and any(op.startswith("HGMMA") for op in self.loop.mma)

    def issue_cycles(self, samples: int, taken: float = 1.0, far: bool = False, blocks: float = 0.0) -> float:
        """``taken``: share of trips that run the loop's skippable regions (:attr:`LoopCost.skippable`),
        applied only to a count build with at most one region a sample (each is a sample's block; a
        block not recognised as one stays counted every trip) and no block loop. ``far``: a tile of
        the far loop. ``blocks``: mean trips of the main loop's block loops (the near count's runs)."""
        lp = self._loop(far)
        one_a_sample = 0 < lp.skippable_blocks <= samples or (lp.sample_loops and lp.sample_skippable)
        share = taken if self.bias == "count" and one_a_sample and not lp.block_loops and not far else 1.0
        return self.num_warps * lp.instructions(samples, share, 0.0 if far else blocks) / self.machine.schedulers

    def tensor_cycles(self, far: bool = False, blocks: float = 0.0) -> float:
        return self.executed(far, 0.0 if far else blocks) / self.machine.tensor_flops_per_clock

    def tile_cycles(self, samples: int, taken: float = 1.0, far: bool = False, blocks: float = 0.0) -> float:
        """SM clocks of one tile: issue or tensor, whichever is longer."""
        return max(self.issue_cycles(samples, taken, far, blocks), self.tensor_cycles(far, blocks))

    def mixed_cycles(self, samples: int, taken: float = 1.0, far_share: float = 0.0, blocks: float = 0.0) -> float:
        """Mean clocks of a tile when a share ``far_share`` of the tiles runs the far loop."""
        near = self.tile_cycles(samples, taken, blocks=blocks)
        return near if not self.far or not far_share else \
            far_share * self.tile_cycles(samples, taken, True) + (1.0 - far_share) * near

    def bound_tflops(self, samples: int, taken: float = 1.0, far_share: float = 0.0, blocks: float = 0.0) -> float:
        """Useful TFLOP/s of the whole GPU at this tile cost (the issue-cycle bound); ``far_share``: the
        share of tiles on the far loop; ``blocks``: the main loop's block-loop trips a tile."""
        m = self.machine
        return self.useful_flops / self.mixed_cycles(samples, taken, far_share, blocks) * m.sms * m.clock_hz / 1e12

    def tensor_bound(self, samples: int, taken: float = 1.0, far: bool = False, blocks: float = 0.0) -> bool:
        return self.tensor_cycles(far, blocks) >= self.issue_cycles(samples, taken, far, blocks)


def model_launch(launch: Launch) -> tuple[KernelModel, bytes]:
    """Build ``launch`` as the JIT does and read its code: the model and the cubin."""
    compiled = build(launch)
    cubin = compiled.asm["cubin"]
    functions = parse_sass(disassemble(cubin))
    name = compiled.metadata.name
    read = analyse(name, functions[name])
    res = resource_usage(cubin)
    case = launch.case
    model = KernelModel(
        kernel=launch.kernel, bias=case["bias"], dtype=case["dtype"], head_dim=case["head_dim"], arch=case["arch"],
        causal=case["causal"], documents=case["documents"], block_m=launch.option("BLOCK_M"),
        block_n=launch.option("BLOCK_N"), num_warps=compiled.metadata.num_warps,
        num_stages=compiled.metadata.num_stages, shipped=case["bias"] != "none", regs=res["regs"],
        local=res["local"], spill_stores=read.spill_stores, spill_loads=read.spill_loads,
        smem=int(compiled.metadata.shared), loop=read.main, far=read.far, useful_flops=dot_flops_per_trip(compiled.asm["ttir"]),
        function=name, f64_division="div.rn.f64" in compiled.asm["ptx"])
    return model, cubin


def causal_floor_tiles(kernel: str, T: int, block_m: int, block_n: int) -> int:
    """Tiles one head's causal attention over ``T`` tokens visits in a calibration kernel: per
    query tile its keys up to the diagonal (forward, dQ), per key tile its queries from the
    diagonal on (dK/dV)."""
    if kernel == "bwd_dkdv":
        return sum(math.ceil((T - j * block_n) / block_m) for j in range(math.ceil(T / block_n)))
    return sum(math.ceil(min(T, (i + 1) * block_m) / block_n) for i in range(math.ceil(T / block_m)))


def area_rate(models: list[KernelModel], samples: int, taken: list[float] | None = None,
              far_share: list[float] | None = None, blocks: list[float] | None = None) -> float:
    """Useful TFLOP/s bound of kernels that each cover the same score area once (a backward's
    dK/dV and dQ): their useful FLOPs and clocks per score entry added."""
    taken = taken or [1.0] * len(models)
    far_share = far_share or [0.0] * len(models)
    blocks = blocks or [0.0] * len(models)
    useful = sum(m.useful_flops / (m.block_m * m.block_n) for m in models)
    cycles = sum(m.mixed_cycles(samples, t, f, b) / (m.block_m * m.block_n)
                 for m, t, f, b in zip(models, taken, far_share, blocks))
    machine = models[0].machine
    return useful / cycles * machine.sms * machine.clock_hz / 1e12
