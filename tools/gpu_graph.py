"""CUDA graphs of one training step: eager vs compiled vs graphed, for the 0.6B model at 8k.

    python3 tools/gpu_graph.py --out gpu_results [--budget-s 170]   # also gpu_check.py --stage graph

The model and attention of ``configs/qwen3_0.6b_8k_plsh_s10.toml`` (Qwen3-0.6B's
28 decoder layers, embedding, norm and tied LM head, vocabulary 32,000 from its
tokenizer; PLSH with per-head sigma and s = 10, no rope), bf16 parameters, the
fused Triton kernel (``backend="triton"``), one row of 8,192 tokens (one
document, positions 0 .. T - 1). One **step** is what the trainer does per
micro-step, on one process: gradients set to None, forward, the mean fp32 token
cross-entropy (as ``plsh_dist.train.losses``, not imported: ``plsh_dist.train``
imports DeepSpeed), backward, and ``torch.optim.AdamW(capturable=True)`` with the
config's ``[optim]`` settings (no clipping, no schedule). Its median time is
measured four ways:

- **eager**: the step as written;
- **compiled**: every decoder layer compiled as ``[run].compile = "inductor"`` does
  (``models.compile_layers``: ``fullgraph=True``); the first steps' compile time apart;
- **graphed**: the eager step captured in one ``torch.cuda.graph`` (static inputs,
  three warm-up steps on a side stream first, as PyTorch's CUDA-graph docs prescribe)
  and replayed, with ``torch.cuda.set_sync_debug_mode("error")`` during capture and
  every replay;
- **compiled+graphed**: the same capture of the step with compiled layers (the
  compiled path takes the hash seed from the step tensor; the eager one from Python).

Checks, at fixed weights (a snapshot restored before each checked step): a replay
(and a compiled step) gives the loss and the gradients of every layer's q_proj and
k_proj (relative L2 over all of them) at the captured step within flash-attention's
rule, as the kernel's tests use it: at most 2x the eager bf16 step's error against
an fp32 copy of the model with the same weights and masks (the fused kernel in fp32,
or the torch one pass where that fails), plus 1e-4 (a bf16 value
eager happens to get nearly exactly). A replay runs eager's kernels on eager's
inputs and should match eager to the bit (``loss_minus_eager`` and
``grad_distance_to_eager`` say whether it does); a compiled step fuses and rounds
differently, and may err up to twice what eager does. Then the seed context's step
tensor is updated in place (``runtime.set_step``) and the next replay must match
the new step's reference and be further than that allowance from the old step's:
the masks changed, so the graph reads the seed from a tensor rather than a
constant (where it reproduces the old step's gradients, the report says that the
seed is a constant of the graph). Before
all that, one eager step runs under ``set_sync_debug_mode("warn")`` and every host
synchronisation seen from Python is listed with its source line (as is one compiled
step's): what a capture would trip on.

Each part that fails (a capture error, a sync caught by the debug mode, out of
memory, a compile error) is recorded with its message and the stage goes on; parts
not started within ``--budget-s`` are skipped and said so. ``graph.json`` is
rewritten after every part, so a run killed mid-way leaves what it measured.
``gpu_check.py`` runs this file in a child process under a hard time limit, so a
crash or a poisoned CUDA context cannot take the other stages with it.

Without CUDA it says what it skipped (capture, replay, the sync debug mode, the
0.6B model at 8k in bf16) and runs the eager and compiled steps and the compiled
checks on the ``tiny`` preset at 64 tokens in fp32 (fp64 reference), compiled with
``aot_eager`` (dynamo and AOTAutograd, what inductor is given, without its C++ code
generation: tens of seconds per graph on a CPU; ``--compile-backend inductor``
runs it). Its times are of that toy and mean nothing for a GPU. Never run on a GPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import subprocess
import sys
import time
import tomllib
import traceback
import warnings
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
# The GPU check sets its own path: it runs as `python3 tools/gpu_graph.py` on a
# GPU machine where the package is not installed and nothing can be installed (docs/gpu.md).
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from plsh_dist.models import AttentionConfig, AttentionRuntime, build_model, compile_layers, presets  # noqa: E402

CONFIG = ROOT / "configs" / "qwen3_0.6b_8k_plsh_s10.toml"
#: Seconds after which parts not yet started are skipped (gpu_check.py kills the process GRAPH_GRACE_S later).
GRAPH_BUDGET_S = 170.0
#: A part is started only with this many seconds of the budget left (the compile needs the most).
NEEDS_S = {"eager": 20.0, "references": 15.0, "graphed": 25.0, "compiled": 60.0, "compiled+graphed": 15.0,
           "sp_layer": 40.0}
#: Seconds the SP part's command may run past its budget (its ranks' own grace, and their start).
SP_GRACE_S = 60.0
#: What the stage says of the SP layer's capture without CUDA (tools/gpu_graph_sp.py runs its CPU path).
SP_NO_CUDA = ("sp_layer: the SP = 2 layer's CUDA graph (two ranks on one GPU over gloo, tools/gpu_graph_sp.py): "
              "no CUDA, not attempted")
#: The step whose masks are captured, and the one written into the step tensor after capture.
STEPS = (0, 1)
TIMED = {"eager": 5, "graphed": 10, "compiled": 5}
#: Timed steps without CUDA: the toy's times mean nothing, the code is what is exercised.
TIMED_CPU = 2
#: Error factor over the eager step's error against the higher-precision copy (flash-attention's rule;
#: tests/tolerances.py's BF16_FACTOR), and the slack added to it: a rounding of the result's own dtype
#: for a compiled step that gets a value the eager one gets exactly.
FACTOR = 2.0
SLACK = {torch.bfloat16: 1e-4, torch.float32: 2e-5}
CPU_TOY = dict(preset="tiny", seq_len=64)


class Setup(NamedTuple):
    """The model, its seed context, optimizer and one static batch (ids, positions, labels). (Not a
    dataclass: the tests load this script without a ``sys.modules`` entry, which dataclasses need.)"""

    model: torch.nn.Module
    runtime: AttentionRuntime
    optimizer: torch.optim.Optimizer
    batch: dict
    dtype: torch.dtype
    model_cfg: object
    attn_cfg: AttentionConfig

    def fingerprint(self) -> list[torch.nn.Parameter]:
        """The parameters whose gradients the checks compare: every layer's q_proj and k_proj (their
        gradients pass through the attention's weights, so a change of masks shows there first)."""
        return [p for layer in self.model.get_decoder().layers for p in
                (layer.self_attn.q_proj.weight, layer.self_attn.k_proj.weight)]


def run_config(path: Path = CONFIG) -> dict:
    """The model, attention, sequence length and optimizer settings of the run config, read with
    ``tomllib`` (``plsh_dist.config`` would do it too, but imports more than this check may find)."""
    table = tomllib.loads(path.read_text())
    model_cfg = dataclasses.replace(presets[table["model"]["preset"]], vocab_size=table["tokenizer"]["vocab_size"])
    optim = table.get("optim", {})
    return {"model": model_cfg, "attention": AttentionConfig(**table["attention"]), "seq_len": table["data"]["seq_len"],
            "seed": table["run"]["seed"], "lr": optim.get("lr", 3e-4), "weight_decay": optim.get("weight_decay", 0.1),
            "betas": (optim.get("beta1", 0.9), optim.get("beta2", 0.95))}


def build(cuda: bool) -> Setup:
    """On CUDA: the config's model in bf16 on the fused kernel at its sequence length. Without: the
    ``tiny`` preset in fp32 at :data:`CPU_TOY`'s length, the config's attention on the CPU backend."""
    cfg = run_config()
    if cuda:
        device, dtype, model_cfg, T = torch.device("cuda"), torch.bfloat16, cfg["model"], cfg["seq_len"]
        attn_cfg = dataclasses.replace(cfg["attention"], backend="triton")
    else:
        device, dtype, model_cfg, T = torch.device("cpu"), torch.float32, presets[CPU_TOY["preset"]], CPU_TOY["seq_len"]
        attn_cfg = cfg["attention"]
    torch.manual_seed(cfg["seed"])
    runtime = AttentionRuntime(run_seed=cfg["seed"])
    if cuda:  # the layer seeds computed on the GPU from the step there: what a replay reads
        runtime.keep_steps_on(device)
    model = build_model(model_cfg, attn_cfg, runtime, device=device, dtype=dtype).train()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model_cfg.vocab_size, (1, T + 1), generator=g)
    batch = {"input_ids": ids[:, :-1].to(device), "labels": ids[:, 1:].to(device),
             "position_ids": torch.arange(T)[None].to(device)}
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], betas=cfg["betas"],
                                  weight_decay=cfg["weight_decay"], capturable=cuda, foreach=True)
    return Setup(model, runtime, optimizer, batch, dtype, model_cfg, attn_cfg)


def loss_of(model, batch) -> torch.Tensor:
    """Mean token cross-entropy of ``batch`` in fp32 (fp64 for an fp64 model), the trainer's ``sum / n``
    on one process."""
    logits = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"]).logits
    return F.cross_entropy(logits.to(torch.promote_types(logits.dtype, torch.float32)).flatten(0, 1),
                           batch["labels"].flatten())


def train_step(s: Setup) -> torch.Tensor:
    """One step: gradients to None (inside a capture: the backward then writes the graph's own
    gradient tensors), forward, loss, backward, optimizer step. The loss, detached."""
    s.optimizer.zero_grad(set_to_none=True)
    loss = loss_of(s.model, s.batch)
    loss.backward()
    s.optimizer.step()
    return loss.detach()


def _sync(cuda: bool) -> None:
    if cuda:
        torch.cuda.synchronize()


def timed(fn, n: int, cuda: bool) -> list[float]:
    """Wall seconds of ``n`` calls, each waited for (launch overheads included: what a graph removes)."""
    times = []
    for _ in range(n):
        _sync(cuda)
        t0 = time.perf_counter()
        fn()
        _sync(cuda)
        times.append(time.perf_counter() - t0)
    return times


def failure(exc: BaseException) -> dict:
    """An exception as data: its text, the one it was raised while handling (a failed capture's
    ``capture_end`` hides the first error), and the innermost frames of this repository."""
    chain, e = [], exc
    while e is not None and len(chain) < 3:
        frames = [f for f in traceback.extract_tb(e.__traceback__) if f.filename.startswith(str(ROOT))]
        chain.append({"error": f"{type(e).__name__}: {e}"[:800],
                      "where": [f"{Path(f.filename).relative_to(ROOT)}:{f.lineno} in {f.name}" for f in frames[-4:]]})
        e = e.__cause__ or e.__context__
    return {"error": chain[0]["error"], "chain": chain}


def sync_sites(fn) -> list[dict]:
    """Host synchronisations of one call of ``fn`` seen from Python (CUDA only), by source line: the
    innermost frame of this repository (and of transformers' when it is nearer), how many, and the
    stack of the first. Syncs made where no Python frame is (autograd's C++ nodes) go to stderr."""
    show, sites = site_recorder()
    torch.cuda.synchronize()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = show
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    return sorted(sites.values(), key=lambda x: -x["calls"])


def site_recorder():
    """``(showwarning, sites)``: a ``warnings.showwarning`` that files each sync warning under its
    innermost frame of this repository or transformers, in the dict ``sites``."""
    sites: dict[str, dict] = {}

    def show(message, category, filename, lineno, file=None, line=None):
        if "synchroniz" not in str(message):
            return
        stack = [f for f in traceback.extract_stack()[:-1]
                 if Path(f.filename).is_relative_to(ROOT) or "/transformers/" in f.filename]
        where = [f"{_short(f.filename)}:{f.lineno} in {f.name}" for f in stack[-4:]]
        key = where[-1] if where else f"{_short(filename)}:{lineno}"
        site = sites.setdefault(key, {"where": key, "calls": 0, "stack": where, "op": f"{_short(filename)}:{lineno}"})
        site["calls"] += 1

    return show, sites


def _short(filename: str) -> str:
    path = Path(filename)
    if path.is_relative_to(ROOT):
        return str(path.relative_to(ROOT))
    parts = path.parts
    for lib in ("transformers", "torch"):
        if lib in parts:
            return "/".join(parts[parts.index(lib):])
    return filename


# --- references and checks ------------------------------------------------------------------


def references(s: Setup) -> dict:
    """At the current weights, for each step of :data:`STEPS`: the loss and fingerprint gradients of
    the eager step (``base``) and of a copy of the model in a higher precision (``ref``: fp32 for a
    bf16 model, fp64 for fp32), same seed context, same masks. On CUDA the copy runs the fused kernel
    in fp32 (IEEE products); where that fails (its bf16 tiles were never sized for fp32) it runs the
    torch one pass, and says why."""
    ref_dtype = torch.float32 if s.dtype in (torch.bfloat16, torch.float16) else torch.float64
    out = {"base": {}, "ref": {}, "ref_dtype": str(ref_dtype).split(".")[-1]}
    for step in STEPS:
        out["base"][step] = _loss_and_grads(s, step)
    backends = [s.attn_cfg.backend] + (["torch"] if s.attn_cfg.backend != "torch" else [])
    for i, backend in enumerate(backends):
        runtime = AttentionRuntime(run_seed=s.runtime.run_seed)
        attn_cfg = dataclasses.replace(s.attn_cfg, backend=backend)
        model = build_model(s.model_cfg, attn_cfg, runtime, device=s.batch["input_ids"].device, dtype=ref_dtype)
        model.load_state_dict(s.model.state_dict())  # the low-precision weights, exactly
        try:
            out["ref"] = {step: _loss_and_grads(s._replace(model=model, runtime=runtime), step) for step in STEPS}
            out["ref_backend"] = backend
            break
        except Exception as exc:  # noqa: BLE001  (the next backend is tried; the last one's error is raised)
            if i == len(backends) - 1:
                raise
            out["ref_fallback"] = f"{backend} in {out['ref_dtype']} failed: " + failure(exc)["error"]
        finally:
            del model
    s.runtime.set_step(STEPS[0])
    return out


def _loss_and_grads(s: Setup, step: int) -> tuple[float, list[torch.Tensor]]:
    """Loss and fingerprint gradients of ``s.model`` at ``step`` (``.grad`` untouched)."""
    s.runtime.set_step(step)
    loss = loss_of(s.model, s.batch)
    grads = torch.autograd.grad(loss, s.fingerprint())
    return float(loss.detach()), [g.detach().double() for g in grads]


def _rel(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    """Relative L2 distance of two lists of tensors (taken as one vector)."""
    num = sum(float((a.double() - b).pow(2).sum()) for a, b in zip(got, want))
    den = sum(float(b.pow(2).sum()) for b in want)
    return (num / den) ** 0.5 if den else float("inf")


def judge(got: dict, refs: dict, dtype: torch.dtype) -> dict:
    """``got[step] = (loss, grads)`` of a variant against the references (flash-attention's rule),
    and, at the step written after capture, against the captured step's reference."""
    slack = SLACK.get(dtype, 0.0)
    result = {}
    for step in STEPS:
        loss, grads = got[step]
        ref_loss, ref_grads = refs["ref"][step]
        base_loss, base_grads = refs["base"][step]
        row = {"loss": loss, "loss_error": abs(loss - ref_loss), "loss_allowed": FACTOR * abs(base_loss - ref_loss)
               + slack, "grad_error": _rel(grads, ref_grads), "grad_allowed": FACTOR * _rel(base_grads, ref_grads)
               + slack, "loss_minus_eager": loss - base_loss, "grad_distance_to_eager": _rel(grads, base_grads)}
        row["ok"] = row["loss_error"] <= row["loss_allowed"] and row["grad_error"] <= row["grad_allowed"]
        result[f"step {step}"] = row
    new, old = STEPS[1], STEPS[0]
    to_old = _rel(got[new][1], refs["ref"][old][1])
    moved = _rel(refs["ref"][new][1], refs["ref"][old][1])
    allowed = result[f"step {new}"]["grad_allowed"]
    matches_new = result[f"step {new}"]["ok"]
    changed = to_old > allowed and matches_new
    verdict = (f"the masks changed: step {new} gives step {new}'s gradients" if changed else
               f"step {new} reproduces step {old}'s gradients: the seed is a constant of the graph"
               if to_old <= allowed else f"step {new} matches neither step's gradients")
    result["masks"] = {"grad_distance_to_step_%d_reference" % old: to_old, "references_apart": moved,
                       "allowed": allowed, "conclusive": moved > 2 * allowed, "changed": changed,
                       "verdict": verdict}
    result["ok"] = all(result[f"step {k}"]["ok"] for k in STEPS) and result["masks"]["changed"]
    return result


def checked_steps(s: Setup, weights: list[torch.Tensor], run, grads) -> dict:
    """``run()`` (one step; returns its loss) at each step of :data:`STEPS`, the weights restored to
    ``weights`` first, the step selected by writing the step tensor in place; ``grads()`` the
    fingerprint gradients it left. ``{step: (loss, grads)}``."""
    got = {}
    for step in STEPS:
        with torch.no_grad():
            for p, w in zip(s.model.parameters(), weights):
                p.copy_(w)
        s.runtime.set_step(step)
        loss = run()
        got[step] = (float(loss), [g.detach().double().clone() for g in grads()])
    s.runtime.set_step(STEPS[0])
    return got


# --- the parts: eager, graphed, compiled ----------------------------------------------------


def _times(seconds: list[float]) -> dict:
    return {"median_ms": statistics.median(seconds) * 1e3, "all_ms": [round(t * 1e3, 3) for t in seconds]}


def eager_part(s: Setup, cuda: bool, result: dict) -> None:
    """The eager step: its syncs (CUDA), a warm-up, its time."""
    if cuda:
        result["sync_sites"]["eager"] = sync_sites(lambda: train_step(s))
    else:
        train_step(s)
    result["times"]["eager"] = _times(timed(lambda: train_step(s), TIMED["eager"] if cuda else TIMED_CPU, cuda))


def graphed_part(s: Setup, weights: list[torch.Tensor], refs: dict, result: dict, name: str = "graphed") -> None:
    """Capture the step as the model now runs it (eager, or with compiled layers) in one CUDA graph
    (sync debug mode "error"), time replays, check them; under ``name``."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up on a side stream (PyTorch's CUDA-graph docs)
        for _ in range(3):
            train_step(s)
    torch.cuda.current_stream().wait_stream(side)
    s.optimizer.zero_grad(set_to_none=True)
    graph = torch.cuda.CUDAGraph()
    t0 = time.perf_counter()
    with torch.cuda.graph(graph):  # its entry synchronises the device: the debug mode starts inside
        torch.cuda.set_sync_debug_mode("error")
        try:
            static_loss = train_step(s)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    result["times"][name] = {"capture_s": round(time.perf_counter() - t0, 2)}
    static_grads = [p.grad for p in s.fingerprint()]  # the graph's own tensors, rewritten by every replay
    if any(g is None for g in static_grads):
        raise RuntimeError("the captured backward left no gradient on a q_proj/k_proj weight")

    def replay():
        torch.cuda.set_sync_debug_mode("error")
        try:
            graph.replay()
        finally:
            torch.cuda.set_sync_debug_mode("default")
        return static_loss

    result["times"][name].update(_times(timed(replay, TIMED["graphed"], True)))
    if refs is not None:
        got = checked_steps(s, weights, lambda: (replay(), torch.cuda.synchronize())[0], lambda: static_grads)
        result["checks"][name] = judge(got, refs, s.dtype)


def compiled_part(s: Setup, weights: list[torch.Tensor], refs: dict, backend: str, cuda: bool,
                  result: dict) -> None:
    """Compile every decoder layer (``compile_layers``), time the compiling steps, check, time."""
    compile_layers(s.model, backend)
    t0 = time.perf_counter()
    train_step(s)  # compiles forward and backward
    _sync(cuda)
    result["times"]["compiled"] = {"compile_s": round(time.perf_counter() - t0, 2), "backend": backend}
    if cuda:
        result["sync_sites"]["compiled"] = sync_sites(lambda: train_step(s))
    repeats = TIMED["compiled"] if cuda else TIMED_CPU
    result["times"]["compiled"].update(_times(timed(lambda: train_step(s), repeats, cuda)))
    if refs is not None:
        got = checked_steps(s, weights, lambda: train_step(s), lambda: [p.grad for p in s.fingerprint()])
        result["checks"]["compiled"] = judge(got, refs, s.dtype)


def sp_part(out: Path, budget_s: float, backend: str, result: dict) -> None:
    """The SP = 2 layer's capture (``tools/gpu_graph_sp.py``, run as its own command: two ranks on this GPU
    over gloo): its record, with its own verdict, under ``result["sp_layer"]``. Its failure (a capture that
    cannot be made, a stale replay) is reported with its message and does not fail the one-process step's
    verdict: the SP ops read the group's chunks on the host and move the halo through gloo, so the capture is
    not expected to work (docs/gpu.md)."""
    cmd = [sys.executable, str(ROOT / "tools" / "gpu_graph_sp.py"), "--out", str(out), "--budget-s", f"{budget_s:g}",
           "--compile-backend", backend]
    record = out / "sp_graph.json"
    record.unlink(missing_ok=True)  # a record left by an earlier run is not this one's
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=budget_s + SP_GRACE_S)
        if not record.is_file():
            raise RuntimeError(f"tools/gpu_graph_sp.py exited {proc.returncode} without sp_graph.json: "
                               f"{(proc.stdout + proc.stderr)[-800:]}")
        result["sp_layer"] = json.loads(record.read_text())
    except Exception as exc:  # noqa: BLE001
        err = failure(exc)
        result["sp_layer"] = {"ok": False, "failures": {"sp_layer": err},
                              "summary": [f"  FAILED sp_layer: {err['error'][:400]}"]}


def run_graph(out: Path, budget_s: float = GRAPH_BUDGET_S, compile_backend: str | None = None) -> dict:
    """Every part that the device and the budget allow; ``graph.json`` under ``out`` after each."""
    t0 = time.time()
    cuda = torch.cuda.is_available()
    out.mkdir(parents=True, exist_ok=True)
    backend = compile_backend or ("inductor" if cuda else "aot_eager")
    result = {"cuda": cuda, "device": torch.cuda.get_device_name() if cuda else "CPU", "torch": torch.__version__,
              "config": str(CONFIG.relative_to(ROOT)), "skipped": [], "failures": {}, "sync_sites": {}, "times": {},
              "checks": {}, "budget_s": budget_s}

    def write():
        result["wall_s"] = round(time.time() - t0, 1)
        result["ratios"] = ratios(result["times"])
        result["ok"] = not result["failures"] and all(c["ok"] for c in result["checks"].values())
        result["sp_ok"] = result.get("sp_layer", {}).get("ok")  # None: not attempted
        result["summary"] = summary_lines(result)
        (out / "graph.json").write_text(json.dumps(result, indent=1) + "\n")

    if not cuda:
        result["skipped"].append("the CUDA graph (capture, replay, set_sync_debug_mode) and the 0.6B model at 8k in "
                                 "bf16: no CUDA (nothing here is measured on a GPU); ran the eager and compiled steps "
                                 f"of the {CPU_TOY['preset']} preset at {CPU_TOY['seq_len']} tokens in fp32 instead")
        result["skipped"].append(SP_NO_CUDA)
    parts = ["eager", "references", "graphed", "compiled", "compiled+graphed", "sp_layer"] if cuda else \
        ["eager", "references", "compiled"]
    try:
        s = build(cuda)
    except Exception as exc:  # noqa: BLE001  (out of memory, a missing package: said, not raised)
        result["failures"]["build"] = failure(exc)
        write()
        return result
    result["what"] = describe(s, backend)
    write()
    weights = refs = None
    for part in parts:
        left = budget_s - (time.time() - t0)
        if left < NEEDS_S[part]:
            result["skipped"].append(f"{part}: {left:.0f} s of the {budget_s:.0f} s budget left, it needs "
                                     f"{NEEDS_S[part]:.0f}")
            continue
        if part == "sp_layer":  # its own processes (two ranks on this GPU), what the budget leaves them
            sp_part(out, left - 5.0, backend, result)
            print(f"graph stage: {part} done at {time.time() - t0:.0f} s", flush=True)
            write()
            continue
        try:
            if part == "eager":
                eager_part(s, cuda, result)
                weights = [p.detach().clone() for p in s.model.parameters()]  # what the checks restore
            elif weights is None:
                result["skipped"].append(f"{part}: the eager step failed")
            elif part == "references":
                refs = references(s)
                result["references"] = {k: refs[k] for k in ("ref_dtype", "ref_backend", "ref_fallback") if k in refs}
            elif part == "graphed":
                graphed_part(s, weights, refs, result)
            elif part == "compiled":
                compiled_part(s, weights, refs, backend, cuda, result)
            elif "compiled" in result["failures"] or "compiled" not in result["times"]:
                result["skipped"].append(f"{part}: the compiled step did not run")
            else:
                graphed_part(s, weights, refs, result, part)
        except Exception as exc:  # noqa: BLE001  (capture errors, syncs, OOM: recorded, the next part runs)
            result["failures"][part] = failure(exc)
            if cuda:  # the next part starts with the debug mode off and the freed memory given back
                torch.cuda.set_sync_debug_mode("default")
                torch.cuda.empty_cache()
        print(f"graph stage: {part} done at {time.time() - t0:.0f} s", flush=True)
        write()
    write()
    return result


def describe(s: Setup, backend: str) -> dict:
    """What is measured, in words and numbers."""
    T = s.batch["input_ids"].shape[1]
    return {"model": f"{s.model_cfg.num_layers} Qwen3 decoder layers, hidden {s.model_cfg.hidden_size}, "
                     f"vocabulary {s.model_cfg.vocab_size}", "tokens": T, "batch": 1,
            "dtype": str(s.dtype).split(".")[-1],
            "attention": {k: getattr(s.attn_cfg, k) for k in ("bias", "num_samples", "sigma", "backend", "method")},
            "step": "grads to None, forward, mean fp32 token cross-entropy, backward, AdamW "
                    f"(capturable={s.optimizer.defaults['capturable']}, foreach)",
            "compile": f"compile_layers(model, {backend!r}): each decoder layer, fullgraph",
            "checks": f"loss and every layer's q_proj/k_proj gradients at steps {STEPS}, weights restored before "
                      f"each; within {FACTOR:g}x the eager step's error against a higher-precision copy",
            "parameters": sum(p.numel() for p in s.model.parameters())}


def ratios(times: dict) -> dict:
    """Eager's median over the others'."""
    eager = times.get("eager", {}).get("median_ms")
    return {f"eager_over_{name}": eager / t["median_ms"] for name, t in times.items()
            if name != "eager" and eager and t.get("median_ms")}


def summary_lines(result: dict) -> list[str]:
    """The stage's lines of ``summary.txt``."""
    lines = [f"graph stage ({result.get('wall_s')} s, graph.json): {'ok' if result['ok'] else 'FAILED'}"]
    what = result.get("what")
    if what:
        lines.append(f"  {what['model']}, {what['tokens']} tokens, {what['dtype']}, {what['attention']}")
    lines += [f"  SKIPPED {s}" for s in result["skipped"]]
    ref = result.get("references")
    if ref:
        lines.append(f"  references: a {ref['ref_dtype']} copy on the {ref['ref_backend']} backend"
                     + (f" ({ref['ref_fallback']})" if "ref_fallback" in ref else ""))
    for name, t in result["times"].items():
        extra = "".join(f", {k} {t[k]}" for k in ("capture_s", "compile_s", "backend") if k in t)
        ratio = result["ratios"].get(f"eager_over_{name}")
        lines.append(f"  {name:<16} " + (f"{t['median_ms']:10.2f} ms/step" if "median_ms" in t else "not timed")
                     + (f"  (eager / {name} = {ratio:.2f}x)" if ratio else "") + extra)
    for name, check in result["checks"].items():
        masks = check["masks"]
        lines.append(f"  check {name}: {'ok' if check['ok'] else 'FAILED'}; " + "; ".join(
            f"{k}: loss err {v['loss_error']:.3g} (allowed {v['loss_allowed']:.3g}), grad err {v['grad_error']:.3g} "
            f"(allowed {v['grad_allowed']:.3g})" for k, v in check.items() if k.startswith("step "))
                     + f"; {masks['verdict']}"
                     + ("" if masks["conclusive"] else " (INCONCLUSIVE: the references barely differ)"))
    for name, f in result["failures"].items():
        lines.append(f"  FAILED {name}:")
        for c in f["chain"]:
            lines.append(f"    {c['error'][:400]}")
            lines += [f"      at {w}" for w in c["where"][-2:]]
    if "sp_layer" in result:
        lines += result["sp_layer"]["summary"]
    for name, sites in result["sync_sites"].items():
        lines.append(f"  host syncs in one {name} step (seen from Python): {sum(x['calls'] for x in sites)} at "
                     f"{len(sites)} sites")
        lines += [f"    {x['calls']:4d}x {x['where']}" for x in sites[:8]]
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="folder for graph.json")
    p.add_argument("--budget-s", type=float, default=GRAPH_BUDGET_S, help="parts not started by then are skipped")
    p.add_argument("--compile-backend", default=None,
                   help="torch.compile backend of the compiled step (default: inductor on CUDA, aot_eager on CPU)")
    args = p.parse_args(argv)
    result = run_graph(Path(args.out), args.budget_s, args.compile_backend)
    print("\n".join(summary_lines(result)))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
