"""Worker of the compiled sequence-parallel tests (spawned, gloo).

Every rank builds the same tiny Qwen3 from one seed, applies sequence parallelism and takes decoder
layer 1 on its chunk (global ``position_ids``). For each bias the layer compiles under
``torch.compile(fullgraph=True)`` with zero graph breaks (``torch._dynamo.explain``), and its output and
gradients (of the input and of every parameter) equal the eager SP layer's. Every rank logs the
collectives it issues (name and tensor shapes); the logs are equal on every rank, compiled and eager.
"""

from __future__ import annotations

import dataclasses
import os
import sys

import torch
import torch._dynamo
import torch.distributed as dist

from plsh_dist.distributed.sp_chunks import sp_chunk, sp_positions
from plsh_dist.models import AttentionConfig, apply_sequence_parallel, build_model, presets
from plsh_dist.models.runtime import AttentionRuntime
from tests.models.test_compile import BIASES  # every bias the models take
from tests.tolerances import FP32

B, T, OFFSET = 2, 48, 16
#: bf16 against bf16 eager: the same op on the same inputs, only the surrounding layer's ops traced by
#: AOTAutograd (its decompositions may round once more than eager's kernels: 2 bf16 ulps of O(1) values)
BF16 = dict(atol=2e-2, rtol=2e-2)

_COLLECTIVES = ("all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor", "all_reduce",
                "broadcast", "barrier", "all_to_all", "all_to_all_single")


class CollectiveLog:
    """Wraps torch.distributed's collectives to record ``(name, shapes)`` in call order."""

    def __init__(self):
        self.calls: list[tuple] = []
        self._saved = {}

    def __enter__(self):
        for name in _COLLECTIVES:
            fn = self._saved[name] = getattr(dist, name)

            def logged(*args, _fn=fn, _name=name, **kw):
                shapes = tuple(tuple(x.shape) for x in args if isinstance(x, torch.Tensor))
                lists = tuple(len(x) for x in args if isinstance(x, list))
                self.calls.append((_name, shapes, lists))
                return _fn(*args, **kw)

            setattr(dist, name, logged)
        return self

    def __exit__(self, *exc):
        for name, fn in self._saved.items():
            setattr(dist, name, fn)


def _layer_call(model, rank: int, world: int, dtype, documents: bool):
    """``f(h) -> hidden states`` of layer 1 on this rank's chunk, and the chunk's input (B, T/P, hidden)."""
    decoder = model.get_decoder()
    g = torch.Generator().manual_seed(3)
    h_full = torch.randn(B, T, model.config.hidden_size, generator=g, dtype=dtype)
    h = sp_chunk(h_full, rank, world).clone().requires_grad_(True)
    position_ids = sp_positions(T, rank, world, offset=OFFSET)[None].expand(B, -1)
    cos_sin = decoder.rotary_emb(h, position_ids)
    layer = decoder.layers[1]
    kwargs = {}
    if documents:  # offsets over the whole (B, T) batch: row 0 one document, row 1 two (the second starts mid-chunk)
        split = T // 2 + 3
        cu = torch.tensor([0, T, T + split, 2 * T], dtype=torch.int32)
        kwargs = dict(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=T, max_length_k=T)

    def f(x):
        out = layer(x, attention_mask=None, position_ids=position_ids, position_embeddings=cos_sin, **kwargs)
        return out[0] if isinstance(out, tuple) else out

    return f, h


def _output_and_grads(f, h, model):
    model.zero_grad(set_to_none=True)
    h.grad = None
    out = f(h)
    probe = torch.linspace(-1, 1, out.numel(), dtype=torch.float64).view_as(out).to(out.dtype)
    (out * probe).sum().backward()
    return [out.detach(), h.grad.clone()] + [p.grad.clone() for p in model.parameters() if p.grad is not None]


def _same_on_every_rank(log: list, what: str) -> None:
    logs = [None] * dist.get_world_size()
    dist.all_gather_object(logs, log)
    assert all(x == logs[0] for x in logs), f"{what}: ranks issued different collectives: {logs}"


def run(rank: int, world: int, init_file: str, names: list[str], dtype_name: str, documents: bool,
        backend: str = "aot_eager") -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)  # several processes share two cores
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    dtype = getattr(torch, dtype_name)
    tol = BF16 if dtype == torch.bfloat16 else FP32
    try:
        for name in names:
            torch._dynamo.reset()
            torch.manual_seed(0)  # same weights on every rank
            model = build_model(dataclasses.replace(presets["tiny"], num_layers=2), AttentionConfig(**BIASES[name]),
                                AttentionRuntime(run_seed=1), dtype=dtype)
            apply_sequence_parallel(model, dist.group.WORLD)
            f, h = _layer_call(model, rank, world, dtype, documents)
            explained = torch._dynamo.explain(f)(h)
            assert explained.graph_break_count == 0, (name, explained.break_reasons)
            assert explained.graph_count == 1, name
            torch._dynamo.reset()
            with CollectiveLog() as eager_log:
                eager = _output_and_grads(f, h, model)
            with CollectiveLog() as compiled_log:
                compiled = _output_and_grads(torch.compile(f, backend=backend, fullgraph=True), h, model)
            assert len(compiled) == len(eager), name
            for i, (a, b) in enumerate(zip(compiled, eager)):
                assert a.dtype == b.dtype, (name, i, a.dtype, b.dtype)
                torch.testing.assert_close(a, b, **tol, msg=lambda m: f"{name} tensor {i}: {m}")
            assert compiled_log.calls, name  # the op's collectives ran inside the compiled graph
            _same_on_every_rank(eager_log.calls, f"{name} eager")
            _same_on_every_rank(compiled_log.calls, f"{name} compiled")
    finally:
        dist.destroy_process_group()
    # Passed: leave without the interpreter's teardown, which once in 4 runs here aborted a rank that had
    # finished every check ("terminate called without an active exception": a C++ thread still joinable
    # when statics were destroyed; tests/train/spawn.py meets the same).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_public_ops(rank: int, world: int, init_file: str) -> None:
    """The public SP functions under ``torch.compile(fullgraph=True)`` with every argument form their docs
    allow (a seed as an int, windows as an int, ints per head or a LongTensor[Hq], documents): outputs and
    q/k/v gradients equal to the eager calls'."""
    from plsh_dist.distributed.sp import attention as sp_attention
    from plsh_dist.hashing import alibi_slopes

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        group = dist.group.WORLD
        g = torch.Generator().manual_seed(0)
        full = [torch.randn(2, 40, H, 16, generator=g) for H in (4, 2, 2)]
        q, k, v = (sp_chunk(x, rank, world).clone().requires_grad_(True) for x in full)
        pos = sp_positions(40, rank, world, offset=5)
        slopes = alibi_slopes(4)
        cu = torch.tensor([0, 40, 57, 80], dtype=torch.int32)  # over the whole (2, 40) batch
        calls = {
            "plsh": lambda q, k, v: sp_attention.plsh_attention(q, k, v, group=group, sigma=slopes.reciprocal(),
                                                                num_samples=3, seed=7, positions=pos),
            "plsh_documents": lambda q, k, v: sp_attention.plsh_attention(
                q, k, v, group=group, sigma=8.0, num_samples=2, seed=7, method="per_sample", positions=pos,
                cu_seqlens=cu),
            "fixed_blocks": lambda q, k, v: sp_attention.fixed_blocks_attention(q, k, v, group=group, sigma=6.0,
                                                                                positions=pos),
            "alibi": lambda q, k, v: sp_attention.alibi_attention(q, k, v, group=group, slopes=slopes, positions=pos),
            "window": lambda q, k, v: sp_attention.alibi_attention(q, k, v, group=group, slopes=slopes, window=9,
                                                                   positions=pos),
            "truncated": lambda q, k, v: sp_attention.alibi_attention(q, k, v, group=group, slopes=slopes,
                                                                      window=(2, 4, 8, 16), positions=pos),
            "truncated_tensor": lambda q, k, v: sp_attention.alibi_attention(
                q, k, v, group=group, slopes=slopes, window=torch.tensor([2, 4, 8, 16]), positions=pos),
            "causal_documents": lambda q, k, v: sp_attention.causal_attention(q, k, v, group=group, positions=pos,
                                                                              cu_seqlens=cu),
        }
        for name, fn in calls.items():
            torch._dynamo.reset()
            results = []
            for call in (fn, torch.compile(fn, backend="aot_eager", fullgraph=True)):
                for x in (q, k, v):
                    x.grad = None
                out = call(q, k, v)
                out.pow(2).sum().backward()
                results.append([out.detach(), q.grad, k.grad, v.grad])
            for a, b in zip(*results):
                torch.testing.assert_close(a, b, **FP32, msg=lambda m: f"{name}: {m}")
    finally:
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
