"""Read a compiled kernel's SASS: its instructions, loops and main key loop.

Input is the text of ``cuobjdump -sass`` (NVIDIA's disassembler, shipped in
Triton's NVIDIA backend: :func:`cuobjdump_path`) and the kernel's Triton IR
(``ttir``), which holds its ``tt.dot`` products with their shapes.

- A **loop** is a backward branch: ``BRA`` to an address at or before its
  own; its body is ``[target, branch]``. Loops nest by containment.
- The **main loop** is the outermost loop holding matrix instructions of its
  own (outside its nested loops; ``HGMMA``, Hopper's wgmma; ``HMMA``, mma.sync):
  one trip per key tile in the forward and dQ kernels, per query tile in dK/dV.
  Where several loops qualify (a loop split at the causal diagonal), the one with
  the most instructions is taken (the conservative reading); all are listed.
- Loops nested in the main loop without matrix instructions are **per-sample**
  loops (the count's loop over the hash's samples): their bodies run s times
  a tile. Nested loops with matrix instructions are **block loops** (the near
  count's loop over the runs of blocks that meet the tile, ``BLOCK_CHUNK`` a
  trip): their bodies run as many times a tile as the hash's blocks say (a
  measured mean: :func:`plsh_dist.plan.kernel_tiles.block_trips`). Nested loops
  of fewer than :data:`WAIT_LOOP_MAX` instructions that poll a barrier
  (``SYNCS``, ``NANOSLEEP``) are waits, counted once.
- Instructions are counted statically (every instruction of a body once per
  trip: a branch skipped inside the body is counted as run). ``CALL`` sites in
  a body (the float64 division's slow path, taken only for special operands)
  are reported, their callee's instructions are not counted.

Matrix work of one instruction, per warp: ``HGMMA.MxNxK`` is a warpgroup's
(4 warps) ``M x N x K`` product, ``HMMA.MNK`` (e.g. ``16816``: m16 n8 k16) one
warp's. Useful work of a tile is the ``tt.dot`` products of the IR's loop
that holds them (``2 M N K`` FLOPs each), not the count's fp16-accumulated ones.

Legend: W warps of the kernel, s samples.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

#: Nested loops shorter than this that poll a barrier are waits, not sample loops.
WAIT_LOOP_MAX = 8
_WAIT_OPS = {"SYNCS", "NANOSLEEP"}
_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;\s*/\*")
_FUNCTION = re.compile(r"Function\s*:\s*(\S+)")
_F64_OPS = {"DADD", "DMUL", "DFMA", "DSETP", "DSET", "DMNMX", "DMMA"}


@dataclass(frozen=True)
class Instruction:
    address: int
    predicate: str
    opcode: str  # with modifiers: "HGMMA.64x32x16.F32.BF16"
    operands: str

    @property
    def base(self) -> str:
        return self.opcode.split(".")[0]

    @property
    def modifiers(self) -> list[str]:
        return self.opcode.split(".")[1:]

    @property
    def branch_target(self) -> int | None:
        if self.base != "BRA":
            return None
        m = re.search(r"0x([0-9a-f]+)\s*$", self.operands)
        return int(m.group(1), 16) if m else None

    @property
    def is_f64(self) -> bool:
        """A float64 instruction: the D* arithmetic, conversions / rounding with an F64 operand,
        MUFU's 64-bit reciprocal (square root) seeds."""
        if self.base in _F64_OPS or "F64" in self.modifiers:
            return True
        return self.base == "MUFU" and any(m.endswith("64H") for m in self.modifiers)

    @property
    def mma_shape(self) -> tuple[int, int, int] | None:
        """(M, N, K) of a matrix instruction, None for any other."""
        if self.base == "HGMMA":
            m, n, k = (int(x) for x in self.modifiers[0].split("x"))
            return m, n, k
        if self.base == "HMMA":
            digits = self.modifiers[0]  # "16816": m16 n8 k16; "1688": m16 n8 k8
            return int(digits[:2]), int(digits[2]), int(digits[3:])
        return None

    @property
    def mma_flops_per_warp(self) -> float:
        """FLOPs of this instruction's product per warp that issues it (0 for non-matrix)."""
        shape = self.mma_shape
        if shape is None:
            return 0.0
        m, n, k = shape
        return 2 * m * n * k / (4 if self.base == "HGMMA" else 1)


@dataclass(frozen=True)
class Loop:
    start: int  # address of the first instruction of the body (the branch's target)
    end: int  # address of the backward branch

    def contains(self, other: "Loop") -> bool:
        return self.start <= other.start and other.end <= self.end and self != other


def parse_sass(text: str) -> dict[str, list[Instruction]]:
    """Instructions of every function in ``cuobjdump -sass`` text, in address order."""
    out: dict[str, list[Instruction]] = {}
    current = None
    for line in text.splitlines():
        fm = _FUNCTION.search(line)
        if fm:
            current = out.setdefault(fm.group(1), [])
            continue
        m = _LINE.search(line)
        if m is None or current is None:
            continue
        body = m.group(2).strip()
        pred = ""
        if body.startswith("@"):
            pred, body = body.split(None, 1)
        opcode, _, operands = body.partition(" ")
        current.append(Instruction(int(m.group(1), 16), pred, opcode, operands.strip()))
    return out


def loops(instructions: list[Instruction]) -> list[Loop]:
    """Every backward branch's loop (a branch to itself, padding after the last ``EXIT``, excluded)."""
    found = set()
    for ins in instructions:
        target = ins.branch_target
        if target is not None and target < ins.address:
            found.add(Loop(target, ins.address))
    return sorted(found, key=lambda lp: (lp.start, -lp.end))


@dataclass(frozen=True)
class LoopCost:
    """Per-trip static counts of one main loop (per warp).

    Attributes:
        loop: the main loop. per_tile: instructions of one trip outside its sample loops.
        per_sample: instructions of its sample loops' bodies (each run s times a trip).
        f64_per_tile, f64_per_sample: float64 instructions among them.
        mma: matrix instructions of one trip outside its block loops, by opcode
            (``{"HGMMA.64x16x16.F32.BF16": 16}``).
        mma_flops_per_warp: their FLOPs per warp. calls: ``CALL`` sites in the body.
        pipelined: "TMA" (``UTMALDG`` / ``UBLKCP``), "cp.async" (``LDGSTS``) or "no": how the
            trip's loads reach shared memory.
        sample_loops, wait_loops: the nested loops, by kind.
        skippable: instructions of the trip (outside sample loops) inside the regions its forward
            conditional branches skip, outermost regions only, none holding a matrix instruction
            (the count's per-sample blocks, run only where a sample's blocks cut the tile).
        skippable_blocks: how many such regions.
        sample_skippable: the same regions inside the sample loops' bodies (run s times a trip, each
            only where the sample's blocks cut the tile).
        spills: local-memory stores and loads (``STL`` / ``LDL``) in the body, nested loops included.
        block_loops: the nested loops with matrix instructions (block loops); per_block: their bodies'
            instructions (run ``blocks`` times a trip); block_mma, block_mma_flops_per_warp: their matrix
            instructions and FLOPs per warp, one trip of each.
    """

    loop: Loop
    per_tile: int
    per_sample: int
    f64_per_tile: int
    f64_per_sample: int
    mma: dict[str, int]
    mma_flops_per_warp: float
    calls: int
    pipelined: str
    sample_loops: list[Loop] = field(default_factory=list)
    wait_loops: list[Loop] = field(default_factory=list)
    skippable: int = 0
    skippable_blocks: int = 0
    sample_skippable: int = 0
    spills: int = 0
    block_loops: list[Loop] = field(default_factory=list)
    per_block: int = 0
    block_mma: dict[str, int] = field(default_factory=dict)
    block_mma_flops_per_warp: float = 0.0

    def instructions(self, samples: int, taken: float = 1.0, blocks: float = 0.0) -> float:
        """Instructions per warp of one trip at ``samples`` samples, the skippable regions run in
        a share ``taken`` of the trips (1: every instruction counted, the static reading), the block
        loops ``blocks`` times."""
        skipped = 1.0 - taken
        return (self.per_tile - skipped * self.skippable + samples * (self.per_sample - skipped * self.sample_skippable)
                + blocks * self.per_block)

    def flops_per_warp(self, blocks: float = 0.0) -> float:
        """Matrix FLOPs per warp of one trip, the block loops run ``blocks`` times."""
        return self.mma_flops_per_warp + blocks * self.block_mma_flops_per_warp

    @property
    def mma_instructions(self) -> int:
        return sum(self.mma.values())


@dataclass(frozen=True)
class SassKernel:
    """One kernel's SASS read as the module doc says.

    Attributes:
        name: the function. instructions: all of them. main: the main loop's counts.
        far: a second main loop that issues more matrix work than every other (the count's key
            tiles wholly before the query tile's rows, whose count is a product on the tensor
            cores), or None; ``main`` is then the costliest of the others.
        candidates: every innermost loop holding matrix instructions (``main`` and ``far`` among them).
        spill_stores, spill_loads: local-memory stores / loads (``STL`` / ``LDL``) anywhere.
    """

    name: str
    instructions: list[Instruction]
    main: LoopCost | None
    far: LoopCost | None
    candidates: list[LoopCost]
    spill_stores: int
    spill_loads: int


def _body(instructions, loop: Loop) -> list[Instruction]:
    return [i for i in instructions if loop.start <= i.address <= loop.end]


def _loop_cost(instructions, loop: Loop, nested: list[Loop]) -> LoopCost:
    body = _body(instructions, loop)
    direct = [lp for lp in nested if not any(o.contains(lp) for o in nested)]  # outermost nested ones
    waits = [lp for lp in direct if len(_body(instructions, lp)) < WAIT_LOOP_MAX
             and any(i.base in _WAIT_OPS for i in _body(instructions, lp))]
    blocks = [lp for lp in direct if lp not in waits and any(i.mma_shape for i in _body(instructions, lp))]
    samples = [lp for lp in direct if lp not in waits and lp not in blocks]
    in_samples = {i.address for lp in samples for i in _body(instructions, lp)}
    in_blocks = {i.address for lp in blocks for i in _body(instructions, lp)}
    block = [i for i in body if i.address in in_blocks]
    body = [i for i in body if i.address not in in_blocks]
    tile = [i for i in body if i.address not in in_samples]
    sample = [i for i in body if i.address in in_samples]
    mma: dict[str, int] = {}
    for i in body:
        if i.mma_shape is not None:
            mma[i.opcode] = mma.get(i.opcode, 0) + 1
    block_mma: dict[str, int] = {}
    for i in block:
        if i.mma_shape is not None:
            block_mma[i.opcode] = block_mma.get(i.opcode, 0) + 1
    ops = {i.base for i in body}
    pipelined = "TMA" if ops & {"UTMALDG", "UBLKCP"} else "cp.async" if "LDGSTS" in ops else "no"
    regions = _skipped_regions(tile)
    in_sample_regions = [r for lp in samples for r in _skipped_regions(_body(instructions, lp))]
    return LoopCost(loop, len(tile), len(sample), sum(i.is_f64 for i in tile), sum(i.is_f64 for i in sample), mma,
                    sum(i.mma_flops_per_warp for i in body), sum(i.base == "CALL" for i in body), pipelined,
                    samples, waits, sum(len(r) for r in regions), len(regions),
                    sum(len(r) for r in in_sample_regions), sum(i.base in ("STL", "LDL") for i in body + block),
                    blocks, len(block), block_mma, sum(i.mma_flops_per_warp for i in block))


def _skipped_regions(body: list[Instruction]) -> list[list[Instruction]]:
    """Outermost regions ``(branch, target)`` of the body's forward conditional branches that hold
    no matrix instruction and no other branch's target from outside (a plain if-block)."""
    out, end = [], -1
    for n, i in enumerate(body):
        target = i.branch_target
        if i.address <= end or target is None or target <= i.address or not i.predicate:
            continue
        region = [x for x in body[n + 1:] if x.address < target]
        if region and len(region) == len(body[n + 1:n + 1 + len(region)]) and not any(x.mma_shape for x in region):
            out.append(region)
            end = target
    return out


def analyse(name: str, instructions: list[Instruction]) -> SassKernel:
    """The main loop and its counts (module doc)."""
    all_loops = loops(instructions)
    with_mma = [lp for lp in all_loops if any(i.mma_shape for i in _body(instructions, lp))]
    own = [lp for lp in with_mma if any(i.mma_shape for i in _body(instructions, lp)
                                        if not any(lp.contains(o) and o.start <= i.address <= o.end for o in with_mma))]
    outermost = [lp for lp in own if not any(o.contains(lp) for o in own)]
    candidates = [_loop_cost(instructions, lp, [o for o in all_loops if lp.contains(o)]) for lp in outermost]
    by_flops = sorted(candidates, key=lambda c: c.mma_flops_per_warp)
    far = by_flops[-1] if len(by_flops) > 1 and by_flops[-1].mma_flops_per_warp > by_flops[-2].mma_flops_per_warp \
        else None
    rest = [c for c in candidates if c is not far]
    main = max(rest, key=lambda c: (c.per_tile + c.per_sample, c.loop.start), default=None)
    return SassKernel(name, instructions, main, far, candidates, sum(i.base == "STL" for i in instructions),
                      sum(i.base == "LDL" for i in instructions))


# -- the Triton IR's products ------------------------------------------------------------------

_DOT = re.compile(r"=\s*tt\.dot\s.*?:\s*tensor<(\d+)x(\d+)x\w+>\s*\*\s*tensor<(\d+)x(\d+)x\w+>"
                  r"\s*->\s*tensor<\d+x\d+x(\w+)>")


def dot_flops_per_trip(ttir: str) -> float:
    """FLOPs (``2 M N K`` each) of the attention's own ``tt.dot`` products in one trip of its key loop:
    the ``scf.for`` holding the fewest directly, among those holding some (the count's loop over key
    tiles before the query tile's rows holds one more, its count's product); the products outside any
    loop when none does. Products accumulated in fp16 are the near count's (0/1 operands), not the
    attention's: not counted."""
    stack: list[int | None] = []  # per open region: the id of an scf.for, None for any other region
    per_loop: dict[int | None, float] = {}
    loop_id = 0
    for line in ttir.splitlines():
        m = _DOT.search(line)
        if m and m.group(5) != "f16":
            M, K, K2, N = (int(x) for x in m.groups()[:4])
            if K != K2:
                raise ValueError(f"tt.dot with mismatched inner dims: {line.strip()}")
            owner = next((x for x in reversed(stack) if x is not None), None)
            per_loop[owner] = per_loop.get(owner, 0.0) + 2.0 * M * N * K
        net = line.count("{") - line.count("}")
        if net > 0:
            for _ in range(net):
                if "scf.for" in line:
                    loop_id += 1
                    stack.append(loop_id)
                else:
                    stack.append(None)
        elif net < 0:
            del stack[net:]
    loops_only = {k: v for k, v in per_loop.items() if k is not None}
    if loops_only:
        return min(loops_only.values())
    return per_loop.get(None, 0.0)


# -- tools -----------------------------------------------------------------------------------------


def cuobjdump_path() -> Path | None:
    """``cuobjdump`` of Triton's NVIDIA backend, None where that backend or the tool is missing."""
    try:
        import triton  # noqa: PLC0415
    except Exception:  # noqa: BLE001 (a missing or broken triton: no tool)
        return None
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    return tool if tool.is_file() else None


def _cuobjdump(cubin: bytes, flag: str) -> str:
    tool = cuobjdump_path()
    if tool is None:
        raise RuntimeError("cuobjdump not found: it ships with Triton's NVIDIA backend (pip install 'triton>=3.6')")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "k.cubin"
        path.write_bytes(cubin)
        return subprocess.run([str(tool), flag, str(path)], capture_output=True, text=True, check=True).stdout


def disassemble(cubin: bytes) -> str:
    """``cuobjdump -sass`` of a cubin."""
    return _cuobjdump(cubin, "-sass")


def resource_usage(cubin: bytes) -> dict[str, int]:
    """Registers per thread and local memory (stack, spills) per thread of the cubin's kernel
    (``cuobjdump -res-usage``)."""
    text = _cuobjdump(cubin, "-res-usage")
    num = lambda key: int(re.search(rf"\b{key}:(\d+)", text).group(1))  # noqa: E731
    return {"regs": num("REG"), "local": num("LOCAL")}
