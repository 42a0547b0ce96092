"""Grouped-query attention: key/value heads shared by groups of query heads.

Query head ``h`` reads key/value head ``h // g`` with ``g = Hq // Hkv``.
Kernels that need ``Hq == Hkv`` get each key/value head repeated ``g`` times
(:func:`repeat_kv`); the gradients of the copies then sum back onto their
head (:func:`sum_kv_repeats`). These two are the only place that rule is written.
"""

from __future__ import annotations

import torch


def repeat_kv(x: torch.Tensor, groups: int, dim: int = 2) -> torch.Tensor:
    """Repeat every key/value head ``groups`` times along the heads axis ``dim``
    (head ``j`` becomes heads ``j*g .. j*g + g - 1``); ``x`` itself when ``groups == 1``."""
    return x.repeat_interleave(groups, dim=dim) if groups > 1 else x


def sum_kv_repeats(dx: torch.Tensor, groups: int, dim: int = 2) -> torch.Tensor:
    """Inverse of :func:`repeat_kv` for gradients: sum each head's ``groups``
    consecutive copies along ``dim``."""
    if groups == 1:
        return dx
    shape = dx.shape
    return dx.view(*shape[:dim], shape[dim] // groups, groups, *shape[dim + 1:]).sum(dim + 1)
