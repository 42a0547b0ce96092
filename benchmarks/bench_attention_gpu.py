"""GPU attention benchmark: PLSH against the exact-attention floor, exact and windowed ALiBi.

    python benchmarks/bench_attention_gpu.py --out gpu_results/bench      # full grid, within --budget-s
    python benchmarks/bench_attention_gpu.py --lengths 8192 --samples 8   # quick

Forward+backward time (CUDA events, median of ``--repeats`` after warm-up) and
peak memory above the inputs (``torch.cuda.max_memory_allocated``) at
T in {8k, 32k, 128k, 512k}, batch 1, H = 16 query and key/value heads,
D = 128, bf16. Methods, in the order they run at each T (the time budget
skips the tail):

- ``plsh_triton``: the fused one-pass Triton kernel (``backend="triton"``),
  per-head sigma = 1/slope and sigma = 256, s in {8, 32, 100};
- ``alibi_window_triton``: the same kernel's exact-ALiBi-in-a-window bias,
  one window for all heads (``--window``) and per-head windows
  ``ceil((ln 8 + 0.58) sigma_h)`` (PLSH s = 8's band);
- ``plsh_torch`` / ``plsh_flash_attn``: the per-sample varlen path (s block
  attentions on PyTorch's varlen flash kernels, and on flash-attn when
  installed), s = 8 only (its host plan alone takes seconds at larger s);
- ``sdpa_flash_causal`` (and ``sdpa_cudnn_causal`` where this torch has SDPA's
  cuDNN backend): causal SDPA without bias, the exact-attention floor (the
  speedups are against the flash one);
- ``alibi_flash_attn``: flash-attn's exact ALiBi (``alibi_slopes``) when installed;
- ``alibi_flex`` / ``alibi_window_flex`` / ``alibi_window_perhead_flex``:
  exact ALiBi, ALiBi in one window and in the per-head truncation windows
  through FlexAttention (``score_mod`` bias, block-sparse band mask,
  :mod:`plsh_dist.ops.flex.attend`), what a PyTorch user would pick without
  flash-attn; when FlexAttention cannot compile, ``alibi_chunked`` /
  ``alibi_window_chunked`` / ``alibi_window_perhead_chunked`` (plsh_dist's
  query-chunked exact ALiBi) stand in and the record says so;
- ``plsh_flex``: PLSH's one pass through FlexAttention, ``c_ij`` counted per
  score from the hash's pitch and shift tables (float64 buckets of every
  sample), the band as the block mask; s <= ``--flex-max-s`` (8).

Two TFLOP/s per case: *useful* counts the scores the method needs (causal:
half the square; PLSH per sample: each block's own triangle, summed over
heads and samples; PLSH one pass: the band of keys sharing a block in some
sample, its expectation over the hash; windowed: the band) at 3.5x the
forward's FLOPs for fwd+bwd; *visited* counts the tiles the kernels compute
(the floor's and per-sample's 128 x 128 flash tiles, the Triton kernel's
own tiles from ``plsh_dist.plan.kernel_tiles``: 4 D per forward score, 14 D
per backward score over its two kernels). The GPU targets (issue 25) are
checked at the end of ``results.md``.

On a machine without CUDA it runs the same code on the CPU at toy sizes
(``--lengths 512 --heads 2 --head-dim 16``), so every path is exercised here.
Writes ``results.json`` and ``results.md`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch

from plsh_dist.hashing import PositionalLSH, alibi_slopes
from plsh_dist.ops import alibi_attention, plsh_attention
from plsh_dist.ops.flex import attend as flex
from plsh_dist.ops.alibi import truncation_windows
from plsh_dist.ops.backends import flash_attn_available
from plsh_dist.ops.flex.strategy import block_bound_tables
from plsh_dist.ops.triton.attention import alibi_window_attention, triton_cuda, triton_interpreter
from plsh_dist.plan import kernel_tiles as tiles

FWD_BWD = 3.5  # backward ~2.5x forward matmul FLOPs


def time_fwd_bwd(fn, q, k, v, repeats: int, warmup: int, device) -> list[float]:
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


def onepass_band_flops(sigma_name: str, s: int, T: int, H: int, D: int) -> float:
    """The one-pass band's scores (keys sharing the query's block in at least one sample, causal;
    the expectation over the hash: the planner's count, ``plsh_dist.plan.attention_cost``), all heads,
    for the sigma ``_sigmas`` names ``sigma_name`` (per head: ALiBi's, a config's unset sigma)."""
    from plsh_dist.models import AttentionConfig
    from plsh_dist.plan.attention_cost import attention_cost

    attn = AttentionConfig(bias="plsh", sigma=None if sigma_name == "per_head" else float(sigma_name), num_samples=s,
                           method="onepass")
    return FWD_BWD * 4 * D * sum(attention_cost(attn, H, "cpu", torch.float32).pairs_per_head(T))


def kernel_visited_flops(k: "tiles.KernelTiles", D: int) -> float:
    """What the fused kernel computes: 4 D per forward score, 7 D per score of each backward kernel."""
    return D * (4 * k.forward_area + 7 * k.backward_area)


def flash_visited_flops(num_tiles: int, D: int) -> float:
    """128 x 128 flash tiles, forward + backward (3.5x the forward's 4 D per score)."""
    return FWD_BWD * 4 * D * num_tiles * tiles.FLASH_TILE**2


# -- methods ----------------------------------------------------------------------


def flex_alibi(slopes: torch.Tensor, T: int, window, device):
    """Exact ALiBi (``window`` None), or ALiBi in one window (an int) or per-head windows
    (LongTensor[H]), through FlexAttention: the ALiBi ``score_mod`` over the band's block mask.
    ``fn(q, k, v)`` on (B, T, H, D); raises if FlexAttention cannot build."""
    if isinstance(window, int):
        window = torch.full((1,), window)
    mask = flex.band_block_mask(*flex.alibi_band(T, window, True, device))
    score_mod = flex.alibi_score_mod(slopes.to(device))
    return lambda q, k, v: flex.flex_attend(q, k, v, score_mod, mask)


def _plsh_band(lsh: PositionalLSH, T: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal one-pass band ``(start, end)`` (Hh, T) of positions 0..T-1: from the earliest
    block start of the s blocks holding each token to the token."""
    first, _ = block_bound_tables(lsh, torch.arange(T), causal=True)
    start = first.min(dim=0).values
    return start, torch.arange(1, T + 1, dtype=torch.int32)[None].expand_as(start).contiguous()


def flex_plsh(sigma, s: int, T: int, device):
    """PLSH one pass through FlexAttention as a user would write it from the paper: ``c_ij``
    counted per score from the hash's pitch and shift tables (``flex.hash_count_score_mod``),
    the band as the block mask (causal, positions 0..T-1). ``fn(q, k, v)`` on (B, T, H, D)."""
    lsh = PositionalLSH(sigma, s, seed=0)
    start, end = _plsh_band(lsh, T)
    mask = flex.band_block_mask(start.to(device), end.to(device))
    score_mod = flex.hash_count_score_mod(lsh.pitch.to(device), lsh.shift.to(device), torch.arange(T, device=device))
    return lambda q, k, v: flex.flex_attend(q, k, v, score_mod, mask)


def cudnn_sdpa_available() -> bool:
    """This torch has SDPA's cuDNN backend and a CUDA device to run it."""
    from torch.nn.attention import SDPBackend  # noqa: PLC0415

    return torch.cuda.is_available() and hasattr(SDPBackend, "CUDNN_ATTENTION") and torch.backends.cudnn.is_available()


def sdpa_causal(backend: str):
    """Causal SDPA without bias on the ``"flash"`` or ``"cudnn"`` backend (CPU tensors: the math
    backend): the exact-attention floor. ``fn(q, k, v)`` on (B, T, H, D)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: PLC0415

    def fn(q, k, v):
        chosen = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": getattr(SDPBackend, "CUDNN_ATTENTION", None)}[backend] \
            if q.is_cuda else SDPBackend.MATH
        with sdpa_kernel(chosen):
            out = torch.nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return out.transpose(1, 2)

    return fn


def _triton_runs(device) -> bool:
    """The Triton kernel runs here: compiled on CUDA, or under the interpreter on CPU."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    return (triton_cuda if device.type == "cuda" else triton_interpreter)(device, dtype)


def _sigmas(H: int):
    slopes = alibi_slopes(H)
    return (("per_head", slopes.double().reciprocal()), ("256", 256.0))


def _tag(sigma_name: str) -> str:
    return "perhead" if sigma_name == "per_head" else "sigma256"


def flex_methods(args, T: int, device) -> list[tuple[str, dict, object]]:
    """FlexAttention beside the kernel: exact ALiBi, ALiBi in one window and in the per-head
    truncation windows, and PLSH's count from the hash (per-head sigma and sigma = 256, each s).
    Where FlexAttention cannot build (or ``--no-flex``), the chunked exact ALiBi stands in for
    the ALiBi rows, the PLSH rows are left out, and the records say why."""
    H = args.heads
    slopes = alibi_slopes(H)
    per_head = truncation_windows(math.log(8) + 0.58, slopes.double().reciprocal())
    out = []
    for name, window in (("alibi", None), ("alibi_window", args.window), ("alibi_window_perhead", per_head)):
        settings = {"exact": window is None, "window": "per-head" if name.endswith("perhead") else window}
        if name.endswith("perhead"):
            settings["windows"] = per_head.tolist()
        try:
            if not args.flex:
                raise RuntimeError("--no-flex")
            out.append((f"{name}_flex", settings, flex_alibi(slopes, T, window, device)))
        except Exception as exc:  # no triton / inductor: fall back to the chunked exact op
            fn = (lambda w: lambda q, k, v: alibi_attention(q, k, v, slopes=slopes, window=w))(window)
            out.append((f"{name}_chunked", {**settings, "flex_error": f"{type(exc).__name__}: {exc}"[:200]}, fn))
    if args.flex:
        for sigma_name, sigma in _sigmas(H):
            for s in [x for x in args.samples if x <= args.flex_max_s]:
                out.append((f"plsh_flex_{_tag(sigma_name)}_s{s}", {"backend": "flex", "sigma": sigma_name, "s": s},
                            flex_plsh(sigma, s, T, device)))
    return out


def methods(args, T: int, device) -> list[tuple[str, dict, object]]:
    """(name, settings, fn) for every method of the grid at length T, in the order they run."""
    H = args.heads
    slopes = alibi_slopes(H)
    out = [("sdpa_flash_causal", {"exact": True}, sdpa_causal("flash"))]
    if device.type == "cuda" and cudnn_sdpa_available():
        out.append(("sdpa_cudnn_causal", {"exact": True}, sdpa_causal("cudnn")))
    if _triton_runs(device):
        for sigma_name, sigma in _sigmas(H):
            for s in args.samples:
                fn = (lambda sg, ss: lambda q, k, v: plsh_attention(
                    q, k, v, sigma=sg, num_samples=ss, seed=0, backend="triton"))(sigma, s)
                out.append((f"plsh_triton_{_tag(sigma_name)}_s{s}", {"backend": "triton", "sigma": sigma_name,
                                                                     "s": s}, fn))
        per_head_windows = truncation_windows(math.log(8) + 0.58, slopes.double().reciprocal())
        for name, window in (("alibi_window_triton", args.window), ("alibi_window_triton_perhead", per_head_windows)):
            fn = (lambda w: lambda q, k, v: alibi_window_attention(
                q, k, v, sigma=slopes.reciprocal(), window=w)[0])(window)
            out.append((name, {"exact": False, "window": window if isinstance(window, int) else "per-head",
                               "windows": torch.as_tensor(window).reshape(-1).tolist()}, fn))
    if flash_attn_available(device, torch.bfloat16):
        from flash_attn import flash_attn_func

        out.append(("alibi_flash_attn", {"exact": True},
                    lambda q, k, v: flash_attn_func(q, k, v, causal=True, alibi_slopes=slopes.to(q.device))))
        out.append(("alibi_window_flash_attn", {"exact": False, "window": args.window},
                    lambda q, k, v: flash_attn_func(q, k, v, causal=True, alibi_slopes=slopes.to(q.device),
                                                    window_size=(args.window - 1, 0))))
    out += flex_methods(args, T, device)
    backends = ["torch"] + (["flash_attn"] if flash_attn_available(device, torch.bfloat16) else [])
    for backend in backends:  # the per-sample varlen path, s = 8 (its host plan alone grows with s)
        for sigma_name, sigma in _sigmas(H):
            for s in [x for x in args.samples if x <= args.per_sample_max_s]:
                fn = (lambda sg, ss, bk: lambda q, k, v: plsh_attention(
                    q, k, v, sigma=sg, num_samples=ss, seed=0, backend=bk, method="per_sample"))(sigma, s, backend)
                out.append((f"plsh_{backend}_{_tag(sigma_name)}_s{s}",
                            {"backend": backend, "sigma": sigma_name, "s": s}, fn))
    return out


def flops_for(name: str, settings: dict, T: int, args) -> tuple[float, float]:
    """(useful, visited) fwd+bwd FLOPs of one case (module doc)."""
    H, D = args.heads, args.head_dim
    if name.startswith("plsh"):
        sigma = dict(_sigmas(H))[settings["sigma"]]
        lsh = PositionalLSH(sigma, settings["s"], seed=0)
        if settings["backend"] == "triton":
            return onepass_band_flops(settings["sigma"], settings["s"], T, H, D), \
                kernel_visited_flops(tiles.kernel_tiles(lsh, T, H, head_dim=D), D)
        if settings["backend"] == "flex":  # the band's 128 x 128 blocks, every head (Hb = 1: shared)
            blocks = flex.visited_blocks(*_plsh_band(lsh, T)) * (H if lsh.num_heads == 1 else 1)
            return onepass_band_flops(settings["sigma"], settings["s"], T, H, D), flash_visited_flops(blocks, D)
        return plsh_flops(sigma, settings["s"], T, H, D), flash_visited_flops(tiles.per_sample_tiles(lsh, T, H), D)
    if name.startswith("alibi_window_triton"):
        windows = settings["windows"]
        useful = sum(window_flops(T, 1, D, w) for w in (windows * H if len(windows) == 1 else windows))
        k = tiles.window_tiles(alibi_slopes(H).reciprocal(), windows, T, H, head_dim=D)
        return useful, kernel_visited_flops(k, D)
    if name.startswith("alibi_window_perhead"):  # flex, or the chunked op standing in for it
        windows = torch.tensor(settings["windows"])
        useful = sum(window_flops(T, 1, D, int(w)) for w in windows)
        return useful, flash_visited_flops(flex.visited_blocks(*flex.alibi_band(T, windows, True, "cpu")), D)
    if settings.get("window"):
        useful = window_flops(T, H, D, settings["window"])
        return useful, useful
    return dense_causal_flops(T, H, D), flash_visited_flops(tiles.floor_tiles(T, H), D)


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
            record = {"method": name, "T": T, "H": H, "D": D, "dtype": str(dtype).split(".")[-1],
                      "device_type": device.type, **settings}
            if time.time() - t_start > args.budget_s:
                records.append({**record, "status": "skipped: time budget"})
                continue
            if device.type == "cuda":
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
            try:
                reps = args.repeats if T < 131072 else max(1, args.repeats - 1)
                times = time_fwd_bwd(fn, q, k, v, reps, args.warmup, device)
            except torch.OutOfMemoryError:
                records.append({**record, "status": "oom"})
                print(f"T={T:>7} {name:<34} out of memory", flush=True)
                continue
            except Exception as exc:
                records.append({**record, "status": f"error: {type(exc).__name__}: {exc}"[:300]})
                print(f"T={T:>7} {name:<34} error {type(exc).__name__}: {exc}", flush=True)
                continue
            median = statistics.median(times)
            useful, visited = flops_for(name, settings, T, args)
            record.update(status="ok", time_s=median, times_s=times, tflops=useful / median / 1e12,
                          tflops_visited=visited / median / 1e12)
            if device.type == "cuda":
                record["peak_mem_mib"] = (torch.cuda.max_memory_allocated() - base) / 2**20
            records.append(record)
            print(f"T={T:>7} {name:<34} {median * 1e3:10.2f} ms  {record['tflops']:8.3g} / "
                  f"{record['tflops_visited']:.3g} TFLOP/s useful / visited"
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


#: Issue 25's GPU targets: the kernel (per-head sigma, s = 8, fwd + bwd) this many times faster
#: than the causal flash floor at each T, with at least half the floor's TFLOP/s over visited tiles.
SPEEDUP_TARGETS = {8192: 3.0, 131072: 20.0, 524288: 50.0}
KERNEL = "plsh_triton_perhead_s8"


def targets(records: list[dict]) -> list[tuple[str, str]]:
    """(target, verdict) for each GPU target: measured and met / not met, or not measured."""
    ok = {(r["method"], r["T"]): r for r in records if r.get("status") == "ok"}
    out = []
    for T, factor in SPEEDUP_TARGETS.items():
        k, floor = ok.get((KERNEL, T)), ok.get(("sdpa_flash_causal", T))
        name = f"T={T}: {KERNEL} >= {factor:g}x faster than the causal flash floor"
        if k is None or floor is None or k.get("device_type") != "cuda":
            out.append((name, "not measured on a GPU"))
            continue
        speed = floor["time_s"] / k["time_s"]
        out.append((name, f"{speed:.2f}x: {'met' if speed >= factor else 'NOT met'}"))
        half = k["tflops_visited"] >= 0.5 * floor["tflops_visited"]
        out.append((f"T={T}: its TFLOP/s over visited tiles >= half the floor's",
                    f"{k['tflops_visited']:.3g} vs {floor['tflops_visited']:.3g}: {'met' if half else 'NOT met'}"))
    return out


def markdown(records: list[dict], device_name: str) -> str:
    lines = [f"Device: {device_name}. fwd+bwd, batch 1, median; speedup = causal flash SDPA time / method time; "
             "TFLOP/s over the useful scores and over the tiles the kernels visit.", "",
             "| T | method | time (ms) | speedup vs floor | TFLOP/s useful | TFLOP/s visited | peak MiB |",
             "|---|---|---|---|---|---|---|"]
    for r in records:
        if r.get("status") != "ok":
            lines.append(f"| {r['T']} | {r['method']} | {r.get('status')} | | | | |")
            continue
        mem = f"{r['peak_mem_mib']:.0f}" if "peak_mem_mib" in r else "-"
        lines.append(f"| {r['T']} | {r['method']} | {r['time_s'] * 1e3:.2f} | {r.get('speedup_vs_floor', math.nan):.2f}x"
                     f" | {r['tflops']:.3g} | {r['tflops_visited']:.3g} | {mem} |")
    lines += ["", "GPU targets (issue 25):", "", "| target | result |", "|---|---|"]
    lines += [f"| {name} | {verdict} |" for name, verdict in targets(records)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="gpu_results/bench", help="directory for results.json / results.md")
    p.add_argument("--lengths", type=lambda s: [int(x) for x in s.split(",")], default=[8192, 32768, 131072, 524288])
    p.add_argument("--samples", type=lambda s: [int(x) for x in s.split(",")], default=[8, 32, 100])
    p.add_argument("--per-sample-max-s", type=int, default=8, help="largest s the per-sample varlen path runs")
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--window", type=int, default=4096, help="window of windowed ALiBi (16 x the largest sigma, 256)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--budget-s", type=float, default=300.0, help="skip the remaining cases after this many seconds")
    p.add_argument("--no-flex", dest="flex", action="store_false", help="chunked exact ALiBi instead of FlexAttention")
    p.add_argument("--flex-max-s", type=int, default=8,
                   help="largest s of PLSH on FlexAttention (its score_mod unrolls s float64 bucket pairs)")
    p.add_argument("--cpu", action="store_true", help="run on the CPU even when CUDA is there")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    records = run(args)
    device_name = torch.cuda.get_device_name() if torch.cuda.is_available() and not args.cpu else "CPU"
    meta = {"device": device_name, "torch": torch.__version__, "flash_attn": flash_attn_available(
        torch.device("cuda"), torch.bfloat16) if torch.cuda.is_available() else False}
    (out / "results.json").write_text(json.dumps({"meta": meta, "records": records, "targets": targets(records)},
                                                 indent=1) + "\n")
    (out / "results.md").write_text(markdown(records, device_name))
    print(f"wrote {out / 'results.json'} and {out / 'results.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
