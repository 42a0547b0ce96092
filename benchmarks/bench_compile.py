"""torch.compile of the models: graph breaks and compile time of one decoder layer per bias, alone and
under sequence parallelism (SP), and CPU training tokens/s with and without compile, alone and at SP = 2
with activation checkpointing.

    python benchmarks/bench_compile.py --out bench_results/compile             # everything (~30 min, 2 cores)
    python benchmarks/bench_compile.py --biases plsh_onepass --backends aot_eager --rounds 1   # quick
    python benchmarks/bench_compile.py --sections sp_layer,sp_training --biases plsh_onepass \
        --backends aot_eager --rounds 1 --steps 4 --skip 1 --batch 2 --seq-len 64           # quick, SP only

Four sections (``--sections``, comma-separated; all by default, in this order), one thread per
process (``--threads``):

1. ``layer``: one decoder layer, one process.
   **Graph breaks**: ``torch._dynamo.explain`` of layer 1 of the tiny Qwen3 (``--batch`` x
   ``--seq-len`` tokens) for every bias the models take.
   **Compile time** of that layer's first forward+backward under ``torch.compile(fullgraph=True)``
   with ``aot_eager`` and with inductor: the first compiled call's time minus an eager call's.
   Each measurement runs in a fresh process (dynamo's and inductor's in-memory caches empty)
   with a private ``TORCHINDUCTOR_CACHE_DIR``: first a new directory (cold), then the same one
   again (warm: inductor's FX graph and AOTAutograd caches on disk, what a second run of the
   same model meets).
2. ``sp_layer``: the same layer under sequence parallelism, ``--sp`` ranks (2: SP = 2), each a
   process on the CPU joined by a gloo group, each on its contiguous chunk of the ``--seq-len``
   tokens (global positions; the attention's halo exchange or all-gather inside its custom op).
   Each measurement is a fresh process that spawns the ranks (so fresh ranks and caches, cold then
   warm as above, the ranks sharing one cache directory); every timed call starts at a barrier.
   The graphs and breaks are the most any rank saw, the times the slowest rank's (a step ends when
   the last halo has arrived); each rank's own are in ``per_rank``.
3. ``training``: ``launchers/pretrain.py`` (DeepSpeed on CPU, one process) on ``--config``
   (configs/debug.toml: tiny preset, PLSH s = 4) with ``[run].compile`` = off and each backend,
   ``--steps`` steps; a run's figure is the median tokens/s of its steps after the first
   ``--skip`` (the compile is paid in the first step). The variants are interleaved (round r
   starts at variant r) and repeated ``--rounds`` times, and each compiled run is compared with
   the eager run of its round: the ratios, not the absolute tokens/s, compare across machines.
   The runs share one inductor cache: round 0's first step compiles cold, the later rounds' warm.
4. ``sp_training``: the same runs with ``--sp`` processes through the ``deepspeed`` launcher
   (``DS_ACCELERATOR=cpu deepspeed --num_gpus 2``: two local ranks), ``[parallel].sp_size = --sp``
   and per-layer activation checkpointing (``[memory].activation_checkpointing_mode =
   --checkpointing``, full by default: the checkpoint inside each compiled layer), interleaved
   rounds and per-round ratios as in 3. Tokens/s counts the step's tokens (batch x seq_len: the
   ranks share each sequence), as the trainer logs them.

``--no-layers`` leaves out 1 and 2, ``--rounds 0`` 3 and 4. ``--allow-breaks`` compiles the layer
without ``fullgraph``, to time a model that breaks (an older commit's: copy the script into its
checkout). The SP sections run ``--sp`` processes at once: on 2 cores, with one thread each, they
use both.

Arguments the script does not know (``--section.key=value``) go to the training runs, after
the script's own (e.g. ``--data.cache_dir=...``). Writes ``compile.json`` and ``table.md``
to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: Every bias the models take, as ``AttentionConfig`` fields (tests/models/test_compile.py's set,
#: the window sized for the default 256 tokens).
BIASES = {
    "none": dict(bias="none"),
    "alibi": dict(bias="alibi"),
    "window": dict(bias="window", window=64),
    "truncated": dict(bias="truncated", num_samples=4),
    "plsh_onepass": dict(bias="plsh", num_samples=4, method="onepass"),
    "plsh_per_sample": dict(bias="plsh", num_samples=4, method="per_sample"),
    "fixed_blocks": dict(bias="fixed_blocks"),
}
BACKENDS = ("aot_eager", "inductor")
#: What ``--sections`` chooses from, in the order they run.
SECTIONS = ("layer", "sp_layer", "training", "sp_training")


# ---------------------------------------------------------------- one layer (run in a subprocess)

def _layer(bias: str, batch: int, seq_len: int, sp: tuple[int, int] | None = None):
    """Layer 1 of the tiny Qwen3 as ``step(fn)`` (forward + backward of ``fn(h)``), its ``f(h)``.
    With ``sp = (rank, world)`` (a process group up): the layer under sequence parallelism over the
    default group, on this rank's chunk of the ``seq_len`` tokens (global positions), and every step
    starts at a barrier (the ranks' halo exchanges tie their times together)."""
    import torch

    from plsh_dist.models import build_model, presets
    from plsh_dist.models.config import AttentionConfig
    from plsh_dist.models.runtime import AttentionRuntime

    torch.manual_seed(0)  # the same weights and input on every rank
    model = build_model(presets["tiny"], AttentionConfig(**BIASES[bias]), AttentionRuntime(run_seed=1))
    decoder = model.get_decoder()
    h = torch.randn(batch, seq_len, model.config.hidden_size, requires_grad=True)  # (B, T, hidden)
    position_ids = torch.arange(seq_len)[None].repeat(batch, 1)
    barrier = None
    if sp is not None:
        import torch.distributed as dist

        from plsh_dist.distributed.sp_chunks import sp_chunk
        from plsh_dist.models import apply_sequence_parallel

        rank, world = sp
        apply_sequence_parallel(model, dist.group.WORLD)
        h = sp_chunk(h.detach(), rank, world).clone().requires_grad_(True)  # (B, T / world, hidden)
        position_ids = sp_chunk(position_ids, rank, world).contiguous()
        barrier = dist.barrier
    cos_sin = decoder.rotary_emb(h, position_ids)
    layer = decoder.layers[1]
    weight = torch.linspace(-1, 1, h.numel()).view_as(h)

    def f(x):
        out = layer(x, attention_mask=None, position_ids=position_ids, position_embeddings=cos_sin)
        return out[0] if isinstance(out, tuple) else out

    def step(fn) -> float:
        model.zero_grad(set_to_none=True)
        h.grad = None
        if barrier is not None:
            barrier()
        t0 = time.perf_counter()
        (fn(h) * weight).sum().backward()
        return time.perf_counter() - t0

    return f, h, step


def measure_layer(bias: str, backend: str, batch: int, seq_len: int, explain: bool, fullgraph: bool = True,
                  sp: tuple[int, int] | None = None) -> dict:
    """In this process: eager and compiled forward+backward seconds of one layer; with ``explain``
    also dynamo's graph and graph-break counts (after the timing, so it warms nothing). With ``sp``
    (``(rank, world)``), this rank's part of the layer under sequence parallelism (every rank calls it)."""
    import torch
    import torch._dynamo
    from torch._dynamo.utils import counters

    f, h, step = _layer(bias, batch, seq_len) if sp is None else _layer(bias, batch, seq_len, sp)
    step(f)  # warm-up: the op's first-call work is not the compile's
    eager_s = min(step(f) for _ in range(2))
    record = {"bias": bias, "backend": backend, "batch": batch, "seq_len": seq_len,
              "threads": torch.get_num_threads(), "fullgraph": fullgraph, "eager_s": eager_s}
    compiled = torch.compile(f, backend=backend, fullgraph=fullgraph)
    try:
        first_s = step(compiled)
        record.update(first_call_s=first_s, compile_s=first_s - eager_s, compiled_s=min(step(compiled)
                                                                                          for _ in range(2)))
    except Exception as exc:  # a graph break under fullgraph, or a backend failure: recorded, not fatal
        record["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    # Did the warm run find its cache? (inductor's FX graph cache, AOTAutograd's cache)
    record["cache_hits"] = {f"{group}.{name}": n for group in ("inductor", "aot_autograd")
                            for name, n in counters[group].items() if "cache_hit" in name or "cache_miss" in name}
    if explain:
        torch._dynamo.reset()
        try:
            explained = torch._dynamo.explain(f)(h)
            record.update(graph_count=explained.graph_count, graph_breaks=explained.graph_break_count,
                          break_reasons=[str(r.reason).splitlines()[0] for r in explained.break_reasons][:5],
                          op_count=explained.op_count)
        except Exception as exc:
            record["explain_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return record


def _env(threads: int, cache_dir: str | None) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads or os.cpu_count()))
    env.setdefault("DS_ACCELERATOR", "cpu")
    env.setdefault("PLSH_PROGRESS", "0")
    # the SP ranks and the launcher's ranks import the package from this checkout
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    if cache_dir is not None:
        env["TORCHINDUCTOR_CACHE_DIR"] = cache_dir
    return env


def _run(cmd: list[str], env: dict, timeout: float) -> subprocess.CompletedProcess:
    """``cmd`` in its own session; past ``timeout`` its whole process group is killed (a launcher's or
    ``mp.spawn``'s ranks with it) and ``subprocess.TimeoutExpired`` raised."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _layer_subprocess(bias: str, backend: str, cache_dir: str, explain: bool, args, sp: int = 1) -> dict:
    """One measurement in a fresh process: ``--one-layer``, or with ``sp`` > 1 ``--one-sp-layer`` (that
    process spawns the ``sp`` ranks)."""
    cmd = [sys.executable, __file__, "--one-sp-layer" if sp > 1 else "--one-layer", bias, "--backends", backend,
           "--batch", str(args.batch), "--seq-len", str(args.seq_len), "--threads", str(args.threads),
           "--timeout", str(args.timeout)] + (["--sp", str(sp)] if sp > 1 else [])
    cmd += (["--explain"] if explain else []) + (["--allow-breaks"] if args.allow_breaks else [])
    try:
        proc = _run(cmd, _env(args.threads, cache_dir), args.timeout)
    except subprocess.TimeoutExpired:
        return {"bias": bias, "backend": backend, "error": f"timed out after {args.timeout} s (--timeout)"}
    if proc.returncode != 0:
        return {"bias": bias, "backend": backend, "error": (proc.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------- one layer under SP (spawned ranks)

def _sp_rank(rank: int, world: int, tmp: str, bias: str, backend: str, batch: int, seq_len: int, explain: bool,
             fullgraph: bool, threads: int, timeout: int) -> None:
    """One SP rank (spawned, gloo over a file rendezvous): :func:`measure_layer` on its chunk, written
    to ``tmp/rank<r>.json`` (a failure as ``{"error": ...}``)."""
    import datetime

    import torch
    import torch.distributed as dist

    if threads:
        torch.set_num_threads(threads)
    dist.init_process_group("gloo", init_method=f"file://{tmp}/rendezvous", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout))
    try:
        record = measure_layer(bias, backend, batch, seq_len, explain, fullgraph=fullgraph, sp=(rank, world))
    except Exception as exc:  # noqa: BLE001  (recorded; the launching process reports it)
        record = {"bias": bias, "backend": backend, "error": f"rank {rank}: {type(exc).__name__}: {exc}"[:500]}
    Path(tmp, f"rank{rank}.json").write_text(json.dumps(record))
    dist.destroy_process_group()
    # leave without the interpreter's teardown (tests/distributed/sp_compile_worker.py: a gloo thread still
    # joinable at exit once aborted a rank that had finished)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def merge_ranks(ranks: list[dict]) -> dict:
    """The SP ranks' records as one: each time the slowest rank's (a step ends when every rank's halo
    has arrived), ``compile_s`` = slowest first call minus slowest eager call; graphs and breaks the
    most any rank saw; every rank's own figures under ``per_rank``."""
    errors = [r["error"] for r in ranks if "error" in r]
    record = {k: v for k, v in ranks[0].items() if k not in ("compile_s", "cache_hits")}
    record.update(sp=len(ranks), per_rank=[{k: r[k] for k in ("eager_s", "first_call_s", "compile_s", "compiled_s",
                                                              "graph_count", "graph_breaks") if k in r}
                                           for r in ranks])
    for key in ("eager_s", "first_call_s", "compiled_s"):
        if all(key in r for r in ranks):
            record[key] = max(r[key] for r in ranks)
    if errors:
        record["error"] = errors[0]
        record.pop("first_call_s", None)
        record.pop("compiled_s", None)
    elif "first_call_s" in record:
        record["compile_s"] = record["first_call_s"] - record["eager_s"]
    for key in ("graph_count", "graph_breaks"):
        if all(key in r for r in ranks):
            record[key] = max(r[key] for r in ranks)
    record["cache_hits"] = ranks[0].get("cache_hits", {})
    return record


def measure_sp_layer(args) -> dict:
    """``--one-sp-layer``: spawn ``--sp`` ranks that each measure their chunk; their merged record."""
    import torch.multiprocessing as mp

    bias, backend = args.one_sp_layer, args.backends[0]
    with tempfile.TemporaryDirectory(prefix="bench_compile_sp_") as tmp:
        try:
            mp.spawn(_sp_rank, nprocs=args.sp, join=True,
                     args=(args.sp, tmp, bias, backend, args.batch, args.seq_len, args.explain,
                           not args.allow_breaks, args.threads, args.timeout))
        except Exception as exc:  # noqa: BLE001  (a rank that died: its error, not the spawn's traceback)
            return {"bias": bias, "backend": backend, "sp": args.sp,
                    "error": f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc) else ''}"}
        missing = [r for r in range(args.sp) if not Path(tmp, f"rank{r}.json").is_file()]
        if missing:
            return {"bias": bias, "backend": backend, "sp": args.sp, "error": f"ranks {missing} wrote no record"}
        return merge_ranks([json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in range(args.sp)])


def layer_records(args, sp: int = 1) -> list[dict]:
    """Per bias: explain, then per backend a cold and a warm compile, each in a fresh process (with
    ``sp`` > 1: a fresh set of ``sp`` ranks)."""
    records = []
    label = f"SP={sp} " if sp > 1 else ""
    for bias in args.biases:
        row = {"bias": bias}
        for i, backend in enumerate(args.backends):
            cache_dir = tempfile.mkdtemp(prefix=f"bench_compile_{bias}_{backend}_")
            try:
                for state in ("cold", "warm"):
                    r = _layer_subprocess(bias, backend, cache_dir, explain=(i == 0 and state == "cold"), args=args,
                                          sp=sp)
                    for key in ("graph_count", "graph_breaks", "break_reasons", "op_count", "explain_error"):
                        if key in r:
                            row[key] = r.pop(key)
                    row[f"{backend}_{state}"] = r
                    shown = f"compile {r['compile_s']:.2f} s" if "compile_s" in r else r.get("error")
                    print(f"  {label}{bias:<16} {backend:<10} {state}: {shown}", flush=True)
            finally:
                shutil.rmtree(cache_dir, ignore_errors=True)
        if "graph_breaks" in row:
            print(f"  {label}{bias:<16} explain: {row['graph_count']} graph(s), {row['graph_breaks']} break(s)",
                  flush=True)
        records.append(row)
    return records


# ---------------------------------------------------------------- training runs

def _launcher(sp: int) -> list[str]:
    """How the training runs start: one process directly; ``sp`` processes through the ``deepspeed``
    launcher on this host (``--num_gpus``: local ranks; on CPU with ``DS_ACCELERATOR=cpu``), on a free port."""
    pretrain = str(ROOT / "launchers" / "pretrain.py")
    if sp == 1:
        return [sys.executable, pretrain]
    from plsh_dist.distributed.ports import free_port

    script = Path(sys.executable).parent / "deepspeed"
    runner = [str(script)] if script.is_file() else [sys.executable, "-m", "deepspeed.launcher.runner"]
    return [*runner, "--num_gpus", str(sp), "--master_port", str(free_port()), pretrain]


def _sp_overrides(args, sp: int) -> list[str]:
    """The SP runs' settings: ``[parallel].sp_size`` and per-layer activation checkpointing."""
    if sp == 1:
        return []
    return [f"--parallel.sp_size={sp}", "--memory.activation_checkpointing=true",
            f"--memory.activation_checkpointing_mode={args.checkpointing}"]


def train_run(variant: str, run_dir: Path, cache_dir: str, args, extra: list[str], sp: int = 1) -> dict:
    """``launchers/pretrain.py`` with ``[run].compile = variant`` (with ``sp`` > 1: ``sp`` ranks, sequence
    parallel, activation checkpointing): tokens/s of each step."""
    cmd = [*_launcher(sp), "--config", args.config,
           f"--run.out_dir={run_dir}", f"--run.compile={variant}", f"--run.max_steps={args.steps}",
           f"--data.seq_len={args.seq_len}", f"--data.micro_batch_size={args.batch}",
           "--checkpoint.every_steps=0", "--checkpoint.resume=never", "--checkpoint.export_safetensors=false",
           "--logging.every_steps=1", "--logging.eval_every=0", "--logging.eval_batches=1",
           "--logging.tensorboard=false", "--logging.progress=false", *_sp_overrides(args, sp), *extra]
    t0 = time.perf_counter()
    try:
        proc = _run(cmd, _env(args.threads, cache_dir), args.timeout)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"training run {variant} (SP = {sp}) timed out after {args.timeout} s (--timeout)")
    wall_s = time.perf_counter() - t0
    if proc.returncode != 0:
        tail = (proc.stderr.strip() or proc.stdout.strip()).splitlines()[-3:]
        raise RuntimeError(f"training run {variant} failed (exit {proc.returncode}): {' | '.join(tail)}")
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    tps = [r["tokens_per_s"] for r in steps if "tokens_per_s" in r]
    measured = tps[args.skip:]
    tokens_per_step = args.seq_len * args.batch
    return {"variant": variant, "tokens_per_s": statistics.median(measured), "step_tokens_per_s": tps,
            "first_step_s": tokens_per_step / tps[0], "run_wall_s": wall_s}


def train_records(args, extra: list[str], out: Path, sp: int = 1) -> list[dict]:
    """``--rounds`` rounds of off + each backend, interleaved; one inductor cache for all of them (the
    ranks of an SP run share it)."""
    variants = ["off", *args.backends]
    label = f"SP={sp} " if sp > 1 else ""
    cache_dir = tempfile.mkdtemp(prefix="bench_compile_train_")
    records = []
    try:
        for rnd in range(args.rounds):
            for j in range(len(variants)):
                variant = variants[(rnd + j) % len(variants)]
                run_dir = Path(tempfile.mkdtemp(prefix=f"run_{variant}_", dir=out))
                try:
                    r = train_run(variant, run_dir, cache_dir, args, extra, sp)
                finally:
                    shutil.rmtree(run_dir, ignore_errors=True)
                r["round"] = rnd
                records.append(r)
                print(f"  {label}round {rnd} {variant:<10} {r['tokens_per_s']:>8.0f} tokens/s "
                      f"(first step {r['first_step_s']:.1f} s)", flush=True)
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)
    return records


def train_summary(records: list[dict], backends: list[str]) -> dict:
    """Per variant: median tokens/s over rounds; per backend: the ratios to the eager run of each round."""
    by = {(r["variant"], r["round"]): r for r in records}
    rounds = sorted({r["round"] for r in records})
    summary = {}
    for variant in ["off", *backends]:
        tps = [by[variant, k]["tokens_per_s"] for k in rounds]
        first = [by[variant, k]["first_step_s"] for k in rounds]
        # round 0 met an empty inductor cache; the later rounds reuse it
        entry = {"tokens_per_s": statistics.median(tps), "first_step_cold_s": first[0],
                 "first_step_warm_s": statistics.median(first[1:]) if len(first) > 1 else None}
        if variant != "off":
            ratios = [by[variant, k]["tokens_per_s"] / by["off", k]["tokens_per_s"] for k in rounds]
            entry.update(ratio=statistics.median(ratios), ratio_min=min(ratios), ratio_max=max(ratios),
                         ratios=ratios)
        summary[variant] = entry
    return summary


# ---------------------------------------------------------------- report

def _seconds(r: dict | None) -> str:
    if r is None:
        return "-"
    return f"{r['compile_s']:.1f}" if "compile_s" in r else "failed"


def _layer_table(rows: list[dict], backends: list[str], caption: str) -> list[str]:
    head = "| bias | graphs | graph breaks | " + " | ".join(f"{b} cold (s) | {b} warm (s)" for b in backends) + " |"
    lines = [caption, "", head, "|" + "---|" * (3 + 2 * len(backends))]
    for row in rows:
        cells = [row["bias"], str(row.get("graph_count", "-")), str(row.get("graph_breaks", "explain failed"))]
        for b in backends:
            cells += [_seconds(row.get(f"{b}_cold")), _seconds(row.get(f"{b}_warm"))]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _train_table(training: dict, caption: str) -> list[str]:
    lines = [caption, "", "| `[run].compile` | tokens/s (median) | x eager (median of rounds) | x eager (range) | "
             "first step, cold cache (s) | first step, warm cache (s) |", "|---|---|---|---|---|---|"]
    for variant, e in training["summary"].items():
        ratio = f"{e['ratio']:.2f}" if "ratio" in e else "1"
        spread = f"{e['ratio_min']:.2f}-{e['ratio_max']:.2f}" if "ratio" in e else "-"
        warm = f"{e['first_step_warm_s']:.1f}" if e["first_step_warm_s"] is not None else "-"
        lines.append(f"| {variant} | {e['tokens_per_s']:.0f} | {ratio} | {spread} | "
                     f"{e['first_step_cold_s']:.1f} | {warm} |")
    return lines


def _train_caption(result: dict, training: dict, what: str) -> str:
    return (f"Training{what}, `{result['config']}` at batch {result['batch']} x {result['seq_len']} tokens, "
            f"{training['steps']} steps (median tokens/s of steps {training['skip'] + 1}-{training['steps']}), "
            f"{training['rounds']} interleaved round(s), {result['threads']} thread(s) per process:")


def markdown(result: dict) -> str:
    backends = result["backends"]
    lines = []
    compiled = (f"compile time = the first compiled forward+backward (`fullgraph={result.get('fullgraph', True)}`) "
                "minus an eager one")
    if result["layers"]:
        lines += _layer_table(result["layers"], backends,
                              f"One decoder layer of the tiny Qwen3, batch {result['batch']} x {result['seq_len']} "
                              f"tokens, fp32, {result['threads']} thread(s): {compiled}.")
    if result.get("sp_layers"):
        sp = result["sp"]
        lines += ([""] if lines else []) + _layer_table(
            result["sp_layers"], backends,
            f"The same layer under sequence parallelism, SP = {sp} ({sp} processes, gloo), each rank on its "
            f"{result['seq_len'] // sp}-token chunk of batch {result['batch']} x {result['seq_len']} tokens, "
            f"{result['threads']} thread(s) per rank: graphs and breaks the most any rank saw; {compiled}, "
            "the slowest rank's of each.")
    if result["training"]:
        lines += ([""] if lines else []) + _train_table(result["training"],
                                                        _train_caption(result, result["training"], ""))
    if result.get("sp_training"):
        t = result["sp_training"]
        lines += ([""] if lines else []) + _train_table(t, _train_caption(
            result, t, f" under SP = {t['sp']} ({t['sp']} processes through the deepspeed launcher, activation "
                       f"checkpointing `{t['checkpointing']}`)"))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)
    p.add_argument("--biases", default=",".join(BIASES), help=f"comma-separated, from {list(BIASES)}")
    p.add_argument("--backends", default=",".join(BACKENDS), help=f"comma-separated, from {list(BACKENDS)}")
    p.add_argument("--batch", type=int, default=4, help="sequences per step (layer and training)")
    p.add_argument("--seq-len", type=int, default=256, help="tokens per sequence (layer and training)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved training rounds (0: no training)")
    p.add_argument("--steps", type=int, default=20, help="training steps per run")
    p.add_argument("--skip", type=int, default=3, help="first steps left out of a run's tokens/s (the compile)")
    p.add_argument("--sections", default=",".join(SECTIONS),
                   help=f"comma-separated, from {list(SECTIONS)} (sp_*: under sequence parallelism, --sp ranks)")
    p.add_argument("--sp", type=int, default=2, help="SP size of the sp_layer and sp_training sections")
    p.add_argument("--checkpointing", default="full", choices=("full", "selective"),
                   help="[memory].activation_checkpointing_mode of the sp_training runs")
    p.add_argument("--no-layers", action="store_true", help="training only (the layer and sp_layer sections off)")
    p.add_argument("--allow-breaks", action="store_true",
                   help="compile the layer without fullgraph (to time a model that breaks, e.g. an older commit's)")
    p.add_argument("--config", default="configs/debug.toml", help="the training runs' config")
    p.add_argument("--threads", type=int, default=1, help="torch threads per process (0: torch's default)")
    p.add_argument("--timeout", type=int, default=900, help="seconds per subprocess")
    p.add_argument("--out", default="bench_results/compile")
    p.add_argument("--one-layer", help=argparse.SUPPRESS)
    p.add_argument("--one-sp-layer", help=argparse.SUPPRESS)
    p.add_argument("--explain", action="store_true", help=argparse.SUPPRESS)
    args, extra = p.parse_known_args(argv)
    args.biases, args.backends = args.biases.split(","), args.backends.split(",")
    args.sections = args.sections.split(",")
    for name, given, known in (("--biases", args.biases, BIASES), ("--backends", args.backends, BACKENDS),
                               ("--sections", args.sections, SECTIONS)):
        if unknown := [x for x in given if x not in known]:
            p.error(f"{name}: unknown {unknown}; choose from {list(known)}")
    if bad := [x for x in extra if not x.startswith("--") or "." not in x.split("=")[0]]:
        p.error(f"unrecognized arguments {bad} (training overrides are --section.key=value)")
    if args.steps <= args.skip:
        p.error(f"--steps ({args.steps}) must exceed --skip ({args.skip})")
    sp_sections = [x for x in args.sections if x.startswith("sp_")]
    if ((sp_sections and not args.one_layer) or args.one_sp_layer) and (args.sp < 2 or args.seq_len % args.sp):
        p.error(f"{sp_sections} need --sp >= 2 dividing --seq-len ({args.seq_len}); got --sp {args.sp}")
    if args.one_sp_layer:
        print(json.dumps(measure_sp_layer(args)))
        return 0
    if args.one_layer:
        import torch

        if args.threads:
            torch.set_num_threads(args.threads)
        print(json.dumps(measure_layer(args.one_layer, args.backends[0], args.batch, args.seq_len, args.explain,
                                        fullgraph=not args.allow_breaks)))
        return 0

    import torch

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {"torch": torch.__version__, "python": platform.python_version(), "cpu_count": os.cpu_count(),
              "processor": platform.processor() or platform.machine(), "threads": args.threads,
              "batch": args.batch, "seq_len": args.seq_len, "backends": args.backends,
              "fullgraph": not args.allow_breaks, "config": args.config, "train_overrides": extra,
              "sections": args.sections, "sp": args.sp, "layers": [], "training": None, "sp_layers": [],
              "sp_training": None}
    sections = [x for x in args.sections if not (args.no_layers and x.endswith("layer"))
                and not (args.rounds == 0 and x.endswith("training"))]
    t0 = time.perf_counter()
    for section in SECTIONS:
        if section not in sections:
            continue
        sp = args.sp if section.startswith("sp_") else 1
        print(f"{section}{f' (SP = {sp})' if sp > 1 else ''}:", flush=True)
        if section.endswith("layer"):
            result["sp_layers" if sp > 1 else "layers"] = layer_records(args, sp)
        else:
            records = train_records(args, extra, out, sp)
            training = {"rounds": args.rounds, "steps": args.steps, "skip": args.skip, "runs": records,
                        "summary": train_summary(records, args.backends)}
            if sp > 1:
                training.update(sp=sp, checkpointing=args.checkpointing, overrides=_sp_overrides(args, sp))
            result["sp_training" if sp > 1 else "training"] = training
    result["wall_s"] = time.perf_counter() - t0
    (out / "compile.json").write_text(json.dumps(result, indent=1) + "\n")
    table = markdown(result)
    (out / "table.md").write_text(table)
    print(table)
    print(f"wrote {out}/compile.json, table.md ({result['wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
