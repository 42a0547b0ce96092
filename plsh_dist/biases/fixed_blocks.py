"""The paper's fixed-blocks baseline: one sample of blocks of pitch ``2 sigma_h`` aligned at
position 0, computed as PLSH's blocks are (same strategies, same halo)."""

from __future__ import annotations

import torch

from plsh_dist.biases.base import AttentionCall, LayerSeeds, hash_sigma, head_scales
from plsh_dist.biases.plsh import PLSH
from plsh_dist.distributed.sp import attention as sp_attention
from plsh_dist.hashing import FixedBlocks, bucket
from plsh_dist.ops.plsh import block_attention, block_attention_op


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

    def forward(self, call: AttentionCall, seeds: LayerSeeds) -> torch.Tensor:
        cfg, q, k, v = self.cfg, call.q, call.k, call.v
        if call.compiled:
            return block_attention_op(q, k, v, call.positions, call.cu_seqlens, torch.zeros((), dtype=torch.int64),
                                      hash_sigma(cfg.sigma, call.num_heads, q.device), 1, "iid", True, True,
                                      call.scale, cfg.backend, cfg.method, True)[0]
        sigma = head_scales(cfg.sigma, call.num_heads)[0]
        if call.group is not None:
            return sp_attention.fixed_blocks_attention(q, k, v, group=call.group, sigma=sigma, backend=cfg.backend,
                                                       method=cfg.method, **call.common())
        return block_attention(q, k, v, sigma, (1, 0, "iid", True), call.positions, True, call.scale, cfg.backend,
                               cfg.method, False, call.cu_seqlens)

    def new_hash(self, num_heads: int, seed: None) -> FixedBlocks:
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
