"""ParallelDims: rank arithmetic, group layout, loud validation, real gloo groups."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from plsh_dist.distributed import ParallelDims, default_backend


def test_layout_world4_sp2():
    dims = ParallelDims(4, 2)
    assert dims.dp_size == 2
    assert dims.sp_group_ranks() == [[0, 1], [2, 3]]
    assert dims.dp_group_ranks() == [[0, 2], [1, 3]]
    assert [dims.sp_rank(r) for r in range(4)] == [0, 1, 0, 1]
    assert [dims.dp_rank(r) for r in range(4)] == [0, 0, 1, 1]
    assert dims.sp_enabled and dims.dp_enabled


@pytest.mark.parametrize("world,sp", [(1, 1), (2, 1), (2, 2), (6, 3), (8, 4)])
def test_groups_partition_the_world(world, sp):
    dims = ParallelDims(world, sp)
    for groups, size in ((dims.sp_group_ranks(), sp), (dims.dp_group_ranks(), world // sp)):
        flat = sorted(r for g in groups for r in g)
        assert flat == list(range(world)) and all(len(g) == size for g in groups)
    # Every (sp group, dp group) pair meets in exactly one rank.
    for sg in dims.sp_group_ranks():
        for dg in dims.dp_group_ranks():
            assert len(set(sg) & set(dg)) == 1


def test_validation_names_every_factor():
    with pytest.raises(ValueError) as err:
        ParallelDims(6, 4)
    msg = str(err.value)
    assert "sp_size=4" in msg and "world_size=6" in msg and "parallel.sp_size" in msg
    with pytest.raises(ValueError, match="sp_size must be a positive int"):
        ParallelDims(2, 0)
    with pytest.raises(ValueError, match="world_size must be a positive int"):
        ParallelDims(0, 1)
    with pytest.raises(ValueError, match="outside"):
        ParallelDims(2, 2).sp_rank(2)
    assert ParallelDims(4, 2).describe() == "world_size=4 = dp_size=2 x sp_size=2"


def test_default_backend():
    assert default_backend("cpu") == "gloo"
    assert default_backend(torch.device("cuda", 0)) == "nccl"


def _worker(rank: int, world: int, init_file: str, out: dict) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        dims = ParallelDims(world, 2)
        sp_group, dp_group = dims.build_groups()
        # Sum of ranks over each group tells which ranks are in it.
        x = torch.tensor([float(rank)])
        dist.all_reduce(x, group=sp_group)
        y = torch.tensor([float(rank)])
        dist.all_reduce(y, group=dp_group)
        out[rank] = (x.item(), y.item())
        with pytest.raises(ValueError, match="process group has 4 ranks"):
            ParallelDims(2, 2).build_groups()
    finally:
        dist.destroy_process_group()


def test_build_groups_gloo(tmp_path):
    world = 4
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_worker, args=(world, str(tmp_path / "rdzv"), out), nprocs=world)
        result = dict(out)
    # SP groups [0,1] [2,3] -> sums 1, 1, 5, 5; DP groups [0,2] [1,3] -> sums 2, 4, 2, 4.
    assert result == {0: (1.0, 2.0), 1: (1.0, 4.0), 2: (5.0, 2.0), 3: (5.0, 4.0)}
