"""A new PLSH kernel backend is its strategy, one table row and its test: this file is all three.

``DenseReference`` computes the estimator as one dense fp64 attention with the bias ``log c_ij`` (``c_ij``
the number of samples in which i and j share a block), written against the strategy interface alone
(:class:`~plsh_dist.ops.strategy.Strategy`: ``forward`` / ``backward`` and the attributes), and joins the
table by one call (:func:`~plsh_dist.ops.backends.add_backend`). The package then runs it as it runs the
shipped strategies, by its attributes: the config's checks, the public op (eager and compiled), the
model's forward and backward (compiled too), sequence parallelism (2 ranks, gloo, eager and compiled)
and the planner. Each call chooses its strategy once.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from dataclasses import dataclass

import pytest
import torch
import torch.multiprocessing as mp

from plsh_dist.ops import backends, plsh_attention
from plsh_dist.ops.backends import Method, Row, add_backend, remove_backend
from plsh_dist.ops.gqa import repeat_kv, sum_kv_repeats
from plsh_dist.ops.merge import accum_dtype
from plsh_dist.ops.strategy import Strategy
from tests.tolerances import FP64

NAME = "dense_ref"


def _probs(q, k, lsh, positions, causal: bool, scale: float, docs):
    """``(P, lse)`` in fp64: P (B, Hq, T, T) the softmax of ``q k^T scale + log c``, lse (B, Hq, T)."""
    T, groups = q.shape[1], q.shape[2] // k.shape[2]
    logits = torch.einsum("bihd,bjhd->bhij", q.double(), repeat_kv(k.double(), groups)) * scale
    counts = lsh.averaged_mask(positions.cpu()) * lsh.num_samples  # (1 or Hq, T, T)
    seen = counts > 0
    if causal:
        seen &= torch.ones(T, T, dtype=torch.bool).tril()
    if docs is not None:
        seen &= docs.ids[:, None] == docs.ids[None, :]
    logits = logits + torch.where(seen, counts.log(), float("-inf")).to(logits.device)
    lse = torch.logsumexp(logits, dim=-1)
    return torch.exp(logits - lse[..., None]), lse


@dataclass(frozen=True)
class DenseReference(Strategy):
    """Strategy: PLSH's one-pass form as one dense fp64 attention (O(T^2): a reference, not a kernel)."""

    onepass = True

    def forward(self, q, k, v, lsh, positions, *, causal, scale, docs=None):
        probs, lse = _probs(q, k, lsh, positions, causal, scale, docs)
        out = torch.einsum("bhij,bjhd->bihd", probs, repeat_kv(v.double(), q.shape[2] // k.shape[2]))
        return out.to(q.dtype), lse.to(accum_dtype(q.dtype)), None

    def backward(self, dout, q, k, v, out, lse, lsh, positions, *, causal, scale, docs=None, saved=None):
        """Recomputes P (and the output) from q, k, v: rows that only serve as keys (a halo's) pass any
        ``out`` / ``lse`` with a zero ``dout``."""
        groups = q.shape[2] // k.shape[2]
        probs, _ = _probs(q, k, lsh, positions, causal, scale, docs)
        k_h, v_h, do = repeat_kv(k.double(), groups), repeat_kv(v.double(), groups), dout.double()
        o = torch.einsum("bhij,bjhd->bihd", probs, v_h)
        dp = torch.einsum("bihd,bjhd->bhij", do, v_h)
        ds = probs * (dp - (do * o).sum(-1).transpose(1, 2)[..., None])
        dq = torch.einsum("bhij,bjhd->bihd", ds, k_h) * scale
        dk = sum_kv_repeats(torch.einsum("bhij,bihd->bjhd", ds, q.double()) * scale, groups)
        dv = sum_kv_repeats(torch.einsum("bhij,bihd->bjhd", probs, do), groups)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


#: The table row: the backend's name, the method it computes, where it runs, the strategy; out of auto.
ROW = Row(NAME, Method.ONEPASS, lambda device, dtype: True, "anything", DenseReference(), in_auto=False)


@pytest.fixture
def toy():
    add_backend(ROW)  # the one table line
    yield DenseReference()
    remove_backend(NAME)


def _inputs(T=24, Hq=4, Hkv=2, D=8, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, T, H, D, generator=g, dtype=dtype, requires_grad=True) for H in (Hq, Hkv, Hkv)]


def _out_and_grads(fn, q, k, v):
    for x in (q, k, v):
        x.grad = None
    out, lse = fn(q, k, v)
    (out.pow(2).sum() + lse.sum()).backward()
    return [out.detach(), lse.detach(), q.grad.clone(), k.grad.clone(), v.grad.clone()]


def test_the_table_takes_it(toy):
    from plsh_dist.models import AttentionConfig

    cpu = torch.device("cpu")
    assert backends.choose_strategy(NAME, "auto", cpu, torch.float32, 4) == toy
    assert backends.choose_strategy("auto", "auto", cpu, torch.float32, 4) != toy  # not in backend="auto"
    assert NAME in backends.backend_names() and NAME not in backends.BACKENDS
    assert AttentionConfig(bias="plsh", backend=NAME).backend == NAME
    assert f"{NAME}   onepass     anything" in backends.describe_table()
    with pytest.raises(ValueError, match="has no method='per_sample'"):
        backends.choose_strategy(NAME, "per_sample", cpu, torch.float32, 4)


def test_it_leaves_the_table_as_it_was():
    assert NAME not in backends.backend_names()
    with pytest.raises(ValueError, match="backend must be one of"):
        backends.choose_strategy(NAME, "auto", torch.device("cpu"), torch.float32, 4)


@pytest.mark.parametrize("documents", [False, True])
def test_the_op_eager_and_compiled_gives_the_one_pass(toy, documents):
    """Outputs, lse and gradients equal the shipped one pass's (the same estimator), eagerly and compiled."""
    q, k, v = _inputs()
    sigma = torch.tensor([2.0, 5.0, 9.0, 30.0], dtype=torch.float64)
    cu = torch.tensor([0, 7, 24, 31, 48], dtype=torch.int32) if documents else None

    def call(backend):
        return lambda q, k, v: plsh_attention(q, k, v, sigma=sigma, num_samples=3, seed=11, backend=backend,
                                              method="onepass", return_lse=True, cu_seqlens=cu)

    ours = _out_and_grads(call(NAME), q, k, v)
    shipped = _out_and_grads(call("torch"), q, k, v)
    torch._dynamo.reset()
    compiled = _out_and_grads(torch.compile(call(NAME), backend="aot_eager", fullgraph=True), q, k, v)
    for a, b, c in zip(ours, shipped, compiled):
        torch.testing.assert_close(a, b, **FP64)
        assert torch.equal(a, c)


def _model(backend, **kw):
    from plsh_dist.models import AttentionConfig, AttentionRuntime, build_model, presets

    torch.manual_seed(0)
    cfg = dataclasses.replace(presets["tiny"], num_layers=2)
    return build_model(cfg, AttentionConfig(bias="plsh", num_samples=3, backend=backend, method="onepass", **kw),
                       AttentionRuntime(run_seed=3), dtype=torch.float64)


def test_the_model_trains_on_it_and_compiles(toy):
    """The model's logits and gradients on the toy backend equal the shipped one pass's; the compiled layers
    (one graph each, fullgraph) give the eager logits."""
    from plsh_dist.models import compile_layers

    ids = torch.randint(0, 512, (2, 20), generator=torch.Generator().manual_seed(1))

    def run(model):
        model.zero_grad(set_to_none=True)
        out = model(ids, labels=ids)
        out.loss.backward()
        return [out.logits.detach()] + [p.grad.clone() for p in model.parameters()]

    ours, shipped = run(_model(NAME)), run(_model("torch"))
    for a, b in zip(ours, shipped):
        torch.testing.assert_close(a, b, **FP64)
    model = _model(NAME)
    torch._dynamo.reset()
    compile_layers(model, backend="aot_eager")
    for a, b in zip(run(model), ours):
        torch.testing.assert_close(a, b, **FP64)


def test_the_planner_costs_it(toy):
    """The planner reads the strategy's attributes: the one pass's pairs, neither varlen nor fused."""
    from plsh_dist.models import AttentionConfig
    from plsh_dist.biases.cost import CallShape
    from plsh_dist.plan.attention_cost import attention_cost, workspace_cuda

    def cost(backend):
        return attention_cost(AttentionConfig(bias="plsh", num_samples=4, backend=backend, method="onepass"), 4,
                              "cpu", torch.float32)

    ours = cost(NAME)
    assert (ours.setup.onepass, ours.setup.varlen, ours.setup.fused) == (True, False, False)
    assert ours.pairs_per_head(64) == cost("torch").pairs_per_head(64)
    assert workspace_cuda(ours, CallShape(1, 64, 64, 4, 2, 16, 2)).forward > 0


def _counted(monkeypatch, module, name: str) -> list:
    """Calls of ``module.name``, wherever a module bound it by name (``from ... import``)."""
    original, calls = getattr(module, name), []

    def counted(*args, **kwargs):
        calls.append(args)
        return original(*args, **kwargs)

    for m in list(sys.modules.values()):  # each module's own names: no module __getattr__ runs (some raise)
        if getattr(m, "__dict__", {}).get(name) is original:
            monkeypatch.setattr(m, name, counted)
    return calls


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "traced"])
@pytest.mark.parametrize("backend", ["auto", "math", NAME])
def test_one_choice_per_call(toy, monkeypatch, backend, compiled):
    """The table answers once per call, forward and backward together (the op's backward looks the
    strategy up by name); a traced call (aot_eager) answers once, while dynamo traces it."""
    choices = _counted(monkeypatch, backends, "choose_strategy")
    q, k, v = _inputs()

    def fn(q, k, v):
        return plsh_attention(q, k, v, sigma=4.0, num_samples=3, seed=1, backend=backend, return_lse=True)

    if compiled:
        torch._dynamo.reset()
        fn = torch.compile(fn, backend="aot_eager", fullgraph=True)
    _out_and_grads(fn, q, k, v)
    assert len(choices) == 1, choices


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "traced"])
def test_alibi_chooses_its_kernel_once_per_call(monkeypatch, compiled):
    from plsh_dist.ops import alibi_attention, alibi_kernel

    choices = _counted(monkeypatch, alibi_kernel, "choose_alibi_kernel")
    q, k, v = _inputs()

    def fn(q, k, v):
        return alibi_attention(q, k, v, slopes=torch.tensor([0.5, 0.25, 0.1, 0.05]), window=5, return_lse=True)

    if compiled:
        torch._dynamo.reset()
        fn = torch.compile(fn, backend="aot_eager", fullgraph=True)
    _out_and_grads(fn, q, k, v)
    assert len(choices) == 1, choices


# --- sequence parallelism: 2 ranks (spawned, gloo) ---------------------------------------------------------


def sp_worker(rank: int, world: int, init_file: str) -> None:
    """Each rank adds the backend (a table is per process) and runs its chunk through the SP form, eagerly
    and compiled (aot_eager, fullgraph): the chunk's output and q/k/v gradients equal the single-process
    shipped one pass's rows of the whole sequence."""
    import torch.distributed as dist

    from plsh_dist.distributed.sp import attention as sp_attention
    from plsh_dist.distributed.sp_chunks import sp_chunk, sp_positions

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    add_backend(ROW)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        T, sigma = 40, torch.tensor([3.0, 6.0, 12.0, 40.0], dtype=torch.float64)
        full = [x.detach() for x in _inputs(T=T)]
        pos = sp_positions(T, rank, world, offset=5)
        whole = [x.clone().requires_grad_(True) for x in full]
        ref = plsh_attention(*whole, sigma=sigma, num_samples=3, seed=7, positions=torch.arange(5, 5 + T),
                             backend="torch", method="onepass")
        ref.pow(2).sum().backward()
        expected = [sp_chunk(x, rank, world) for x in (ref.detach(), *(w.grad for w in whole))]

        def call(q, k, v):
            return sp_attention.plsh_attention(q, k, v, group=dist.group.WORLD, sigma=sigma, num_samples=3, seed=7,
                                               positions=pos, backend=NAME, method="onepass")

        for fn in (call, torch.compile(call, backend="aot_eager", fullgraph=True)):
            q, k, v = (sp_chunk(x, rank, world).clone().requires_grad_(True) for x in full)
            out = fn(q, k, v)
            out.pow(2).sum().backward()
            for got, want in zip((out.detach(), q.grad, k.grad, v.grad), expected):
                torch.testing.assert_close(got, want, **FP64)
    finally:
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def test_sequence_parallel_runs_it(tmp_path):
    mp.spawn(sp_worker, args=(2, str(tmp_path / "rendezvous")), nprocs=2, join=True)
