"""Op sweep: record every attention path's numbers, to show a refactor is bit-identical.

Runs the public single-process ops (``plsh_dist.ops``: PLSH, fixed blocks, exact / windowed /
truncated ALiBi, causal; outputs, lse, dq, dk, dv) and tiny models built by
``plsh_dist.models.build_model`` in every bias (logits and q_proj gradients; plain, packed
documents, a KV-cache decode step), on CPU, with the Triton backend under the interpreter.
``save`` writes DIR/sweep.pt and DIR/cases.txt; ``compare`` runs it again and checks every
tensor with ``torch.equal`` (dtype and shape too), exit code 1 if anything differs or is missing:

    PYTHONPATH=. HF_HUB_OFFLINE=1 .venv/bin/python tools/op_sweep.py save /tmp/op_sweep_before
    ...refactor...
    PYTHONPATH=. HF_HUB_OFFLINE=1 .venv/bin/python tools/op_sweep.py compare /tmp/op_sweep_before
"""

from __future__ import annotations

import os

if __name__ == "__main__":  # before torch / triton are imported: the Triton backend on CPU tensors
    os.environ["TRITON_INTERPRET"] = "1"  # (imported, e.g. by its test, the module leaves the environment alone)

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import itertools  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Iterator  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

SWEEP_FILE = "sweep.pt"
CASES_FILE = "cases.txt"
SEP = ":"  # tensor key = f"{case}{SEP}{tensor name}"

# op shapes
B, T, T_TRITON, D, HQ = 2, 64, 48, 16, 4
ROW_DOCS = [[1, 5, 58], [30, 1, 33]]  # per row: a 1-token document, short and long ones (sum T)
ROW_DOCS_TRITON = [[1, 5, 42], [20, 1, 27]]  # sum T_TRITON
# model inputs
MODEL_T, MODEL_DOCS, PROMPT = 40, [1, 9, 12, 18], 11  # MODEL_DOCS sum to 40


# --------------------------------------------------------------------------------------------
# single-process ops
# --------------------------------------------------------------------------------------------


def _docs_layout(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """cu_seqlens over the flattened (B, T) batch and (B, T) positions restarting per document."""
    offsets = [0]
    for row in rows:
        for n in row:
            offsets.append(offsets[-1] + n)
    positions = torch.stack([torch.cat([torch.arange(n) for n in row]) for row in rows])
    return torch.tensor(offsets, dtype=torch.int32), positions


def _op_inputs(hkv: int, dtype: torch.dtype, n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, n, HQ, D, generator=g, dtype=torch.float64).to(dtype)
    k = torch.randn(B, n, hkv, D, generator=g, dtype=torch.float64).to(dtype)
    v = torch.randn(B, n, hkv, D, generator=g, dtype=torch.float64).to(dtype)
    dout = torch.randn(B, n, HQ, D, generator=g, dtype=torch.float64).to(dtype)
    return q, k, v, dout


def _run_op(fn: Callable, kw: dict, hkv: int, dtype: torch.dtype, docs: bool, triton: bool) -> dict:
    """out, dq, dk, dv (backward of the out of a return_lse=False call with a fixed dout), and
    the out and lse of a return_lse=True call."""
    n = T_TRITON if triton else T
    q, k, v, dout = _op_inputs(hkv, dtype, n)
    layout = {}
    if docs:
        cu, positions = _docs_layout(ROW_DOCS_TRITON if triton else ROW_DOCS)
        layout = dict(cu_seqlens=cu, positions=positions)
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    out = fn(q, k, v, **kw, **layout)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    out_lse, lse = fn(q, k, v, **kw, **layout, return_lse=True)
    return dict(out=out.detach(), dq=dq, dk=dk, dv=dv, out_lse=out_lse.detach(), lse=lse.detach())


def _sigma(kind: str, dtype: torch.dtype):
    from plsh_dist.hashing import alibi_slopes

    return alibi_slopes(HQ).reciprocal().to(dtype) if kind == "head" else 3.5


def op_cases() -> Iterator[tuple[str, Callable[[], dict]]]:
    from plsh_dist.hashing import alibi_slopes
    from plsh_dist.ops import alibi_attention, causal_attention, fixed_blocks_attention, plsh_attention
    from plsh_dist.ops.alibi import truncation_windows

    dtypes = {"fp32": torch.float32, "fp64": torch.float64}
    heads = {"gqa": 2, "mha": 4}
    layouts = {"plain": False, "docs": True}
    for (dn, dtype), (hn, hkv), (ln, docs) in itertools.product(dtypes.items(), heads.items(), layouts.items()):
        base = f"ops/{dn}/{hn}/{ln}"
        run = lambda fn, kw, triton=False: (lambda: _run_op(fn, kw, hkv, dtype, docs, triton))  # noqa: E731
        # PLSH on the torch backend: every method, sigma kind, s and sampler
        for method, sig, s, sampler in itertools.product(("per_sample", "onepass"), ("head", "const"), (1, 4, 20),
                                                         ("iid", "stratified")):
            kw = dict(sigma=_sigma(sig, dtype), num_samples=s, seed=7, sampler=sampler, method=method,
                      backend="torch")
            yield f"{base}/plsh/torch/{method}/sigma_{sig}/s{s}/{sampler}", run(plsh_attention, kw)
        for method, sig in itertools.product(("per_sample", "onepass"), ("head", "const")):
            kw = dict(sigma=_sigma(sig, dtype), method=method, backend="torch")
            yield f"{base}/fixed_blocks/torch/{method}/sigma_{sig}", run(fixed_blocks_attention, kw)
        # the Triton kernel under the interpreter: fp32, one pass only (the table's interpreter row)
        if dtype == torch.float32:
            for sig, s, sampler in itertools.product(("head", "const"), (1, 4, 20), ("iid", "stratified")):
                kw = dict(sigma=_sigma(sig, dtype), num_samples=s, seed=7, sampler=sampler, method="onepass",
                          backend="triton")
                yield f"{base}/plsh/triton/onepass/sigma_{sig}/s{s}/{sampler}", run(plsh_attention, kw, True)
            for sig in ("head", "const"):
                kw = dict(sigma=_sigma(sig, dtype), method="onepass", backend="triton")
                yield f"{base}/fixed_blocks/triton/onepass/sigma_{sig}", run(fixed_blocks_attention, kw, True)
        slopes = alibi_slopes(HQ)
        windows = tuple(truncation_windows(2.0, slopes.reciprocal()).tolist())  # 4, 16, 64, 256
        for name, window in (("exact", None), ("window9", 9), ("truncated", windows)):
            yield f"{base}/alibi/{name}", run(alibi_attention, dict(slopes=slopes, window=window))
        yield f"{base}/alibi/window9_chunk16", run(alibi_attention, dict(slopes=slopes, window=9, chunk_size=16))
        yield f"{base}/causal", run(causal_attention, {})


# --------------------------------------------------------------------------------------------
# models
# --------------------------------------------------------------------------------------------


def _build(attn):
    from plsh_dist.models import AttentionRuntime, build_model, presets

    cfg = dataclasses.replace(presets["tiny"], num_layers=2)
    torch.manual_seed(0)
    return build_model(cfg, attn, AttentionRuntime(run_seed=0), dtype=torch.float32)


def _ids(b: int, n: int) -> torch.Tensor:
    return torch.randint(0, 512, (b, n), generator=torch.Generator().manual_seed(1))


def _logits_and_grad(model, ids, position_ids) -> dict:
    logits = model(input_ids=ids, position_ids=position_ids).logits
    logits.float().pow(2).mean().backward()
    grads = [p.grad.reshape(-1) for name, p in model.named_parameters() if name.endswith("q_proj.weight")]
    return dict(logits=logits.detach(), q_proj_grad=torch.cat(grads))


def _model_plain(attn) -> dict:
    model = _build(attn)
    return _logits_and_grad(model, _ids(2, MODEL_T), torch.arange(MODEL_T)[None].expand(2, -1))


def _model_docs(attn) -> dict:
    """One packed row, position_ids restarting at 0 per document (DataCollatorWithFlattening)."""
    model = _build(attn)
    position_ids = torch.cat([torch.arange(n) for n in MODEL_DOCS])[None]
    return _logits_and_grad(model, _ids(1, MODEL_T), position_ids)


def _model_decode(attn) -> dict:
    """A prefill with use_cache=True into a DynamicCache, then one more token on that cache (transformers
    5 names the argument ``cache``; ``past_key_values`` is its deprecated alias): the last logits."""
    from transformers import DynamicCache

    model = _build(attn).eval()
    ids = _ids(2, PROMPT + 1)
    with torch.no_grad():
        cache = DynamicCache(config=model.config)
        prefill = model(input_ids=ids[:, :PROMPT], cache=cache, use_cache=True)
        step = model(input_ids=ids[:, PROMPT:], cache=cache, use_cache=True)
    assert cache.get_seq_length() == PROMPT + 1
    return dict(prefill_logits=prefill.logits[:, -1], last_logits=step.logits[:, -1])


def model_cases() -> Iterator[tuple[str, Callable[[], dict]]]:
    from plsh_dist.models import AttentionConfig

    attns = {
        "none": AttentionConfig(bias="none", rope=True),
        "alibi": AttentionConfig(bias="alibi"),
        "window": AttentionConfig(bias="window", window=7),
        "truncated": AttentionConfig(bias="truncated", truncate_c=1.0),
        "plsh/per_sample": AttentionConfig(bias="plsh", num_samples=4, method="per_sample"),
        "plsh/onepass": AttentionConfig(bias="plsh", num_samples=4, method="onepass"),
        "plsh/onepass_sigma3_stratified": AttentionConfig(bias="plsh", num_samples=20, sigma=3.0,
                                                          sampler="stratified", method="onepass"),
        "fixed_blocks": AttentionConfig(bias="fixed_blocks"),
    }
    for name, attn in attns.items():
        yield f"model/{name}/plain", lambda attn=attn: _model_plain(attn)
        yield f"model/{name}/docs", lambda attn=attn: _model_docs(attn)
        yield f"model/{name}/decode", lambda attn=attn: _model_decode(attn)


# --------------------------------------------------------------------------------------------
# sweep, save, compare
# --------------------------------------------------------------------------------------------


def run_sweep(verbose: bool = True) -> tuple[list[str], dict[str, torch.Tensor]]:
    """Every case in order: (case names, {f"{case}:{tensor}": tensor})."""
    torch.set_num_threads(2)  # one thread count on every run: reductions split the same way
    cases, results = [], {}
    start = time.perf_counter()
    for name, fn in itertools.chain(op_cases(), model_cases()):
        t0 = time.perf_counter()
        out = fn()
        cases.append(name)
        for key, tensor in out.items():
            results[f"{name}{SEP}{key}"] = tensor.detach().clone().contiguous()
        if verbose and time.perf_counter() - t0 > 2.0:
            print(f"  slow case {name}: {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    if verbose:
        print(f"sweep: {len(cases)} cases, {len(results)} tensors, {time.perf_counter() - start:.1f} s",
              file=sys.stderr)
    return cases, results


def _case_of(key: str) -> str:
    return key.rsplit(SEP, 1)[0]


def _tensor_diff(want: torch.Tensor, got: torch.Tensor) -> str | None:
    """None when torch.equal (dtype and shape too), else what differs."""
    if want.dtype != got.dtype:
        return f"dtype {want.dtype} -> {got.dtype}"
    if want.shape != got.shape:
        return f"shape {tuple(want.shape)} -> {tuple(got.shape)}"
    if torch.equal(want, got):
        return None
    diff = (want.double() - got.double()).abs()
    return f"max abs diff {diff.nan_to_num(nan=float('inf')).max().item():.3e}"


def compare_results(saved: dict[str, torch.Tensor], current: dict[str, torch.Tensor],
                    cases: list[str] | None = None) -> tuple[list[str], bool]:
    """One line per case (``equal`` / ``DIFFERS: ...`` / ``missing`` / ``new``) and whether all are
    equal. A case is missing when a saved tensor of it is not in ``current``; ``new`` (also a
    failure) when ``current`` has a tensor the save lacks."""
    order = list(dict.fromkeys([*(cases or []), *map(_case_of, saved), *map(_case_of, current)]))
    by_case: dict[str, list[str]] = {c: [] for c in order}
    for key in dict.fromkeys([*saved, *current]):
        by_case[_case_of(key)].append(key)
    lines, ok = [], True
    for case in order:
        keys = by_case[case]
        missing = [k.rsplit(SEP, 1)[1] for k in keys if k not in current]
        new = [k.rsplit(SEP, 1)[1] for k in keys if k not in saved]
        diffs = []
        for k in keys:
            if k in saved and k in current:
                d = _tensor_diff(saved[k], current[k])
                if d is not None:
                    diffs.append(f"{k.rsplit(SEP, 1)[1]} {d}")
        if not keys:
            status = "missing (no tensors)"
        elif missing:
            status = "missing" + ("" if len(missing) == len(keys) else f": {', '.join(missing)}")
        elif new:
            status = "new" + ("" if len(new) == len(keys) else f": {', '.join(new)}")
        elif diffs:
            status = "DIFFERS: " + "; ".join(diffs)
        else:
            status = "equal"
        ok = ok and status == "equal"
        lines.append(f"{case}: {status}")
    return lines, ok


def save(out_dir: Path) -> int:
    cases, results = run_sweep()
    bad = [k for k, x in results.items() if x.is_floating_point() and torch.isnan(x).any()]
    if bad:
        print(f"warning: NaN in {bad} (torch.equal never holds for them)", file=sys.stderr)
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.save(results, out_dir / SWEEP_FILE)
    (out_dir / CASES_FILE).write_text("".join(f"{c}\n" for c in cases))
    print(f"saved {len(cases)} cases, {len(results)} tensors to {out_dir / SWEEP_FILE}")
    return 0


def compare(out_dir: Path) -> int:
    saved = torch.load(out_dir / SWEEP_FILE, weights_only=True)
    saved_cases = (out_dir / CASES_FILE).read_text().split()
    cases, current = run_sweep()
    lines, ok = compare_results(saved, current, [*saved_cases, *cases])
    for line in lines:
        print(line)
    n_equal = sum(line.endswith(": equal") for line in lines)
    print(f"summary: {n_equal} of {len(lines)} cases equal, {len(lines) - n_equal} not "
          f"({len(saved)} tensors saved, {len(current)} now) -> {'ALL EQUAL' if ok else 'DIFFERENCES'}")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("save", "compare"))
    parser.add_argument("dir", type=Path)
    args = parser.parse_args(argv)
    return save(args.dir) if args.command == "save" else compare(args.dir)


if __name__ == "__main__":
    sys.exit(main())
