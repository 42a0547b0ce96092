"""The paper's fixed-blocks baseline: one sample of blocks of pitch ``2 sigma_h`` aligned at
position 0, computed as PLSH's blocks are (same strategies, same halo)."""

from __future__ import annotations

import torch

from plsh_dist.biases.base import AttentionCall, LayerSeeds, head_scales
from plsh_dist.biases.plsh import PLSH
from plsh_dist.distributed.sp import attention as sp_attention
from plsh_dist.hashing import FixedBlocks, bucket


class FixedBlocksBaseline(PLSH):
    """Fixed blocks: no seed, one sample."""

    # One mode, two spellings of it: "fixed_blocks" in run configs and checkpoints, "fixed" (or
    # "fixed_blocks") in evaluation specs and the reports written from them; both stay accepted.
    name, spec, aliases = "fixed_blocks", "fixed", ("fixed_blocks",)
    options = {"sigma": "sigma", "rope": "rope"}
    fields = ("sigma", "rope", "backend", "method")
    seeded = False
    summary = "the paper's fixed-blocks baseline: pitch 2*sigma, one sample"

    @classmethod
    def check_fields(cls, cfg) -> None:
        pass  # backend and method: PLSH's

    def label(self) -> str:
        return ""

    def hash_args(self, seeds: LayerSeeds, as_tensor: bool) -> tuple[int, int | torch.Tensor, str, bool]:
        """One sample, no seed: 0 (a tensor for the compiled op)."""
        return 1, torch.zeros((), dtype=torch.int64) if as_tensor else 0, "iid", True

    def sequence_parallel(self, call: AttentionCall, seeds: LayerSeeds) -> torch.Tensor:
        return sp_attention.fixed_blocks_attention(call.q, call.k, call.v, group=call.group,
                                                   sigma=head_scales(self.cfg.sigma, call.num_heads)[0],
                                                   backend=self.cfg.backend, method=self.cfg.method, **call.common())

    def new_hash(self, num_heads: int, seed) -> FixedBlocks:
        """The fixed blocks (``seed`` unused)."""
        return FixedBlocks(head_scales(self.cfg.sigma, num_heads)[0])

    def reference_weights(self, positions, num_heads: int, seed: int) -> torch.Tensor:
        return FixedBlocks(head_scales(self.cfg.sigma, num_heads)[0]).averaged_mask(positions)

    def cost_samples(self) -> int:
        return 1

    @classmethod
    def pairs_per_head(cls, setup, T: int) -> list[float]:
        """Blocks of pitch ``2 sigma_h`` from position 0, counted exactly."""
        out = []
        for sigma in setup.sigma:
            sizes = torch.bincount(bucket(torch.arange(T, dtype=torch.float64), 2.0 * sigma, 0.0).long()).double()
            out.append(float((sizes * (sizes + 1) / 2).sum()))
        return out

    @classmethod
    def kernel_hash(cls, setup, sigma, seed: int) -> FixedBlocks:
        return FixedBlocks(sigma)
