"""The paper's fixed-blocks baseline: one sample of blocks of pitch ``2 sigma_h`` aligned at
position 0, computed as PLSH's blocks are (same strategies, same halo)."""

from __future__ import annotations

import torch

from plsh_dist.biases.plsh import PLSH, PLSHCost
from plsh_dist.hashing import FixedBlocks, bucket


class FixedBlocksCost(PLSHCost):
    """PLSH's cost model on the one sample of fixed blocks, whose pairs are counted exactly."""

    def pairs_per_head(self, T: int) -> list[float]:
        """Blocks of pitch ``2 sigma_h`` from position 0, counted exactly."""
        out = []
        for sigma in self.setup.sigma:
            sizes = torch.bincount(bucket(torch.arange(T, dtype=torch.float64), 2.0 * sigma, 0.0).long()).double()
            out.append(float((sizes * (sizes + 1) / 2).sum()))
        return out


class FixedBlocksBaseline(PLSH):
    """Fixed blocks: no seed, one sample."""

    # One mode, two spellings of it: "fixed_blocks" in run configs and checkpoints, "fixed" (or
    # "fixed_blocks") in evaluation specs and the reports written from them; both stay accepted.
    name, spec, aliases = "fixed_blocks", "fixed", ("fixed_blocks",)
    options = {"sigma": "sigma", "rope": "rope"}
    fields = ("sigma", "rope", "backend", "method")
    seeded = False
    summary = "the paper's fixed-blocks baseline: pitch 2*sigma, one sample"
    cost_model = FixedBlocksCost

    @classmethod
    def check_fields(cls, cfg) -> None:
        pass  # backend and method: PLSH's

    def label(self) -> str:
        return ""

    def new_hash(self, num_heads: int, seed, device: torch.device | None = None) -> FixedBlocks:
        """The fixed blocks (``seed`` unused), sigma on ``device`` (None: the host's)."""
        return FixedBlocks(self.sigma_on(num_heads, device))

    def samples(self) -> int:
        return 1
