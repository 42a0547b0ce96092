"""The graph stage's SP part: one decoder layer under sequence parallelism, SP = 2, in a CUDA graph.

    python3 tools/gpu_graph_sp.py --out gpu_results [--budget-s 120]   # also gpu_graph.py's sp_layer part

One GPU: NCCL refuses two ranks on one device, so the two ranks are two processes on the same GPU
joined by a **gloo** group (file rendezvous). Each rank builds decoder layer 1 of the model of
``configs/qwen3_0.6b_8k_plsh_s10.toml`` (the config's attention on the fused kernel, bf16, the
seed context's step kept on the device, as ``gpu_graph.py`` builds it), applies sequence
parallelism and runs the layer on its half of one 8,192-token row (global positions). One **step**
is the layer's forward and the backward of a fixed projection of its output (the gradients of the
input and of every parameter). Per rank, in this order, every step started at a barrier:

- **eager**: the host syncs of one step seen from Python (``set_sync_debug_mode("warn")``, by
  source line), then the step's time; the outputs and gradients at two inputs A and B are kept;
- **graphed**: the eager step captured in one ``torch.cuda.graph`` (three warm-up steps on a side
  stream first; ``set_sync_debug_mode("error")`` during capture and every replay), replayed with
  input A, then with input B written into the captured input: each replay must give eager's
  outputs and gradients at that input. A replay that matches at A but not at B replays the
  capture's halo: the halo exchange is host code (the SP ops read the chunk layout on the host
  and send the keys and values through gloo's host-side transport), which a graph does not record;
- **compiled**: the layer under ``torch.compile(fullgraph=True)`` (inductor on CUDA), its first
  step (the compile) timed apart, checked against eager at A (bf16: 2e-2);
- **compiled+graphed**: the compiled step captured and checked as the eager one.

The SP ops were built for host-side exchanges, so the capture is expected to fail (a host sync or
a gloo call during capture) or to replay a stale halo: either is recorded as a failure with its
message, never as a pass. A part that fails is recorded and the next one runs (a capture that
fails on one rank can leave the other waiting in a collective: the gloo timeout and this script's
hard limit end it). ``sp_graph.json`` holds both ranks' records.

Without CUDA the capture is skipped and says so; the ranks run the eager and compiled steps of the
``tiny`` preset at 64 tokens in fp32 on the CPU, compiled with ``aot_eager`` (the code path, not a
measurement). Never run on a GPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# as gpu_graph.py: run from the source tree on a GPU machine where the package may not be installed
sys.path.insert(0, str(ROOT))

SP = 2
#: Seconds a rank's process may run past the budget before it is killed.
GRACE_S = 30.0
#: Seconds a gloo collective waits for the other rank (one that failed a capture never arrives).
GLOO_TIMEOUT_S = 60.0
#: A part starts only with this much of the budget left.
NEEDS_S = {"eager": 10.0, "graphed": 10.0, "compiled": 40.0, "compiled+graphed": 10.0}
TIMED = {True: 10, False: 2}  # timed steps on CUDA / on the CPU toy
CPU_TOY = dict(preset="tiny", seq_len=64)
BF16_TOL = dict(atol=2e-2, rtol=2e-2)
FP32_TOL = dict(atol=1e-5, rtol=1e-4)
#: What a run without CUDA says it skipped.
NO_CUDA = ("the SP layer's CUDA graph (capture, replay, set_sync_debug_mode) and the 0.6B layer at 8k in bf16: "
           "no CUDA (nothing here is measured on a GPU); ran the eager and compiled SP steps of the "
           f"{CPU_TOY['preset']} preset at {CPU_TOY['seq_len']} tokens in fp32 over gloo instead")


# ---------------------------------------------------------------- one rank


def build(rank: int, world: int, cuda: bool):
    """This rank's layer: ``(f, h, params, dtype, what)`` with ``f(h)`` the layer's output and ``h`` the
    static input chunk (B, T / world, hidden), requiring grad."""
    import torch
    import torch.distributed as dist

    from plsh_dist.distributed.sp_chunks import sp_chunk
    from plsh_dist.models import AttentionRuntime, apply_sequence_parallel, build_model, presets
    from tools.gpu_graph import run_config

    cfg = run_config()
    if cuda:
        device, dtype, T = torch.device("cuda", 0), torch.bfloat16, cfg["seq_len"]
        model_cfg, attn_cfg = cfg["model"], dataclasses.replace(cfg["attention"], backend="triton")
    else:
        device, dtype, T = torch.device("cpu"), torch.float32, CPU_TOY["seq_len"]
        model_cfg, attn_cfg = presets[CPU_TOY["preset"]], cfg["attention"]
    torch.manual_seed(cfg["seed"])  # the same weights on every rank
    runtime = AttentionRuntime(run_seed=cfg["seed"])
    if cuda:
        runtime.keep_steps_on(device)
    model_cfg = dataclasses.replace(model_cfg, num_layers=2)  # layer 1 is the one measured
    model = build_model(model_cfg, attn_cfg, runtime, device=device, dtype=dtype).train()
    apply_sequence_parallel(model, dist.group.WORLD)
    decoder = model.get_decoder()
    layer = decoder.layers[1]
    position_ids = sp_chunk(torch.arange(T)[None], rank, world).contiguous().to(device)
    h = torch.zeros(1, T // world, model_cfg.hidden_size, device=device, dtype=dtype, requires_grad=True)
    cos_sin = decoder.rotary_emb(h, position_ids)

    def f(x):
        out = layer(x, attention_mask=None, position_ids=position_ids, position_embeddings=cos_sin)
        return out[0] if isinstance(out, tuple) else out

    what = {"model": f"decoder layer 1 of {model_cfg.num_layers}: hidden {model_cfg.hidden_size}, "
                     f"{model_cfg.num_heads} / {model_cfg.num_kv_heads} heads",
            "tokens": T, "chunk": T // world, "sp": world, "group": "gloo", "dtype": str(dtype).split(".")[-1],
            "attention": {k: getattr(attn_cfg, k) for k in ("bias", "num_samples", "backend", "method")}}
    return f, h, list(layer.parameters()), dtype, what


def inputs(h, rank: int, world: int) -> dict:
    """Inputs A and B of this rank's chunk: slices of one full row drawn from a fixed seed."""
    import torch

    from plsh_dist.distributed.sp_chunks import sp_chunk

    out = {}
    for name, seed in (("A", 1), ("B", 2)):
        g = torch.Generator().manual_seed(seed)
        full = torch.randn(1, h.shape[1] * world, h.shape[2], generator=g)
        out[name] = sp_chunk(full, rank, world).to(h.device, h.dtype).contiguous()
    return out


def run_rank(rank: int, world: int, rendezvous: str, out_path: Path, cuda: bool, backend: str,
             deadline: float) -> dict:
    """Every part on this rank within ``deadline`` (``time.time()``); the record, written after each part."""
    import torch
    import torch.distributed as dist

    from tools.gpu_graph import failure, site_recorder

    if not cuda:
        torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=GLOO_TIMEOUT_S))
    rec = {"rank": rank, "cuda": cuda, "backend": backend, "times": {}, "checks": {}, "failures": {},
           "skipped": [], "sync_sites": {}}

    def write():
        out_path.write_text(json.dumps(rec, indent=1) + "\n")

    def sync():
        if cuda:
            torch.cuda.synchronize()

    try:
        f, h, params, dtype, rec["what"] = build(rank, world, cuda)
    except Exception as exc:  # noqa: BLE001
        rec["failures"]["build"] = failure(exc)
        write()
        return rec
    tol = BF16_TOL if dtype == torch.bfloat16 else FP32_TOL
    x = inputs(h, rank, world)
    probe = torch.linspace(-1, 1, h.numel(), device=h.device, dtype=torch.float32).view_as(h).to(dtype)

    def step(fn):
        """Gradients to None, forward, backward: the output and the gradients (the tensors autograd wrote)."""
        h.grad = None
        for p in params:
            p.grad = None
        out = fn(h)
        (out * probe).sum().backward()
        return out

    def grads():
        return [h.grad] + [p.grad for p in params]

    def snapshot(out):
        return [t.detach().clone() for t in [out, *grads()]]

    def timed(fn) -> dict:
        seconds = []
        for _ in range(TIMED[cuda]):
            dist.barrier()
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            seconds.append(time.perf_counter() - t0)
        return {"median_ms": statistics.median(seconds) * 1e3, "all_ms": [round(t * 1e3, 3) for t in seconds]}

    def compare(got, want, tolerance) -> dict:
        errors = [float((a.double() - b.double()).abs().max()) for a, b in zip(got, want)]
        ok = len(got) == len(want) and all(torch.allclose(a.double(), b.double(), **tolerance)
                                           for a, b in zip(got, want))
        return {"ok": ok, "max_abs_error": max(errors) if errors else None}

    eager_at = {}

    def eager_part():
        with torch.no_grad():
            h.copy_(x["A"])
        if cuda:  # host syncs of one step, by source line (gpu_graph.py's recorder)
            show, sites = site_recorder()
            sync()
            with warnings.catch_warnings():
                warnings.simplefilter("always")
                warnings.showwarning = show
                torch.cuda.set_sync_debug_mode("warn")
                try:
                    step(f)
                finally:
                    torch.cuda.set_sync_debug_mode("default")
            rec["sync_sites"]["eager"] = sorted(sites.values(), key=lambda s: -s["calls"])
        else:
            step(f)
        rec["times"]["eager"] = timed(lambda: step(f))
        for name in ("A", "B"):
            with torch.no_grad():
                h.copy_(x[name])
            dist.barrier()
            eager_at[name] = snapshot(step(f))

    def graphed_part(fn, name):
        with torch.no_grad():
            h.copy_(x["A"])
        dist.barrier()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up on a side stream (PyTorch's CUDA-graph docs)
            for _ in range(3):
                step(fn)
        torch.cuda.current_stream().wait_stream(side)
        dist.barrier()
        graph = torch.cuda.CUDAGraph()
        t0 = time.perf_counter()
        with torch.cuda.graph(graph):
            torch.cuda.set_sync_debug_mode("error")
            try:
                static_out = step(fn)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        rec["times"][name] = {"capture_s": round(time.perf_counter() - t0, 2)}
        static = [static_out, *grads()]

        def replay():
            torch.cuda.set_sync_debug_mode("error")
            try:
                graph.replay()
            finally:
                torch.cuda.set_sync_debug_mode("default")

        rec["times"][name].update(timed(replay))
        check = {}
        for inp in ("A", "B"):  # B written into the captured input: a stale halo shows here
            with torch.no_grad():
                h.copy_(x[inp])
            dist.barrier()
            replay()
            sync()
            check[inp] = compare([t.detach() for t in static], eager_at[inp], tol)
        check["ok"] = check["A"]["ok"] and check["B"]["ok"]
        if check["A"]["ok"] and not check["B"]["ok"]:
            check["verdict"] = ("the replay at input B gives wrong outputs or gradients while A's match: the "
                                "graph replays the capture's halo (the exchange ran on the host at capture, not in "
                                "the graph)")
        rec["checks"][name] = check

    compiled = {}

    def compiled_part():
        compiled["fn"] = fn = torch.compile(f, backend=backend, fullgraph=True)
        with torch.no_grad():
            h.copy_(x["A"])
        dist.barrier()
        t0 = time.perf_counter()
        out = step(fn)  # compiles forward and backward
        sync()
        rec["times"]["compiled"] = {"compile_s": round(time.perf_counter() - t0, 2), "backend": backend}
        check = {"A": compare(snapshot(out), eager_at["A"], BF16_TOL if dtype == torch.bfloat16 else FP32_TOL)}
        check["ok"] = check["A"]["ok"]
        rec["checks"]["compiled"] = check
        rec["times"]["compiled"].update(timed(lambda: step(fn)))

    parts = ["eager", "graphed", "compiled", "compiled+graphed"] if cuda else ["eager", "compiled"]
    if not cuda:
        rec["skipped"].append(NO_CUDA)
    for part in parts:
        left = deadline - time.time()
        if left < NEEDS_S[part]:  # both ranks see nearly the same clock; a rank that goes on alone times out
            rec["skipped"].append(f"{part}: {left:.0f} s left, it needs {NEEDS_S[part]:.0f}")
            continue
        try:
            if part != "eager" and not eager_at:
                rec["skipped"].append(f"{part}: the eager step failed")
            elif part == "eager":
                eager_part()
            elif part == "graphed":
                graphed_part(f, part)
            elif part == "compiled":
                compiled_part()
            elif "fn" not in compiled or "compiled" in rec["failures"]:
                rec["skipped"].append(f"{part}: the compiled step did not run")
            else:
                graphed_part(compiled["fn"], part)
        except Exception as exc:  # noqa: BLE001  (capture errors, syncs, gloo errors: recorded, the next part runs)
            rec["failures"][part] = failure(exc)
            if cuda:
                torch.cuda.set_sync_debug_mode("default")
                torch.cuda.empty_cache()
        write()
    write()
    return rec


# ---------------------------------------------------------------- the launching process


def run_sp_layer(out: Path, budget_s: float = 120.0, cuda: bool | None = None, backend: str | None = None) -> dict:
    """Start the ``SP`` ranks (processes of this script), wait for them at most ``budget_s`` +
    :data:`GRACE_S`, and merge their records into ``out/sp_graph.json``: what every rank measured, its
    failures (``"rank r: part"``), and ``ok`` only when nothing failed and every check passed."""
    import torch

    t0 = time.time()
    cuda = torch.cuda.is_available() if cuda is None else cuda
    backend = backend or ("inductor" if cuda else "aot_eager")
    out.mkdir(parents=True, exist_ok=True)
    result = {"cuda": cuda, "sp": SP, "group": "gloo", "backend": backend, "budget_s": budget_s, "skipped": [],
              "failures": {}, "ranks": []}
    with tempfile.TemporaryDirectory(prefix="gpu_graph_sp_") as tmp:
        deadline = time.time() + budget_s
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
        procs = []
        for r in range(SP):
            cmd = [sys.executable, str(Path(__file__).resolve()), "--rank", str(r), "--rendezvous",
                   f"{tmp}/rendezvous", "--rank-out", f"{tmp}/rank{r}.json", "--deadline", str(deadline),
                   "--backend", backend] + (["--no-cuda"] if not cuda else [])
            procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          text=True))
        for r, proc in enumerate(procs):
            try:
                output, _ = proc.communicate(timeout=max(1.0, deadline + GRACE_S - time.time()))
            except subprocess.TimeoutExpired:
                proc.kill()
                output, _ = proc.communicate()
                result["failures"][f"rank {r}: process"] = {
                    "error": f"killed after {budget_s + GRACE_S:g} s (budget {budget_s:g} + {GRACE_S:g})", "chain": []}
            else:
                if proc.returncode != 0:
                    result["failures"][f"rank {r}: process"] = {
                        "error": f"exit status {proc.returncode}: {output[-1200:]}", "chain": []}
            path = Path(tmp, f"rank{r}.json")
            rec = json.loads(path.read_text()) if path.is_file() else {"rank": r, "failures": {}, "skipped": []}
            rec["output_tail"] = output[-2000:]
            result["ranks"].append(rec)
    for rec in result["ranks"]:
        for part, f in rec.get("failures", {}).items():
            result["failures"][f"rank {rec['rank']}: {part}"] = f
        for s in rec.get("skipped", []):
            if s not in result["skipped"]:
                result["skipped"].append(s)
    checks = [c for rec in result["ranks"] for c in rec.get("checks", {}).values()]
    result["ok"] = not result["failures"] and all(c["ok"] for c in checks)
    result["wall_s"] = round(time.time() - t0, 1)
    result["summary"] = summary_lines(result)
    (out / "sp_graph.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


def summary_lines(result: dict) -> list[str]:
    """The SP part's lines of ``summary.txt``."""
    lines = [f"SP layer in a CUDA graph (SP = {result['sp']} over {result['group']} on one device, "
             f"{result.get('wall_s')} s, sp_graph.json): {'ok' if result['ok'] else 'FAILED'}"]
    what = next((rec["what"] for rec in result["ranks"] if "what" in rec), None)
    if what:
        lines.append(f"  {what['model']}, {what['tokens']} tokens ({what['chunk']} a rank), {what['dtype']}, "
                     f"{what['attention']}")
    lines += [f"  SKIPPED {s}" for s in result["skipped"]]
    for rec in result["ranks"]:
        for name, t in rec.get("times", {}).items():
            extra = "".join(f", {k} {t[k]}" for k in ("capture_s", "compile_s", "backend") if k in t)
            lines.append(f"  rank {rec['rank']} {name:<16} " + (f"{t['median_ms']:10.2f} ms/step" if "median_ms" in t
                                                                 else "not timed") + extra)
        for name, c in rec.get("checks", {}).items():
            lines.append(f"  rank {rec['rank']} check {name}: {'ok' if c['ok'] else 'FAILED'}; " + "; ".join(
                f"input {k}: max abs error {v['max_abs_error']:.3g}" for k, v in c.items() if k in ("A", "B")
                and v["max_abs_error"] is not None) + (f"; {c['verdict']}" if "verdict" in c else ""))
        sites = rec.get("sync_sites", {}).get("eager")
        if sites:
            lines.append(f"  rank {rec['rank']}: host syncs in one eager SP step (seen from Python): "
                         f"{sum(x['calls'] for x in sites)} at {len(sites)} sites")
            lines += [f"    {x['calls']:4d}x {x['where']}" for x in sites[:6]]
    for name, f in result["failures"].items():
        lines.append(f"  FAILED {name}:")
        for c in f.get("chain") or [{"error": f["error"], "where": []}]:
            lines.append(f"    {c['error'][:400]}")
            lines += [f"      at {w}" for w in c["where"][-2:]]
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", help="folder for sp_graph.json")
    p.add_argument("--budget-s", type=float, default=120.0, help="parts not started by then are skipped")
    p.add_argument("--compile-backend", default=None, help="default: inductor on CUDA, aot_eager on CPU")
    p.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    p.add_argument("--rendezvous", help=argparse.SUPPRESS)
    p.add_argument("--rank-out", help=argparse.SUPPRESS)
    p.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    p.add_argument("--backend", help=argparse.SUPPRESS)
    p.add_argument("--no-cuda", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.rank is not None:  # one rank, started by run_sp_layer
        run_rank(args.rank, SP, args.rendezvous, Path(args.rank_out), not args.no_cuda, args.backend, args.deadline)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)  # without the interpreter's teardown (a gloo thread still joinable at exit)
    if not args.out:
        p.error("--out is required")
    result = run_sp_layer(Path(args.out), args.budget_s, backend=args.compile_backend)
    print("\n".join(result["summary"]))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
