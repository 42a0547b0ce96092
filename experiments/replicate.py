"""CPU-scale replication of the paper's length-extrapolation protocol.

    python experiments/replicate.py --out runs/replication --results results/replication          # the full grid
    python experiments/replicate.py --smoke --out runs/replicate_smoke --results runs/replicate_smoke/results

Every model is trained by ``launchers/pretrain.py`` (the quickstart's code
path, one process) from ``configs/quickstart.toml`` with the same overrides
except the attention mode and the training seed: identical data, step budget
and learning-rate schedule per corpus and seed. Modes (``MODES``):

- ``rope``: RoPE "original" (rope on, no bias); ``nope``: no rope, no bias
  (the causal mask is the only positional signal);
- ``alibi_h`` / ``alibi_c``: exact ALiBi, per-head sigma_h = 1 / slope_h or
  one constant sigma (``--sigma``) on every head;
- ``fixed_h`` / ``fixed_c``: the paper's fixed-blocks baseline (pitch 2 sigma);
- ``plsh_s{8,20,100}_{iid,strat}_{h,c}``: PLSH with s samples, the one-pass
  method, the i.i.d. or stratified sampler (``--stratified-sampler``), per-head
  or constant sigma;
- ``trunc_s{8,20,100}_{h,c}``: exact ALiBi truncated to a window per head at
  PLSH's cost of s samples, ``w_h = ceil((ln s + 0.58) sigma_h)``.

Each model is evaluated in its own trained mode at ``--multiples`` x the train
length (default 1, 2, 4, 8), on the paper's protocol: the last K tokens
(``--last-tokens``, default half the train length) of windows aligned so that
every length scores the same target tokens; PLSH averaged over hash seeds.
Corpora (``--corpora``): ``prose``, the Jargon File from Debian's jargon-text
(``plsh_dist.data.corpus.write_prose_corpus``; install it first), and
``code``, 400 files of the embedded stdlib corpus; each is written once, with
one split for every run (``write_corpora``). ``--seeds`` training seeds per mode;
the report gives mean ± std over them, a confidence interval over windows,
and every mode's perplexity ratio to ``--reference`` (exact ALiBi per head by
default), paired over the same windows and seeds, with intervals over windows
and over training seeds.

Budget (``BUDGETS``; the full grid is 18 modes x 3 seeds x 2 corpora = 108
runs): the tiny Qwen3 (hidden 128, 4 layers, 4 heads), train length 128,
micro-batch 4, 100 steps (51,200 tokens per run), evaluation at 128-1024
tokens on 8 windows of K = 64 scored tokens, 2 hash seeds; two runs at a
time (``--jobs 2``, one thread each). Wall times: experiments/README.md.
``--samples`` chooses the PLSH modes' s values. ``--smoke``: 3 modes x 1 seed x the
code corpus, 4 steps at length 32, for tests (about 80 s).

A run whose ``final/model.safetensors`` exists is not retrained (rerun after
an interruption; ``--retrain`` forces it). ``--reuse REPORT`` takes the runs of
an earlier ``replication.json`` of the same protocol from it instead of
training and evaluating them again (training and evaluation are
deterministic); the lowest reused seed of each mode is trained and evaluated
anyway and must give the report's window losses bit for bit, or the sweep
stops with exit 2. Writes ``<results>/replication.json``,
``replication.md`` and ``replication.png``, and with PLSH modes at two or
more s ``gap.md`` / ``gap.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a clone without installing

from experiments import samplers  # noqa: E402  (a run that names one of its samplers names the module)
from plsh_dist.biases import BIASES  # noqa: E402  (the one vocabulary of modes)


def _trained(bias: str, *overrides: str) -> tuple[list[str], str]:
    """A trained mode of ``bias``: its attention overrides and its evaluation spec name."""
    return [f"--attention.bias={bias}", *overrides], BIASES[bias].spec


def _modes(stratified: str = "stratified", samples: tuple[int, ...] = (8, 20, 100)) -> dict[str, tuple[list[str], str]]:
    """Trained modes: name -> (attention overrides, evaluation mode spec). ``"{sigma}"`` is
    replaced by the constant sigma; ``samples``: the PLSH modes' s values."""
    modes: dict[str, tuple[list[str], str]] = {
        "rope": _trained("none", "--attention.rope=true"),
        "nope": _trained("none", "--attention.rope=false"),
    }
    const = ["--attention.sigma={sigma}"]
    for tag, sig in (("h", []), ("c", const)):
        modes[f"alibi_{tag}"] = _trained("alibi", *sig)
        modes[f"fixed_{tag}"] = _trained("fixed_blocks", *sig)
    for s in samples:
        for sampler, stag in (("iid", "iid"), (stratified, "strat")):
            module = [f"--attention.sampler_module={samplers.__name__}"] if sampler in samplers.NAMES else []
            for tag, sig in (("h", []), ("c", const)):
                modes[f"plsh_s{s}_{stag}_{tag}"] = _trained(
                    "plsh", f"--attention.num_samples={s}", "--attention.method=onepass",
                    f"--attention.sampler={sampler}", *module, *sig)
        for tag, sig in (("h", []), ("c", const)):
            # Exact ALiBi on a window per head at PLSH's cost of s samples: c = ln s + 0.58.
            modes[f"trunc_s{s}_{tag}"] = _trained("truncated", f"--attention.num_samples={s}", *sig)
    return modes


MODES = _modes()

#: Sizes of a budget: the full grid and the smoke test.
BUDGETS = {
    # The paper's grid (results/replication); the trunc_* modes are chosen with --modes.
    "full": dict(modes=[m for m in MODES if not m.startswith("trunc")], seeds="0,1,2", corpora="prose,code",
                 train_len=128, steps=100, batch=4, eval_windows=8, eval_seeds="0,1", jobs=2),
    "smoke": dict(modes=["nope", "alibi_h", "plsh_s8_iid_h"], seeds="0", corpora="code", train_len=32, steps=4,
                  batch=2, eval_windows=2, eval_seeds="0", jobs=1),
}

CORPORA = ("prose", "code")


#: Files of the code corpus: stdlib sources chosen and split with seed 0, whatever the training seed.
CODE_MAX_FILES = 400


def write_corpora(corpora: list[str], prose_dir: Path, code_dir: Path) -> None:
    """Write each corpus once, before any run: the same documents and split for every mode and
    training seed (the stdlib corpus's split would otherwise follow ``[data].seed``, and runs of
    different seeds would rewrite one shared directory under each other)."""
    from plsh_dist.data.corpus import write_prose_corpus, write_stdlib_corpus

    if "prose" in corpora:
        write_prose_corpus(prose_dir)
    if "code" in corpora:
        write_stdlib_corpus(code_dir, val_fraction=0.02, max_files=CODE_MAX_FILES, seed=0)


def corpus_overrides(corpus: str, prose_dir: Path, code_dir: Path | None = None) -> list[str]:
    """Data and tokenizer overrides of one corpus (one tokenizer per corpus, trained by the first run)."""
    tok = f"--tokenizer.model_path=data_cache/tokenizer/replicate_{corpus}_bpe2k.model"
    root = prose_dir if corpus == "prose" else Path(code_dir or "data_cache/replicate_code_corpus")
    return [tok, f"--data.train_files={json.dumps([str(root / 'train.jsonl')])}",
            f"--data.val_files={json.dumps([str(root / 'val.jsonl')])}"]


def train_overrides(args: argparse.Namespace, mode: str, seed: int, corpus: str, out_dir: Path) -> list[str]:
    """``--section.key=value`` overrides of one run (all but the attention and the seed are shared)."""
    attention = [o.replace("{sigma}", str(float(args.sigma))) for o in MODES[mode][0]]
    return [
        f"--run.out_dir={out_dir}", f"--run.name=replicate_{corpus}_{mode}_seed{seed}", f"--run.seed={seed}",
        f"--run.max_steps={args.steps}", "--run.device=cpu",
        f"--data.seq_len={args.train_len}", f"--data.micro_batch_size={args.batch}", f"--data.seed={seed}",
        f"--optim.warmup_steps={max(1, args.steps // 10)}",
        "--parallel.sp_size=1", "--deepspeed.zero_stage=0",
        "--checkpoint.every_steps=0", "--checkpoint.resume=never", "--checkpoint.keep_last=1",
        "--logging.eval_every=0", "--logging.eval_batches=0", "--logging.progress=false",
        "--logging.every_steps=10",
        *corpus_overrides(corpus, Path(args.prose_dir), Path(args.code_dir)), *attention,
    ]


def _settings(args: argparse.Namespace) -> dict:
    """The sweep's arguments for the report, paths relative to the repository (the report is committed)."""
    out = dict(vars(args))
    for key in ("config", "out", "results", "prose_dir", "code_dir"):
        path = Path(out[key]).resolve()
        out[key] = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else out[key]
    out["command"] = "python experiments/replicate.py " + " ".join(sys.argv[1:])
    return out


def _parse(argv: list[str] | None) -> argparse.Namespace:
    global MODES
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="the smoke budget (seconds): see BUDGETS['smoke']")
    p.add_argument("--config", default=str(ROOT / "configs" / "quickstart.toml"), help="base run config")
    p.add_argument("--out", default="runs/replication", help="run directories (checkpoints; not committed)")
    p.add_argument("--results", default="results/replication", help="small JSON + markdown + PNG")
    p.add_argument("--prose-dir", default="data_cache/jargon_corpus", help="where the prose corpus is written")
    p.add_argument("--code-dir", default="data_cache/replicate_code_corpus",
                   help=f"where the code corpus ({CODE_MAX_FILES} stdlib files, split with seed 0) is written")
    p.add_argument("--modes", default=None, help=f"comma-separated subset of {list(MODES)}")
    p.add_argument("--seeds", default=None, help="training seeds (default 0,1,2)")
    p.add_argument("--corpora", default=None, help="prose and/or code")
    p.add_argument("--train-len", type=int, default=None)
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--sigma", type=float, default=32.0, help="the constant sigma of the *_c modes")
    p.add_argument("--stratified-sampler", default="stratified", help="sampler of the *_strat modes")
    p.add_argument("--samples", default="8,20,100", help="s values of the plsh_s{s}_* modes")
    p.add_argument("--multiples", default="1,2,4,8", help="evaluation lengths as multiples of the train length")
    p.add_argument("--last-tokens", type=int, default=None, help="K scored tokens per window (default train_len // 2)")
    p.add_argument("--eval-windows", type=int, default=None, help="validation windows per length")
    p.add_argument("--eval-seeds", default=None, help="hash seeds of the PLSH evaluations")
    p.add_argument("--reference", default="alibi_h", help="mode the paired ratios are taken against")
    p.add_argument("--jobs", type=int, default=None, help="training runs at a time (one thread each)")
    p.add_argument("--retrain", action="store_true")
    p.add_argument("--train-only", action="store_true")
    p.add_argument("--reuse", default=None, metavar="REPORT",
                   help="an earlier replication.json of the same protocol: its runs are not trained or evaluated "
                        "again (one seed per mode is, as a check)")
    args = p.parse_args(argv)
    budget = BUDGETS["smoke" if args.smoke else "full"]
    for key, value in budget.items():
        if getattr(args, key) is None:
            setattr(args, key, value if key != "modes" else ",".join(value))
    try:
        samples = tuple(int(v) for v in args.samples.split(",") if v.strip())
    except ValueError:
        samples = ()
    if not samples or min(samples) < 1:
        p.error(f"--samples: comma-separated ints >= 1, got {args.samples!r}")
    MODES = _modes(args.stratified_sampler, samples)
    args.mode_list = [m.strip() for m in args.modes.split(",") if m.strip()]
    args.corpus_list = [c.strip() for c in args.corpora.split(",") if c.strip()]
    args.seed_list = [int(s) for s in args.seeds.split(",") if s.strip()]
    bad = [m for m in args.mode_list if m not in MODES]
    if bad:
        p.error(f"--modes: unknown {bad}; choose from {list(MODES)}")
    if [c for c in args.corpus_list if c not in CORPORA]:
        p.error(f"--corpora: choose from {list(CORPORA)}")
    if args.reference not in args.mode_list:
        args.reference = None  # no paired ratios without the reference mode
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    out, results_dir = Path(args.out), Path(args.results)
    try:
        write_corpora(args.corpus_list, Path(args.prose_dir), Path(args.code_dir))
    except ValueError as exc:
        print(f"replicate: error: {exc}", file=sys.stderr)
        return 2
    env = {**os.environ, "DS_ACCELERATOR": os.environ.get("DS_ACCELERATOR", "cpu"), "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1", "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    timings: dict[str, float] = {}
    t_all = time.time()

    def train(job: tuple[str, str, int]) -> None:
        corpus, mode, seed = job
        run_dir = out / corpus / mode / f"seed{seed}"
        if (run_dir / "final" / "model.safetensors").is_file() and not args.retrain:
            print(f"[replicate] {corpus}/{mode}/seed{seed}: reusing {run_dir / 'final'}", flush=True)
            return
        cmd = [sys.executable, str(ROOT / "launchers" / "pretrain.py"), "--config", args.config,
               *train_overrides(args, mode, seed, corpus, run_dir)]
        print(f"[replicate] train {corpus}/{mode}/seed{seed}", flush=True)
        t0 = time.time()
        log = run_dir.parent / f"seed{seed}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "w") as f:
            rc = subprocess.run(cmd, env=env, stdout=f, stderr=subprocess.STDOUT).returncode
        if rc != 0:
            raise RuntimeError(f"training {corpus}/{mode}/seed{seed} failed (exit {rc}); see {log}")
        timings[f"train_{corpus}_{mode}_seed{seed}_s"] = round(time.time() - t0, 1)

    jobs = [(c, m, s) for c in args.corpus_list for s in args.seed_list for m in args.mode_list]
    reuse, checks = None, set()
    if args.reuse:
        from experiments.replication_report import reusable_runs

        reuse = json.loads(Path(args.reuse).read_text())
        try:
            reused = reusable_runs(reuse, _settings(args)) & set(jobs)
        except ValueError as exc:
            print(f"replicate: error: {exc}", file=sys.stderr)
            return 2
        # One seed per reused mode is trained and evaluated again: the check that the code still gives the report.
        checks = {min(k for k in reused if k[:2] == cm) for cm in {k[:2] for k in reused}}
        jobs = [j for j in jobs if j not in reused or j in checks]
        print(f"[replicate] reusing {len(reused) - len(checks)} runs of {args.reuse}; checking {sorted(checks)}",
              flush=True)
    # The first run of a corpus trains its tokenizer and builds its token caches: alone, before the others.
    firsts = [next(j for j in jobs if j[0] == c) for c in args.corpus_list]
    for job in firsts:
        train(job)
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        list(pool.map(train, [j for j in jobs if j not in firsts]))
    timings["train_total_s"] = round(time.time() - t_all, 1)
    if args.train_only:
        return 0

    import torch

    from experiments.replication_report import replicate_report

    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    lengths = [round(float(m) * args.train_len) for m in args.multiples.split(",")]
    t0 = time.time()
    try:
        replicate_report(out, args.corpus_list, args.mode_list, args.seed_list,
                         {m: MODES[m][1] for m in args.mode_list}, results_dir, lengths=lengths,
                         train_len=args.train_len, windows=args.eval_windows,
                         hash_seeds=[int(s) for s in args.eval_seeds.split(",")],
                         last_tokens=args.last_tokens or max(1, args.train_len // 2), reference=args.reference,
                         settings=_settings(args), timings=timings, reuse=reuse, checks=checks)
    except ValueError as exc:  # a reused report the code no longer reproduces
        print(f"replicate: error: {exc}", file=sys.stderr)
        return 2
    timings["eval_s"] = round(time.time() - t0, 1)
    print(f"[replicate] total {time.time() - t_all:.0f} s; results in {results_dir}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
