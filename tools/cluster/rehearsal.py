"""The rehearsal: a shipped config's real model trained across the two namespace hosts, with its fault cases.

One rank per host (DeepSpeed's hostfile runner over pdsh/ssh), so the run's
one SP = 2 group spans the hosts. Everything else of the config stays; what
must change on CPU is overridden (``train_overrides``): device, SP = 2,
ZeRO-3, activation checkpointing, the chunked loss over two chunks per rank,
the sequence length, one sequence per step, a few steps, and the logging
that lets every step be compared.

Phases, in order, each timed and bounded (a phase past its bound is killed
and ends the rehearsal; the hosts' take-down kills whatever it left):

1. ``prepare data``: corpus, tokenizer and token caches, once, before the
   ranks need them (one process on the machine);
2. ``hosts up``: node-0 and node-1 with sshd (``tools.cluster.ssh.ssh_hosts``);
3. ``reference``: the uninterrupted run of ``steps`` steps; the ranks' peak
   memory is sampled from outside (``tools.cluster.rank_memory``);
4. ``killed``: the same run with a checkpoint after step ``steps - 1`` and
   node-1's rank SIGKILLed inside step ``steps`` (``PLSH_FAULT=kill:1:S:in_step``):
   the job must end non-zero, no training process may be left on either host,
   the checkpoint must be complete (``latest`` names it, its manifest verifies);
5. ``resumed``: relaunched with ``--checkpoint.resume=auto``: it must start from
   that checkpoint and log every step's loss and grad norm equal, bit for bit,
   to the reference's; it ends with the export gathered from ZeRO-3 (``final/``);
6. ``export``: ``launchers/convert_checkpoint.py`` on the last ZeRO-3 tag (its
   shards gathered by ``plsh_dist.checkpoint.zero3_weights``): transformers'
   ``from_pretrained`` of the written export must give the checkpoint's logits
   exactly (fp32, tolerance 0: the converter's own check), and its tensors must
   equal those the training's live gather wrote to ``final/``;
7. ``evaluate``: ``launchers/evaluate.py`` on the export at the training length
   and at twice it, the trained attention, the checkpoint's validation split.

Beside them: the planner's per-rank peak and step FLOPs (``plsh_dist.plan``)
and the measured peak, step times, checkpoint size and save/load times (the
trainer's own ``checkpoint: ... saved in`` and ``loaded in`` lines).
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import tomllib

from tests.train.launcher_runs import ROOT, Finished, Launch, deepspeed_cmd, launcher_env
from tools.cluster.deepspeed_hostfile import RANK_ENV, write_deepspeed_env, write_hostfile
from tools.cluster.exit_reason import exit_reason, kernel_oom_kills
from tools.cluster.hosts import namespaces_refused
from tools.cluster.rank_memory import RankMemory
from tools.cluster.ssh import ssh_hosts, ssh_unavailable

__all__ = ["SP", "REAL_CONFIG", "TINY_CONFIG", "Settings", "Refused", "train_overrides", "preflight", "rehearse"]

SP = 2  # one rank per host
REAL_CONFIG = ROOT / "configs" / "qwen3_0.6b_8k_plsh_s10.toml"
# glibc keeps freed blocks under its dynamic mmap threshold (which grows to 32 MiB) in the heap, so a
# rank's resident set can grow past its live tensors; a fixed 1 MiB threshold maps each tensor of 1 MiB or
# more on its own and unmaps it when freed. The 0.6B run on results/cluster/rehearsal.md ran with it; its
# effect on the resident peak was not measured apart.
REHEARSAL_ENV = {"MALLOC_MMAP_THRESHOLD_": str(1 << 20)}
# A rank's resident high-water mark over the planner's peak of live tensors: the interpreter, the
# libraries, DeepSpeed's buffers and the allocator's slack. Measured in the 0.6B rehearsal
# (results/cluster/rehearsal.md: 10.37 GiB VmHWM per rank against 7.20 GiB planned). The first run,
# let through on the live peak alone, was killed by the kernel's out-of-memory killer.
RESIDENT_OVER_LIVE = 1.44
TINY_CONFIG = ROOT / "configs" / "debug.toml"
PORT = 29500  # inside node-0's own network namespace: nothing else listens there
_SAVED = re.compile(r"checkpoint: (\S+) saved in ([0-9.]+) s \(([0-9.]+) MiB\)")
_LOADED = re.compile(r"resumed from (\S+), loaded in ([0-9.]+) s")
# What the phases keep on disk, in bytes per parameter: three ZeRO-3 checkpoints (reference, the one
# before the kill, the resumed run's last; fp32 partitions + AdamW moments + the module's ZeRO-3
# placeholders: ~16 B) and two fp32 exports (final/, the converted one: 4 B).
_DISK_BYTES_PER_PARAM = 3 * 16 + 2 * 4


class Refused(RuntimeError):
    """The rehearsal cannot start here; the message names the missing capability and the fix."""


class PhaseTimeout(RuntimeError):
    """A phase ran past its bound; its processes were killed."""


@dataclass(frozen=True)
class Settings:
    """What to rehearse and the bounds of its phases."""

    config: Path
    seq_len: int
    out: Path
    steps: int = 3
    prepare_timeout_s: float = 3600.0
    """Bound of the data preparation (the tokenizer's training on the corpus, the token caches)."""
    startup_timeout_s: float = 900.0
    """Bound of everything in a phase but its steps: start-up, model build, checkpoint, export, validation."""
    step_timeout_s: float = 1800.0
    """Bound of one optimizer step (and of one evaluation window)."""
    collective_timeout_s: int = 600
    """[parallel].timeout_s: how long a rank waits for a peer in a collective."""
    eval_windows: int = 2
    tiny: bool = False

    def train_timeout_s(self) -> float:
        return self.startup_timeout_s + (self.steps + 1) * self.step_timeout_s

    def eval_timeout_s(self) -> float:
        return self.startup_timeout_s + 2 * self.eval_windows * self.step_timeout_s


def _schedule_end(config: Path) -> int:
    """The step the config's learning-rate decay ends at ([optim].decay_end, else [run].max_steps)."""
    table = tomllib.loads(Path(config).read_text())
    return table.get("optim", {}).get("decay_end") or table.get("run", {}).get("max_steps", 100)


def train_overrides(s: Settings, out_dir: Path, *, every_steps: int, resume: str, export: bool) -> list[str]:
    """The CPU changes to the config (module doc), for a run writing to ``out_dir``. Its few steps
    are the first of the config's own schedule (``decay_end`` its end: a run shorter than its
    warmup is refused otherwise)."""
    per_rank = s.seq_len // SP
    return [
        "--run.device=cpu", f"--run.out_dir={out_dir}", f"--run.max_steps={s.steps}",
        f"--optim.decay_end={_schedule_end(s.config)}",
        f"--parallel.sp_size={SP}", f"--parallel.timeout_s={s.collective_timeout_s}",
        "--deepspeed.zero_stage=3", "--deepspeed.precision=fp32",
        "--memory.activation_checkpointing=true", f"--memory.loss_chunk_tokens={max(1, per_rank // 2)}",
        f"--data.seq_len={s.seq_len}", "--data.micro_batch_size=1", "--optim.grad_accum_steps=1",
        f"--checkpoint.every_steps={every_steps}", "--checkpoint.keep_last=0", f"--checkpoint.resume={resume}",
        f"--checkpoint.export_safetensors={'true' if export else 'false'}",
        "--logging.every_steps=1", "--logging.eval_every=0", "--logging.eval_batches=1",
        "--logging.tensorboard=false", "--logging.progress=false",
    ]


def preflight(s: Settings) -> dict[str, Any]:
    """Everything checked before any work: flags, config, hosts' capabilities, memory. Raises ``Refused``."""
    if s.steps < 2:
        raise Refused(f"--steps {s.steps}: at least 2 (a checkpoint after step steps-1, the kill inside step steps)")
    if s.out.exists() and any(s.out.iterdir()):
        raise Refused(f"--out {s.out} exists and is not empty; remove it or give a new directory")
    reason = namespaces_refused() or ssh_unavailable()
    if reason:
        raise Refused(f"the two hosts cannot be made here: {reason}")

    from plsh_dist.config import load_config
    from plsh_dist.plan import plan_run
    from plsh_dist.plan.machine import machine_memory, per_rank_budget

    try:
        cfg = load_config(str(s.config), train_overrides(s, s.out / "reference", every_steps=0, resume="never",
                                                         export=False))
        plan = plan_run(cfg, world_size=SP, device="cpu")
    except ValueError as exc:
        raise Refused(f"config error ({s.config}, --seq-len {s.seq_len}): {exc}") from None
    need = int(1.2 * _DISK_BYTES_PER_PARAM * plan.shapes.params)
    existing = next(p for p in (s.out, *s.out.parents) if p.exists())
    free = shutil.disk_usage(existing).free
    if free < need:
        raise Refused(f"not enough disk under {existing}: the checkpoints and exports take about "
                      f"{need / 2**30:.1f} GiB and {free / 2**30:.1f} GiB are free; free space or give another --out")
    memory = machine_memory()
    budget = per_rank_budget(memory.available, SP)  # both hosts' ranks share this machine
    resident = RESIDENT_OVER_LIVE * plan.memory.peak  # a measured high-water mark: no further headroom
    if resident > budget:
        raise Refused(f"not enough memory: each rank needs about {resident / 2**30:.2f} GiB resident (the planner's "
                      f"live peak, {plan.memory.peak / 2**30:.2f} GiB, x {RESIDENT_OVER_LIVE}) and {SP} ranks share "
                      f"this machine's {memory.available / 2**30:.2f} GiB available ({memory.source}); free memory "
                      f"or give a shorter --seq-len")
    m = cfg.model
    return {
        "model": {"family": m.family, "layers": m.num_layers, "hidden": m.hidden_size, "heads": m.num_heads,
                  "kv_heads": m.num_kv_heads, "head_dim": m.head_dim, "vocab": m.vocab_size,
                  "parameters": plan.shapes.params},
        "attention": cfg.attention.to_dict(),
        "plan": {"peak_bytes_per_rank": plan.memory.peak, "peak_at": plan.memory.peak_at,
                 "step_flops": plan.flops.total, "step_flops_per_rank": plan.flops.per_rank,
                 "attention_flops": plan.flops.attention},
        "machine": {"available_bytes": memory.available, "total_bytes": memory.total},
        "trained_mode": _mode_spec(cfg.attention),
    }


def _mode_spec(attention) -> str:
    """``launchers/evaluate.py``'s spec of the trained attention (options not given keep the trained ones)."""
    from plsh_dist.biases import bias_class

    spec = bias_class(attention.bias).spec
    return f"{spec}:{attention.window}" if attention.bias == "window" else spec


@dataclass
class Rehearsal:
    """The record the page is written from (``report`` is the JSON)."""

    settings: Settings
    command: str
    report: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        s = self.settings
        config = s.config.resolve()
        self.report.update(command=self.command, tiny=s.tiny,
                           config=str(config.relative_to(ROOT)) if config.is_relative_to(ROOT) else str(config),
                           seq_len=s.seq_len, steps=s.steps, sp_size=SP, phases=[], checks=[], ok=False,
                           overrides=train_overrides(s, Path("OUT"), every_steps=0, resume="never", export=False))

    def phase(self, name: str, fn: Callable[[], str]) -> None:
        """Run one phase, timed; its detail line (or its failure) is recorded. Raises what ``fn`` raises."""
        t0 = time.time()
        entry = {"name": name, "ok": False, "detail": ""}
        self.report["phases"].append(entry)
        try:
            entry["detail"] = fn()
            entry["ok"] = True
        except Exception as exc:
            entry["detail"] = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            entry["wall_s"] = round(time.time() - t0, 2)

    def check(self, name: str, ok: bool, detail: str) -> None:
        self.report["checks"].append({"name": name, "ok": bool(ok), "detail": detail})


def _launch(host, cmd: list[str], log_dir: Path, name: str, timeout_s: float, **env: str) -> Finished:
    """``cmd`` run inside ``host`` from the repository root, killed at ``timeout_s``."""
    try:
        return Launch(host.command(cmd, cwd=ROOT), launcher_env(**env), log_dir, name).wait(timeout_s)
    except AssertionError as exc:  # Launch's timeout: it killed the launcher's process group
        raise PhaseTimeout(str(exc).splitlines()[0]) from None


def _metrics(out_dir: Path) -> dict[int, dict]:
    path = out_dir / "metrics.jsonl"
    records = [json.loads(x) for x in path.read_text().splitlines()] if path.is_file() else []
    return {r["step"]: r for r in records if "loss" in r}


def _losses(out_dir: Path) -> dict[int, tuple[float, float]]:
    return {step: (r["loss"], r["grad_norm"]) for step, r in _metrics(out_dir).items()}


def _saves(text: str) -> list[dict]:
    return [{"tag": Path(t).name, "save_s": float(sec), "size_mib": float(mib)} for t, sec, mib in _SAVED.findall(text)]


def rehearse(s: Settings, command: str) -> Rehearsal:
    """Run every phase (module doc); stops at the first phase that fails or times out. The record says
    which phases ran, what each check found, and ``report["ok"]``. Refusals come from ``preflight``."""
    r = Rehearsal(s, command)
    r.report.update(preflight(s))
    s.out.mkdir(parents=True, exist_ok=True)
    logs = s.out / "logs"
    try:
        _run_phases(r, logs)
    except Exception as exc:  # noqa: BLE001 - whatever stopped it, the record of what ran is written
        r.report["stopped"] = f"{type(exc).__name__}: {exc}"
    r.report["ok"] = (not r.report.get("stopped") and all(c["ok"] for c in r.report["checks"])
                      and all(p["ok"] for p in r.report["phases"]))
    return r


def _run_phases(r: Rehearsal, logs: Path) -> None:
    s = r.settings
    ref_dir, cut_dir = s.out / "reference", s.out / "killed_then_resumed"
    export_dir, eval_dir = s.out / "export", s.out / "evaluation"
    kill_step, ckpt_step = s.steps, s.steps - 1
    rep = r.report

    def prepare() -> str:
        code = ("import sys; from plsh_dist.config import load_config; from plsh_dist.data import prepare_data; "
                "cfg = load_config(sys.argv[1], sys.argv[2:]); prepare_data(cfg.data, cfg.tokenizer)")
        args = train_overrides(s, ref_dir, every_steps=0, resume="never", export=False)
        try:
            res = Launch([sys.executable, "-c", code, str(s.config), *args], launcher_env(), logs,
                         "prepare_data").wait(s.prepare_timeout_s)
        except AssertionError as exc:
            raise PhaseTimeout(str(exc).splitlines()[0]) from None
        if res.returncode != 0:
            raise RuntimeError(f"data preparation exited {res.returncode}: {res.stderr[-1500:]}")
        return "corpus, tokenizer and token caches ready"

    r.phase("prepare data", prepare)
    holder: dict[str, Any] = {}

    def up() -> str:
        holder["ctx"] = ssh_hosts(2, s.out / "cluster")
        holder["hosts"] = holder["ctx"].__enter__()
        return f"{', '.join(h.name for h in holder['hosts'])} up, ssh between them working"

    r.phase("hosts up", up)
    hosts = holder["hosts"]
    try:
        hostfile = write_hostfile(s.out / "cluster" / "hostfile", hosts.names, slots=1)
        env_file = s.out / "cluster" / "deepspeed_env"

        def train(name: str, out_dir: Path, port: int, **kw) -> Finished:
            fault = kw.pop("fault", None)
            extra = {"PLSH_FAULT": fault} if fault else {}
            write_deepspeed_env(env_file, {**RANK_ENV, **REHEARSAL_ENV, **extra})
            cmd = deepspeed_cmd(0, s.config, train_overrides(s, out_dir, **kw), hostfile=hostfile, port=port)
            rep.setdefault("commands", {})[name] = " ".join(str(c) for c in cmd)
            oom_before = kernel_oom_kills()
            res = _launch(hosts[0], cmd, logs, name, s.train_timeout_s(), DS_ENV_FILE=str(env_file), **extra)
            if res.returncode != 0:
                rep.setdefault("exit_reasons", {})[name] = exit_reason(res.returncode, res.stdout, oom_before,
                                                                       kernel_oom_kills())
            return res

        def reference() -> str:
            with RankMemory([(h.name, h.pid) for h in hosts]) as mem:
                res = train("reference", ref_dir, PORT, every_steps=0, resume="never", export=False)
            if res.returncode != 0:
                raise RuntimeError(f"the reference run ended: {rep['exit_reasons']['reference']} (log: {logs}/reference.out)")
            got = _losses(ref_dir)
            if sorted(got) != list(range(1, s.steps + 1)):
                raise RuntimeError(f"the reference run logged steps {sorted(got)}, expected 1..{s.steps}")
            rep["reference"] = {"losses": {k: v[0] for k, v in got.items()},
                                "grad_norms": {k: v[1] for k, v in got.items()}, "wall_s": round(res.wall_s, 1),
                                "saves": _saves(res.stdout)}
            steps = _metrics(ref_dir)
            rep["measured"] = {"peak_rss_bytes": mem.peaks(),
                               "rank0_max_rss_mib": max(x["memory_mb"] for x in steps.values()),
                               "step_s": {k: s.seq_len / x["tokens_per_s"] for k, x in steps.items()}}
            return f"{s.steps} steps, exit 0, losses {[round(v[0], 4) for v in got.values()]}"

        r.phase("reference", reference)

        def killed() -> str:
            res = train("killed", cut_dir, PORT + 1, every_steps=ckpt_step, resume="never", export=False,
                        fault=f"kill:1:{kill_step}:in_step")
            r.check("the killed job ends (non-zero exit, within its bound)", res.returncode != 0,
                    f"exit {res.returncode} after {res.wall_s:.0f} s (bound {s.train_timeout_s():.0f} s)")
            left = {h.name: [line for line in h.run(["ps", "-eo", "args="]).stdout.splitlines()
                             if "pretrain.py" in line] for h in hosts}
            r.check("no training process left on either host", not any(left.values()), json.dumps(left))
            _check_checkpoint(r, cut_dir, ckpt_step, kill_step)
            logged = _losses(cut_dir)
            want = {k: v for k, v in _losses(ref_dir).items() if k <= ckpt_step}
            r.check(f"steps 1-{ckpt_step} before the kill equal the reference's", logged == want,
                    f"logged {logged}")
            rep["killed"] = {"exit": res.returncode, "wall_s": round(res.wall_s, 1), "saves": _saves(res.stdout)}
            return f"node-1's rank SIGKILLed in step {kill_step}: exit {res.returncode} after {res.wall_s:.0f} s"

        r.phase("killed", killed)

        def resumed() -> str:
            res = train("resumed", cut_dir, PORT + 2, every_steps=ckpt_step, resume="auto", export=True)
            if res.returncode != 0:
                raise RuntimeError(f"the resumed run ended: {rep['exit_reasons']['resumed']} (log: {logs}/resumed.out)")
            loaded = _LOADED.search(res.stdout)
            r.check(f"resumed from step_{ckpt_step:08d}", bool(loaded) and loaded.group(1).endswith(
                f"step_{ckpt_step:08d}"), loaded.group(0) if loaded else "no 'resumed from' line")
            got, ref = _losses(cut_dir), _losses(ref_dir)
            r.check("resumed losses and grad norms equal the uninterrupted run's, bit for bit", got == ref,
                    f"resumed {got} reference {ref}")
            rep["resumed"] = {"wall_s": round(res.wall_s, 1), "load_s": float(loaded.group(2)) if loaded else None,
                              "losses": {k: v[0] for k, v in got.items()}, "saves": _saves(res.stdout)}
            replayed = f"step {s.steps}" if ckpt_step + 1 == s.steps else f"steps {ckpt_step + 1}-{s.steps}"
            return f"{replayed} trained again from the checkpoint; export gathered from ZeRO-3 into final/"

        r.phase("resumed", resumed)

        def export() -> str:
            tag = cut_dir / "checkpoints" / f"step_{s.steps:08d}"
            cmd = [sys.executable, "launchers/convert_checkpoint.py", "--checkpoint", str(tag), "--out",
                   str(export_dir)]
            rep.setdefault("commands", {})["export"] = " ".join(cmd)
            res = _launch(hosts[0], cmd, logs, "export", s.startup_timeout_s, OMP_NUM_THREADS="2")
            said = [line for line in (res.stdout if res.returncode == 0 else res.stderr).splitlines() if line.strip()]
            r.check("export of the ZeRO-3 tag: from_pretrained logits equal the checkpoint's (fp32, tolerance 0)",
                    res.returncode == 0 and "logits equal to the checkpoint's" in res.stdout,
                    f"exit {res.returncode}: {said[-1] if said else 'no output'}")
            same, detail = _same_tensors(export_dir / "model.safetensors", cut_dir / "final" / "model.safetensors")
            r.check("the export's tensors equal the training's live ZeRO-3 gather (final/)", same, detail)
            rep["export"] = {"wall_s": round(res.wall_s, 1), "size_bytes": _size(export_dir)}
            return f"{export_dir.name}/ written in {res.wall_s:.0f} s; {detail}"

        r.phase("export", export)

        def evaluate() -> str:
            lengths = f"{s.seq_len},{2 * s.seq_len}"
            cmd = [sys.executable, "launchers/evaluate.py", "--checkpoint", str(export_dir), "--lengths", lengths,
                   "--modes", rep["trained_mode"], "--seeds", "0", "--max-windows", str(s.eval_windows),
                   "--no-progress", "--out", str(eval_dir)]
            rep.setdefault("commands", {})["evaluate"] = " ".join(cmd)
            res = _launch(hosts[0], cmd, logs, "evaluate", s.eval_timeout_s(), OMP_NUM_THREADS="2")
            if res.returncode != 0:
                raise RuntimeError(f"evaluate exited {res.returncode}: {res.stderr[-1500:]}")
            rows = json.loads((eval_dir / "results.json").read_text())["rows"]
            rep["evaluation"] = [{k: row[k] for k in ("mode", "length", "scoring", "windows", "loss_mean",
                                                      "perplexity_mean")} for row in rows]
            at2x = [row for row in rows if row["length"] == 2 * s.seq_len]
            r.check(f"evaluation at 2x the training length ({2 * s.seq_len} tokens) is finite",
                    bool(at2x) and all(row["loss_mean"] == row["loss_mean"] for row in at2x),
                    "; ".join(f"L={row['length']} ppl {row['perplexity_mean']:.3f}" for row in rows))
            return f"lengths {lengths}, {res.wall_s:.0f} s"

        r.phase("evaluate", evaluate)
    finally:
        holder["ctx"].__exit__(None, None, None)


def _check_checkpoint(r: Rehearsal, out_dir: Path, step: int, kill_step: int) -> None:
    """The checkpoint written before the kill is complete and the one the kill interrupted is not there."""
    from plsh_dist.checkpoint.manifest import verify_manifest

    root = out_dir / "checkpoints"
    tag = f"step_{step:08d}"
    latest = (root / "latest").read_text().strip() if (root / "latest").is_file() else None
    problems = verify_manifest(root / tag) if (root / tag).is_dir() else [f"{root / tag}: missing"]
    r.check(f"checkpoint {tag} survived the kill (latest names it, its manifest verifies)",
            latest == tag and not problems, f"latest={latest}; {'; '.join(problems) or 'manifest ok'}")
    r.check(f"no checkpoint of the killed step {kill_step}", not (root / f"step_{kill_step:08d}").exists(),
            ", ".join(sorted(p.name for p in root.iterdir())) if root.is_dir() else "no checkpoints/")
    r.report["checkpoint"] = {"tag": tag, "size_bytes": _size(root / tag)}


def _size(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file()) if directory.is_dir() else 0


def _same_tensors(a: Path, b: Path) -> tuple[bool, str]:
    """Every tensor of two safetensors files equal (same names, shapes, dtypes, values)."""
    from safetensors.torch import load_file

    if not (a.is_file() and b.is_file()):
        return False, f"missing: {[str(p) for p in (a, b) if not p.is_file()]}"
    x, y = load_file(str(a)), load_file(str(b))
    if sorted(x) != sorted(y):
        return False, f"different tensor names: {sorted(set(x) ^ set(y))[:10]}"
    unlike = [k for k in x if (x[k].shape, x[k].dtype) != (y[k].shape, y[k].dtype)]
    if unlike:
        return False, f"different shapes or dtypes: {unlike[:10]}"
    worst = max((x[k].double() - y[k].double()).abs().max().item() for k in x)
    return worst == 0.0, f"{len(x)} tensors, largest absolute difference {worst:g}"
