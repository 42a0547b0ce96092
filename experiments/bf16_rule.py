"""Do the attention ops in bf16 meet flash-attn's tolerance rule? The worst ratio per mode and tensor.

    python experiments/bf16_rule.py --out results/bf16_ops

The rule (flash-attention's tests): for each of out, dq, dk, dv, the max-abs
error of the op in bf16 against an fp64 reference of the *same estimator* is
at most ``tests.tolerances.BF16_FACTOR`` times the max-abs error of a plain
bf16 computation of that estimator against the same reference. The plain
computation (:func:`attention` in ``"bf16"``): ``q k^T`` as a bf16 matmul,
the bias added and the softmax taken in fp32, the probabilities cast to
bf16 and multiplied with v in bf16; its gradients are autograd's of that
same computation. The reference is the same formula in fp64 on the same
(bf16-valued) inputs.

Each mode's estimator is ``softmax(q k^T scale + log W) v`` with its own
fp64 log-weights (:func:`log_weights`): ``log c_ij`` for PLSH (the counts of
samples in which i and j share a block, rebuilt from the hash; fixed blocks:
its one sample's block mask), ``-m_h |p_i - p_j|`` inside the window for
ALiBi, ``-inf`` for hidden keys (the future when causal, other documents).

Paths: ``torch`` and ``math`` are the ``backend=`` of ``plsh_attention`` /
``fixed_blocks_attention`` (``alibi_attention`` takes no backend: it picks its
dense kernel per chunk, so only ``torch`` is named for it); ``triton`` is the
fused kernel under Triton's interpreter (``TRITON_INTERPRET=1`` before triton
is imported, as ``tests/conftest.py`` sets it) on fp32 tensors holding bf16
values, with the compiled bf16 kernel's rounding emulated: p and dS rounded
to bf16 before their products (``emulate_bf16``), out stored in bf16 (and
read back so by the backward), gradients stored in bf16.

The command measures :func:`_report_cases` and writes ``results.json`` and
``table.md`` (the worst ratio per mode and tensor, and per mode, path and
tensor) to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton

import torch

from plsh_dist.hashing import FixedBlocks, PositionalLSH, alibi_slopes
from plsh_dist.ops import alibi_attention, fixed_blocks_attention, plsh_attention
from plsh_dist.ops.alibi import truncation_windows
from plsh_dist.ops.documents import flat_documents
from plsh_dist.ops.gqa import repeat_kv

BF16 = torch.bfloat16
TENSORS = ("out", "dq", "dk", "dv")
MODES = ("plsh_onepass", "plsh_per_sample", "alibi", "alibi_window", "alibi_truncated", "fixed_blocks")
#: The paths each mode runs on in bf16 on a CPU.
PATHS = {
    "plsh_onepass": ("torch", "math", "triton"),
    "plsh_per_sample": ("torch", "math"),
    "alibi": ("torch", "triton"),
    "alibi_window": ("torch", "triton"),
    "alibi_truncated": ("torch", "triton"),
    "fixed_blocks": ("torch", "math", "triton"),
}


@dataclass(frozen=True)
class Case:
    """One bf16 call: a mode on a path, its shapes and its randomness.

    Attributes:
        mode: one of :data:`MODES`; path: one of ``PATHS[mode]``.
        B, T, Hq, Hkv, D: batch, tokens per row, query / key-value heads, head dim.
        causal: keys after the query are hidden.
        seed: the inputs' and the hash's seed.
        docs: document lengths of the flattened (B, T) batch (``cu_seqlens``), or None.
        sigma: None for ALiBi's per-head ``1 / m_h``, else one sigma shared by all heads.
        samples: PLSH's s; window: ``alibi_window``'s; c: ``alibi_truncated``'s
            ``w_h = ceil(c sigma_h)``; chunk: ALiBi's ``chunk_size`` (None: its default).
    """

    mode: str
    path: str = "torch"
    B: int = 1
    T: int = 512
    Hq: int = 4
    Hkv: int = 4
    D: int = 64
    causal: bool = True
    seed: int = 0
    docs: tuple[int, ...] | None = None
    sigma: float | None = None
    samples: int = 8
    window: int = 64
    c: float = math.log(8) + 0.58
    chunk: int | None = None

    def __post_init__(self):
        if self.mode not in MODES or self.path not in PATHS[self.mode]:
            raise ValueError(f"no path {self.path!r} for mode {self.mode!r}: {PATHS.get(self.mode)}")
        if self.chunk is not None and (not self.mode.startswith("alibi") or self.path != "torch"):
            raise ValueError("chunk is alibi_attention's chunk_size")
        if self.docs is not None and sum(self.docs) != self.B * self.T:
            raise ValueError(f"docs must add up to B * T = {self.B * self.T}, got {sum(self.docs)}")

    def label(self) -> str:
        parts = [self.mode, self.path, f"B{self.B}", f"T{self.T}", f"H{self.Hq}/{self.Hkv}", f"D{self.D}",
                 "causal" if self.causal else "full", f"seed{self.seed}"]
        if self.docs is not None:
            parts.append(f"docs{len(self.docs)}")
        if self.sigma is not None:
            parts.append(f"sigma{self.sigma:g}")
        if self.chunk is not None:
            parts.append(f"chunk{self.chunk}")
        return " ".join(parts)


def _sigma(case: Case):
    return alibi_slopes(case.Hq).reciprocal() if case.sigma is None else float(case.sigma)


def _slopes(case: Case) -> torch.Tensor:
    """float32 Tensor[Hq]: ALiBi's slopes, or ``1 / sigma`` for every head."""
    return alibi_slopes(case.Hq) if case.sigma is None else torch.full((case.Hq,), 1.0 / case.sigma)


def _lsh(case: Case) -> PositionalLSH:
    if case.mode == "fixed_blocks":
        return FixedBlocks(_sigma(case))
    return PositionalLSH(_sigma(case), case.samples, case.seed)


def _windows(case: Case) -> torch.Tensor | int | None:
    if case.mode == "alibi_window":
        return case.window
    if case.mode == "alibi_truncated":
        return truncation_windows(case.c, _slopes(case).reciprocal())
    return None


def _cu_seqlens(case: Case) -> torch.Tensor | None:
    if case.docs is None:
        return None
    return torch.cumsum(torch.tensor((0, *case.docs)), 0).to(torch.int32)


def _row(case: Case):
    """(positions LongTensor[n], document ids LongTensor[n] or None) of the row the reference
    computes: the flat row of B * T tokens with documents, else one row of T (shared by the batch)."""
    if case.docs is None:
        return torch.arange(case.T), None
    docs = flat_documents(None, _cu_seqlens(case), case.B, case.T)
    return docs.positions, docs.ids


def log_weights(case: Case) -> torch.Tensor:
    """fp64 (Hh, n, n) log-weights of the case's estimator (Hh = 1 or Hq), ``-inf`` for hidden keys."""
    pos, ids = _row(case)
    n = pos.numel()
    seen = torch.ones(n, n, dtype=torch.bool)
    if case.causal:
        seen = seen.tril()
    if ids is not None:
        seen &= ids[:, None] == ids[None, :]
    if case.mode in ("plsh_onepass", "plsh_per_sample", "fixed_blocks"):
        b = _lsh(case).buckets(pos)  # (s, Hh, n); positions increase within a document: a bucket is a block
        counts = (b[:, :, :, None] == b[:, :, None, :]).sum(0).double()
        logw = counts.log()
    else:
        dist = (pos[:, None] - pos[None, :]).abs().double()
        logw = -_slopes(case).double()[:, None, None] * dist[None]
        w = _windows(case)
        if w is not None:
            w = torch.as_tensor(w).reshape(-1, 1, 1)
            logw = logw.masked_fill(dist[None] >= w, float("-inf"))
    return logw.masked_fill(~seen, float("-inf"))


def inputs(case: Case):
    """q (B, T, Hq, D), k, v (B, T, Hkv, D), dout (B, T, Hq, D) in bf16, standard normal."""
    g = torch.Generator().manual_seed(case.seed)
    shapes = ((case.Hq,), (case.Hkv,), (case.Hkv,), (case.Hq,))
    return tuple(torch.randn(case.B, case.T, h, case.D, generator=g).to(BF16) for (h,) in shapes)


def attention(q, k, v, dout, logw: torch.Tensor, scale: float, precision: str):
    """``softmax(q k^T scale + logw) v`` and its gradients: (out, dq, dk, dv) in fp64.

    q (B, n, Hq, D), k, v (B, n, Hkv, D), logw (Hh, n, n) fp64 (broadcast over the batch).
    ``precision``: ``"fp64"`` (the reference), ``"bf16"`` (the plain bf16 computation of the
    module docstring) or ``"fp8_probs"``: the plain computation with its probabilities rounded
    to fp8 (e4m3) before the product with v, a deliberately worse op (the rule must reject it).
    """
    dtype = torch.float64 if precision == "fp64" else BF16
    q_, k_, v_ = (x.detach().to(dtype).requires_grad_() for x in (q, k, v))
    g = q.shape[2] // k.shape[2]
    qh, kh, vh = q_.transpose(1, 2), repeat_kv(k_, g).transpose(1, 2), repeat_kv(v_, g).transpose(1, 2)
    scores = torch.matmul(qh, kh.transpose(-1, -2))  # (B, Hq, n, n), in dtype
    if precision == "fp64":
        probs = torch.softmax(scores * scale + logw[None], dim=-1)
    else:
        probs = torch.softmax(scores.float() * scale + logw.float()[None], dim=-1).to(BF16)
        if precision == "fp8_probs":
            probs = probs.to(torch.float8_e4m3fn).to(BF16)
    out = torch.matmul(probs, vh).transpose(1, 2)
    grads = torch.autograd.grad(out, (q_, k_, v_), dout.to(dtype))
    return tuple(x.detach().double() for x in (out, *grads))


def run_op(case: Case, q, k, v, dout):
    """The op's (out, dq, dk, dv) in bf16 for the case's bf16 inputs."""
    if case.path == "triton":
        return _run_triton(case, q, k, v, dout)
    q, k, v = (x.detach().clone().requires_grad_() for x in (q, k, v))
    kw = dict(causal=case.causal, cu_seqlens=_cu_seqlens(case))
    if case.mode in ("plsh_onepass", "plsh_per_sample"):
        method = "onepass" if case.mode == "plsh_onepass" else "per_sample"
        out = plsh_attention(q, k, v, sigma=_sigma(case), num_samples=case.samples, seed=case.seed,
                             backend=case.path, method=method, **kw)
    elif case.mode == "fixed_blocks":
        out = fixed_blocks_attention(q, k, v, sigma=_sigma(case), backend=case.path, **kw)
    else:
        out = alibi_attention(q, k, v, slopes=_slopes(case), window=_windows(case), chunk_size=case.chunk, **kw)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    return (out.detach(), *grads)


def _run_triton(case: Case, q, k, v, dout):
    """The fused kernel under the interpreter, bf16 rounding emulated (module docstring)."""
    from plsh_dist.ops.triton import CountBias, TokenLayout, WindowBias  # noqa: PLC0415
    from plsh_dist.ops.triton.attention import banded_backward, banded_forward  # noqa: PLC0415

    cpu = torch.device("cpu")
    pos, _ = _row(case)
    docs = None
    if case.docs is not None:  # one flat row
        docs = flat_documents(None, _cu_seqlens(case), case.B, case.T)
        q, k, v, dout = (x.reshape(1, -1, *x.shape[2:]) for x in (q, k, v, dout))
    if case.mode in ("plsh_onepass", "fixed_blocks"):
        bias = CountBias.of(_lsh(case), cpu)
    else:
        w = _windows(case)
        window = torch.full((case.Hq,), pos.numel() if w is None else w) if not torch.is_tensor(w) else w
        bias = WindowBias.of(_slopes(case).reciprocal(), window, cpu)
    layout = TokenLayout.build(pos, cpu, docs)
    scale = case.D**-0.5
    qf, kf, vf, dof = (x.float() for x in (q, k, v, dout))
    out, lse = banded_forward(qf, kf, vf, bias, layout, causal=case.causal, scale=scale, emulate_bf16=True)
    out = out.to(BF16)  # the compiled kernel stores out in q's dtype; the backward reads that
    grads = banded_backward(dof, qf, kf, vf, out.float(), lse, bias, layout, causal=case.causal, scale=scale,
                            emulate_bf16=True)
    shape = (case.B, case.T)
    return tuple(x.to(BF16).reshape(*shape, *x.shape[2:]) for x in (out, *grads))


def measure(case: Case) -> dict[str, tuple[float, float]]:
    """``{tensor: (op error, baseline error)}``: max-abs errors against the fp64 reference."""
    q, k, v, dout = inputs(case)
    logw = log_weights(case)
    scale = case.D**-0.5
    flat = (lambda x: x.reshape(1, -1, *x.shape[2:])) if case.docs is not None else (lambda x: x)
    ref = attention(*(flat(x) for x in (q, k, v, dout)), logw, scale, "fp64")
    base = attention(*(flat(x) for x in (q, k, v, dout)), logw, scale, "bf16")
    got = run_op(case, q, k, v, dout)
    result = {}
    for name, r, b, o in zip(TENSORS, ref, base, got):
        assert o.dtype == BF16 and torch.isfinite(o).all(), (case.label(), name)
        o = flat(o).double()
        result[name] = (float((o - r).abs().max()), float((b - r).abs().max()))
    return result


def _report_cases() -> list[Case]:
    """The measured grid: every mode on every path, causal and not, GQA, D = 64 and 128, documents,
    two seeds; the dense paths at T = 1024-2048, the interpreted kernel at T = 256."""
    cases = []
    for mode, paths in PATHS.items():
        for path in paths:
            big = path != "triton"
            T = 1024 if big else 256
            for seed in range(2):
                base = Case(mode, path, T=T, Hq=8, Hkv=8, D=64, seed=seed)
                cases += [
                    base,
                    replace(base, causal=False),
                    replace(base, Hkv=2, D=128),
                    replace(base, B=2, docs=(T // 3, T - T // 3, T // 4, T - T // 4)),
                ]
                if big:
                    cases.append(replace(base, T=2048, Hq=4, Hkv=4))
                if mode in ("plsh_onepass", "plsh_per_sample", "fixed_blocks"):
                    cases.append(replace(base, sigma=16.0, Hkv=4))
    return cases


def worst(rows: list[dict], by_path: bool = False) -> dict[str, dict[str, float]]:
    """``{mode: {tensor: worst ratio}}`` over every path and case of ``rows`` (``by_path``: keyed
    ``"mode path"``, the worst over that path's cases)."""
    table: dict[str, dict[str, float]] = {}
    for row in rows:
        key = f"{row['case']['mode']} {row['case']['path']}" if by_path else row["case"]["mode"]
        cell = table.setdefault(key, dict.fromkeys(TENSORS, 0.0))
        for name in TENSORS:
            err, base = row[name]
            cell[name] = max(cell[name], err / base)
    return table


def markdown(table: dict[str, dict[str, float]]) -> str:
    """The worst ratios as a markdown table, modes (and paths) in :data:`PATHS` order; a ratio
    above the rule's 2 in bold."""
    keys = [k for mode, paths in PATHS.items() for k in (mode, *(f"{mode} {p}" for p in paths)) if k in table]
    lines = ["| mode | out | dq | dk | dv |", "|---|---|---|---|---|"]
    for key in keys:
        cells = [f"**{r:.2f}**" if r > 2.0 else f"{r:.2f}" for r in (table[key][t] for t in TENSORS)]
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for results.json and table.md")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of the modes")
    parser.add_argument("--tables-only", action="store_true",
                        help="measure nothing: rewrite table.md from --out's results.json")
    args = parser.parse_args(argv)
    modes = args.modes.split(",")
    if args.tables_only:
        rows = json.loads((args.out / "results.json").read_text())["rows"]
    else:
        torch.set_num_threads(min(2, torch.get_num_threads()))
        rows, t0 = [], time.time()
        for case in _report_cases():
            if case.mode not in modes:
                continue
            errors = measure(case)
            rows.append(dict(case=asdict(case), **errors))
            print(case.label(), " ".join(f"{n}={e / b:.2f}" for n, (e, b) in errors.items()), flush=True)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps(dict(rows=rows, worst=worst(rows)), indent=1) + "\n")
        print(f"{len(rows)} cases in {time.time() - t0:.0f} s")
    text = f"Worst ratio per mode:\n\n{markdown(worst(rows))}\n\nPer mode and path:\n\n" \
           f"{markdown(worst(rows, by_path=True))}\n"
    (args.out / "table.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
