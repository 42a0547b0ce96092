"""Sequence parallelism with the Triton kernel: SP = 2 (gloo, CPU, the kernel under Triton's
interpreter) equals one process running the kernel, outputs and q/k/v gradients: PLSH (the halo
path every PLSH path uses), and windowed and truncated ALiBi (the window's halo on the kernel)."""

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

pytest.importorskip("triton")

from plsh_dist.distributed.sp import attention as sp_attention  # noqa: E402
from plsh_dist.distributed.sp_chunks import sp_chunk, sp_positions  # noqa: E402
from plsh_dist.ops import plsh_attention  # noqa: E402

B, T, HQ, HKV, D = 1, 64, 4, 2, 16
TOL = dict(atol=2e-5, rtol=2e-5)


def _worker(rank: int, world: int, init_file: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    group = dist.new_group(list(range(world)))
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, T, h, D, generator=g) for h in (HQ, HKV, HKV))
    dout = torch.randn(B, T, HQ, D, generator=g)
    sigma = torch.tensor([0.7, 4.0, 20.0, 60.0], dtype=torch.float64)  # blocks from 1 token to beyond a chunk
    for causal in (True, False):
        kw = dict(sigma=sigma, num_samples=4, seed=3, causal=causal, backend="triton")
        full = [x.clone().requires_grad_() for x in (q, k, v)]
        ref = plsh_attention(*full, positions=torch.arange(T) + 500, **kw)
        ref_grads = torch.autograd.grad(ref, full, dout)
        local = [sp_chunk(x, rank, world).clone().requires_grad_() for x in (q, k, v)]
        out = sp_attention.plsh_attention(*local, group=group, positions=sp_positions(T, rank, world, 500), **kw)
        grads = torch.autograd.grad(out, local, sp_chunk(dout, rank, world))
        torch.testing.assert_close(out, sp_chunk(ref, rank, world), **TOL)
        for a, b in zip(grads, ref_grads):
            torch.testing.assert_close(a, sp_chunk(b, rank, world), **TOL)
    dist.barrier()
    dist.destroy_process_group()


def test_sp2_with_the_kernel_equals_one_process(tmp_path):
    if os.environ.get("TRITON_INTERPRET") != "1":  # the spawned ranks inherit the interpreter
        pytest.skip("CPU ranks run the kernel under Triton's interpreter (TRITON_INTERPRET=1, tests/conftest.py)")
    mp.spawn(_worker, args=(2, str(tmp_path / "rendezvous")), nprocs=2, join=True)


def _window_worker(rank: int, world: int, init_file: str) -> None:
    """Windowed and truncated ALiBi under SP on the kernel (its CUDA choice, made on CPU here: the
    interpreter stands in for the device) against one process on the kernel."""
    import plsh_dist.distributed.sp.alibi_window_halo as halo_mod
    import plsh_dist.ops.alibi_kernel as alibi_kernel
    from plsh_dist.hashing import alibi_slopes
    from plsh_dist.ops.alibi import alibi_attention, equal_cost_c, truncation_windows

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    group = dist.new_group(list(range(world)))
    alibi_kernel.triton_cuda = lambda device, dtype: True  # where ALiBi chooses its kernel
    calls = []
    kernel_forward = halo_mod.banded_forward
    halo_mod.banded_forward = lambda *a, **kw: calls.append(1) or kernel_forward(*a, **kw)
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(B, T, h, D, generator=g) for h in (HQ, HKV, HKV))
    dout = torch.randn(B, T, HQ, D, generator=g)
    slopes = alibi_slopes(HQ)
    windows = [40, truncation_windows(equal_cost_c(8), slopes.reciprocal())]  # 40: wider than a chunk
    for window in windows:
        for causal in (True, False):
            kw = dict(slopes=slopes, window=window, causal=causal)
            full = [x.clone().requires_grad_() for x in (q, k, v)]
            ref = alibi_attention(*full, positions=torch.arange(T) + 500, **kw)
            ref_grads = torch.autograd.grad(ref, full, dout)
            local = [sp_chunk(x, rank, world).clone().requires_grad_() for x in (q, k, v)]
            out = sp_attention.alibi_attention(*local, group=group, positions=sp_positions(T, rank, world, 500), **kw)
            grads = torch.autograd.grad(out, local, sp_chunk(dout, rank, world))
            torch.testing.assert_close(out, sp_chunk(ref, rank, world), **TOL)
            for a, b in zip(grads, ref_grads):
                torch.testing.assert_close(a, sp_chunk(b, rank, world), **TOL)
    assert len(calls) == 2 * len(windows)  # every SP call ran the kernel
    dist.barrier()
    dist.destroy_process_group()


def test_sp2_windows_on_the_kernel_equal_one_process(tmp_path):
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("CPU ranks run the kernel under Triton's interpreter (TRITON_INTERPRET=1, tests/conftest.py)")
    mp.spawn(_window_worker, args=(2, str(tmp_path / "rendezvous")), nprocs=2, join=True)
