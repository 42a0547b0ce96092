"""GPU attention benchmark: PLSH against the exact-attention floor, exact and windowed ALiBi.

    python launchers/bench_attention_gpu.py --out gpu_results/bench      # full grid, ~5 min on one H200
    python launchers/bench_attention_gpu.py --lengths 8192 --samples 8   # quick

Forward+backward time (CUDA events, median of ``--repeats`` after warm-up) and
peak memory above the inputs (``torch.cuda.max_memory_allocated``) at
T in {8k, 32k, 128k, 512k}, batch 1, H = 16 query and key/value heads,
D = 128, bf16. Methods:

- ``plsh``: per-head sigma = 1/slope and sigma = 256, s in {4, 8, 16}, on
  PyTorch's varlen flash kernels (``backend="torch"``) and on flash-attn when
  installed;
- ``sdpa_flash_causal``: causal SDPA on the flash backend without bias, the
  exact-attention floor;
- ``alibi_flash_attn``: flash-attn's exact ALiBi (``alibi_slopes``) when installed;
- ``alibi_flex`` / ``alibi_window_flex``: exact / windowed ALiBi through
  FlexAttention (``score_mod`` bias, block-sparse causal or window mask),
  PyTorch's best exact ALiBi without flash-attn; when FlexAttention cannot
  compile, ``alibi_chunked`` / ``alibi_window_chunked`` (plsh_dist's query-
  chunked exact ALiBi) stand in and the record says so.

Achieved TFLOP/s counts the attention matmuls actually needed (causal:
half the square; PLSH: each block's own triangle, summed over heads and
samples; windowed: the band) at 3.5x the forward's FLOPs for fwd+bwd.

On a machine without CUDA it runs the same code on the CPU at toy sizes
(``--lengths 512 --heads 2 --head-dim 16``), so every path is exercised here.
Writes ``results.json`` and ``results.md`` under ``--out``.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from plsh_dist.hashing import PositionalLSH, alibi_slopes  # noqa: E402
from plsh_dist.ops import alibi_attention, plsh_attention  # noqa: E402
from plsh_dist.ops.backends import flash_attn_available  # noqa: E402

FWD_BWD = 3.5  # backward ~2.5x forward matmul FLOPs


def _time_fwd_bwd(fn, q, k, v, repeats: int, warmup: int, device) -> list[float]:
    """Seconds per forward+backward, ``repeats`` times after ``warmup`` runs."""
    dout = torch.randn_like(q)

    def once():
        out = fn(q, k, v)
        torch.autograd.grad(out, (q, k, v), dout)

    for _ in range(warmup):
        once()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            once()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            once()
            times.append(time.perf_counter() - t0)
    return times


# -- FLOP counts ----------------------------------------------------------------


def dense_causal_flops(T: int, H: int, D: int) -> float:
    """fwd+bwd matmul FLOPs of causal attention (half of QK^T and PV)."""
    return FWD_BWD * 4 * D * H * T * (T + 1) / 2


def window_flops(T: int, H: int, D: int, window: int) -> float:
    """fwd+bwd FLOPs of causal attention over the band of ``window`` keys."""
    band = T * (T + 1) / 2 if T <= window else window * (window + 1) / 2 + (T - window) * window
    return FWD_BWD * 4 * D * H * band


def plsh_flops(sigma, s: int, T: int, H: int, D: int) -> float:
    """Each block's causal triangle L(L+1)/2, summed over blocks, heads and samples."""
    lsh = PositionalLSH(sigma, s, seed=0)
    total = 0.0
    for t in range(s):
        b = lsh.sample_buckets(torch.arange(T), t)  # (Hh, T)
        for h in range(b.shape[0]):
            _, counts = torch.unique_consecutive(b[h], return_counts=True)
            total += float((counts.double() * (counts + 1) / 2).sum())
    heads_per_hash = H if lsh.num_heads == 1 else 1
    return FWD_BWD * 4 * D * heads_per_hash * total


# -- methods ----------------------------------------------------------------------


@functools.cache
def _compiled_flex(flex_attention):
    """One compiled FlexAttention for the whole run: torch.compile recompiles per new
    shape or mask (then marks shapes dynamic), a few compiles in all."""
    return torch.compile(flex_attention)


def _flex_alibi(slopes: torch.Tensor, T: int, window: int | None, device):
    """Exact (or windowed) ALiBi through FlexAttention; raises if it cannot build."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    m = slopes.to(device)

    def score_mod(score, b, h, q_idx, kv_idx):
        return score - m[h] * (q_idx - kv_idx)

    if window is None:
        mask_mod = lambda b, h, q_idx, kv_idx: q_idx >= kv_idx
    else:
        mask_mod = lambda b, h, q_idx, kv_idx: (q_idx >= kv_idx) & (q_idx - kv_idx < window)
    block_mask = create_block_mask(mask_mod, None, None, T, T, device=str(device))
    compiled = _compiled_flex(flex_attention)

    def fn(q, k, v):  # (B, T, H, D) in and out
        out = compiled(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), score_mod=score_mod,
                       block_mask=block_mask)
        return out.transpose(1, 2)

    return fn


def _sdpa_flash_causal(q, k, v):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = SDPBackend.FLASH_ATTENTION if q.is_cuda else SDPBackend.MATH
    with sdpa_kernel(backend):
        out = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
    return out.transpose(1, 2)


def methods(args, T: int, device) -> list[tuple[str, dict, object]]:
    """(name, settings, fn) for every method of the grid at length T."""
    H = args.heads
    slopes = alibi_slopes(H)
    out = [("sdpa_flash_causal", {"exact": True}, _sdpa_flash_causal)]
    if flash_attn_available(device, torch.bfloat16):
        from flash_attn import flash_attn_func

        out.append(("alibi_flash_attn", {"exact": True},
                    lambda q, k, v: flash_attn_func(q, k, v, causal=True, alibi_slopes=slopes.to(q.device))))
    for name, window in (("alibi", None), ("alibi_window", args.window)):
        try:
            if not args.flex:
                raise RuntimeError("--no-flex")
            fn = _flex_alibi(slopes, T, window, device)
            out.append((f"{name}_flex", {"exact": window is None, "window": window}, fn))
        except Exception as exc:  # no triton / inductor: fall back to the chunked exact op
            fn = (lambda w: lambda q, k, v: alibi_attention(q, k, v, slopes=slopes, window=w))(window)
            out.append((f"{name}_chunked", {"exact": window is None, "window": window,
                                            "flex_error": f"{type(exc).__name__}: {exc}"[:200]}, fn))
    backends = ["torch"] + (["flash_attn"] if flash_attn_available(device, torch.bfloat16) else [])
    for backend in backends:
        for sigma_name, sigma in (("per_head", slopes.reciprocal()), ("256", 256.0)):
            for s in args.samples:
                fn = (lambda sg, ss, bk: lambda q, k, v: plsh_attention(
                    q, k, v, sigma=sg, num_samples=ss, seed=0, backend=bk))(sigma, s, backend)
                out.append((f"plsh_{backend}_{'perhead' if sigma_name == 'per_head' else 'sigma256'}_s{s}",
                            {"backend": backend, "sigma": sigma_name, "s": s}, fn))
    return out


def flops_for(name: str, settings: dict, T: int, args) -> float:
    H, D = args.heads, args.head_dim
    if name.startswith("plsh"):
        sigma = alibi_slopes(H).reciprocal() if settings["sigma"] == "per_head" else 256.0
        return plsh_flops(sigma, settings["s"], T, H, D)
    if settings.get("window"):
        return window_flops(T, H, D, settings["window"])
    return dense_causal_flops(T, H, D)


def run(args) -> list[dict]:
    device = torch.device("cuda" if torch.cuda.is_available() and not args.cpu else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    H, D = args.heads, args.head_dim
    records, t_start = [], time.time()
    for T in args.lengths:
        g = torch.Generator(device=device).manual_seed(0)
        q, k, v = (torch.randn(1, T, H, D, generator=g, device=device, dtype=dtype).requires_grad_()
                   for _ in range(3))
        for name, settings, fn in methods(args, T, device):
            record = {"method": name, "T": T, "H": H, "D": D, "dtype": str(dtype).split(".")[-1], **settings}
            if time.time() - t_start > args.budget_s:
                records.append({**record, "status": "skipped: time budget"})
                continue
            if device.type == "cuda":
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
            try:
                reps = args.repeats if T < 131072 else max(1, args.repeats - 1)
                times = _time_fwd_bwd(fn, q, k, v, reps, args.warmup, device)
            except torch.OutOfMemoryError:
                records.append({**record, "status": "oom"})
                print(f"T={T:>7} {name:<34} out of memory", flush=True)
                continue
            except Exception as exc:
                records.append({**record, "status": f"error: {type(exc).__name__}: {exc}"[:300]})
                print(f"T={T:>7} {name:<34} error {type(exc).__name__}: {exc}", flush=True)
                continue
            median = statistics.median(times)
            flops = flops_for(name, settings, T, args)
            record.update(status="ok", time_s=median, times_s=times, tflops=flops / median / 1e12)
            if device.type == "cuda":
                record["peak_mem_mib"] = (torch.cuda.max_memory_allocated() - base) / 2**20
            records.append(record)
            print(f"T={T:>7} {name:<34} {median * 1e3:10.2f} ms  {record['tflops']:8.3g} TFLOP/s"
                  + (f"  {record['peak_mem_mib']:9.0f} MiB" if "peak_mem_mib" in record else ""), flush=True)
        del q, k, v
    _add_ratios(records)
    return records


def _add_ratios(records: list[dict]) -> None:
    """speedup_vs_floor: the exact-attention floor's time / this method's, same T."""
    floor = {r["T"]: r["time_s"] for r in records if r["method"] == "sdpa_flash_causal" and r.get("status") == "ok"}
    for r in records:
        if r.get("status") == "ok" and r["T"] in floor:
            r["speedup_vs_floor"] = floor[r["T"]] / r["time_s"]


def markdown(records: list[dict], device_name: str) -> str:
    lines = [f"Device: {device_name}. fwd+bwd, batch 1, median; speedup = causal flash SDPA time / method time.", "",
             "| T | method | time (ms) | speedup vs floor | TFLOP/s | peak MiB |", "|---|---|---|---|---|---|"]
    for r in records:
        if r.get("status") != "ok":
            lines.append(f"| {r['T']} | {r['method']} | {r.get('status')} | | | |")
            continue
        mem = f"{r['peak_mem_mib']:.0f}" if "peak_mem_mib" in r else "-"
        lines.append(f"| {r['T']} | {r['method']} | {r['time_s'] * 1e3:.2f} | {r.get('speedup_vs_floor', math.nan):.2f}x"
                     f" | {r['tflops']:.3g} | {mem} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="gpu_results/bench", help="directory for results.json / results.md")
    p.add_argument("--lengths", type=lambda s: [int(x) for x in s.split(",")], default=[8192, 32768, 131072, 524288])
    p.add_argument("--samples", type=lambda s: [int(x) for x in s.split(",")], default=[4, 8, 16])
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--window", type=int, default=4096, help="window of windowed ALiBi (16 x the largest sigma, 256)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--budget-s", type=float, default=300.0, help="skip the remaining cases after this many seconds")
    p.add_argument("--no-flex", dest="flex", action="store_false", help="chunked exact ALiBi instead of FlexAttention")
    p.add_argument("--cpu", action="store_true", help="run on the CPU even when CUDA is there")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    records = run(args)
    device_name = torch.cuda.get_device_name() if torch.cuda.is_available() and not args.cpu else "CPU"
    meta = {"device": device_name, "torch": torch.__version__, "flash_attn": flash_attn_available(
        torch.device("cuda"), torch.bfloat16) if torch.cuda.is_available() else False}
    (out / "results.json").write_text(json.dumps({"meta": meta, "records": records}, indent=1) + "\n")
    (out / "results.md").write_text(markdown(records, device_name))
    print(f"wrote {out / 'results.json'} and {out / 'results.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
