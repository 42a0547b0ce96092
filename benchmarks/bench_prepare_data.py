"""Tokenizing a corpus before the launch, at scale: throughput against SentencePiece's own limit,
peak memory against corpus size, and a 1 GB corpus prepared and trained on.

    python benchmarks/bench_prepare_data.py                      # throughput, a 50 MB jsonl
    python benchmarks/bench_prepare_data.py --rss --launch --out results/prepare_data

The corpus is the running Python's standard library sources (``write_stdlib_corpus``), its
documents repeated in order until a ``.jsonl`` file holds ``--size-mb`` MB (10^6 bytes), in a
temporary directory removed at the end (``--dir``: where it goes). A BPE tokenizer of
``--vocab-size`` pieces is trained on it first, so every case below only tokenizes.

``throughput`` (always): the package's build, ``prepare_locked`` (what ``launchers/prepare_data.py
--threads N`` calls, caches written, imports not timed), against SentencePiece's own
``encode(list_of_texts, num_threads=N)`` of the same documents (read beforehand, not timed): the
limit. Each case runs in a fresh process pinned to the first N cores (``sched_setaffinity``), at
N = 1 and 2; ``read`` is the reading alone (``iter_documents``, one core), for the profile. The
cases of one repetition run one after another, their order rotated each repetition; the figures
are medians over ``--repeats``. MB/s counts the documents' text (UTF-8), for every case.
Targets: the build at >= 80% of the limit; 2 threads >= 1.8x 1 thread.

``--rss``: peak resident memory (``VmHWM``, a fresh process per case, every core) of the whole
prepare, cache written, of jsonl corpora of ``--rss-sizes-mb`` and of one ``.txt`` file of
``--txt-mb`` MB (the documents on one line joined by ``<|endoftext|>``, read with
``[data].doc_separator``; a 50 MB one too). Target: the largest within 1.2x the 50 MB peak.

``--launch``: a ``--launch-mb`` jsonl corpus: ``launchers/prepare_data.py`` (the whole command)
on every core, then, with a fresh cache directory, a 2-rank first launch (``torchrun
--nproc_per_node 2 launchers/pretrain.py``, CPU, ``configs/debug.toml``, 2 steps, the default
``[parallel].timeout_s``) whose rank 0 must build the cache while rank 1 waits: wall times, exit
status. From these it extrapolates to 10 GB and 100 GB (time on these cores and per core, cache
disk, memory).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_text_stream import SEP, _status_kb  # noqa: E402  (a script beside this one)

DEBUG_CONFIG = ROOT / "configs" / "debug.toml"
THROUGHPUT_CASES = (("read", 1), ("spm", 1), ("prepare", 1), ("spm", 2), ("prepare", 2))


# ----------------------------------------------------------------------------- the corpus

def _stdlib_documents(work: Path) -> list[str]:
    from plsh_dist.data.corpus import write_stdlib_corpus

    files = write_stdlib_corpus(work / "stdlib", val_fraction=0.0)
    with open(files.train, encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f]


def write_corpus(path: Path, docs: list[str], size_mb: float) -> int:
    """``docs`` repeated in order into ``path`` (``.jsonl``: ``{"text": ...}`` per line; ``.txt``:
    one line, joined by ``SEP``) until it holds ``size_mb`` MB; the documents' text in UTF-8 bytes."""
    target, written, text_bytes, i = size_mb * 1_000_000, 0, 0, 0
    txt = path.suffix == ".txt"
    with open(path, "wb") as f:
        while written < target:
            doc = docs[i % len(docs)]
            if txt:  # newlines kept: the separator cuts the documents
                data = (doc + SEP).encode()
            else:
                data = (json.dumps({"text": doc}, ensure_ascii=False) + "\n").encode()
            f.write(data)
            written += len(data)
            text_bytes += len(doc.encode())
            i += 1
    return text_bytes


def _overrides(corpus: Path, tokenizer: Path, cache: Path, vocab_size: int) -> list[str]:
    extra = [f"--data.doc_separator={SEP}"] if corpus.suffix == ".txt" else []
    return [f"--data.train_files=['{corpus}']", f"--data.cache_dir={cache}", f"--tokenizer.model_path={tokenizer}",
            f"--tokenizer.vocab_size={vocab_size}", *extra]


# ----------------------------------------------------------------------------- one case, in its own process

def run_case(kind: str, threads: int, corpus: str, tokenizer: str, cache: str, vocab_size: int) -> dict:
    """One case in this process: seconds, CPU seconds (every thread), peak and before-the-work RSS
    (MiB), tokens. CPU / wall seconds is the cores the case got (the machine is shared)."""
    before = _status_kb("VmRSS")
    if kind == "spm":
        import sentencepiece as spm

        sp = spm.SentencePieceProcessor(model_file=tokenizer)
        with open(corpus, encoding="utf-8") as f:
            texts = [json.loads(line)["text"] for line in f]
        before = _status_kb("VmRSS")
        start, cpu = time.perf_counter(), time.process_time()
        tokens = sum(len(ids) for ids in sp.encode(texts, num_threads=threads))
    elif kind == "read":
        from plsh_dist.data.sources import iter_documents

        import datasets  # noqa: F401  (imported before the clock: iter_documents imports it)
        start, cpu = time.perf_counter(), time.process_time()
        tokens = sum(1 for _ in iter_documents(corpus))  # documents, here
    else:
        from plsh_dist.config import load_config
        from plsh_dist.train.data_wait import prepare_locked

        import datasets  # noqa: F401
        cfg = load_config(str(DEBUG_CONFIG), _overrides(Path(corpus), Path(tokenizer), Path(cache), vocab_size))
        before = _status_kb("VmRSS")
        start, cpu = time.perf_counter(), time.process_time()
        prepared = prepare_locked(cfg.data, cfg.tokenizer, threads=threads, log_reports=False)
        tokens = prepared.train.num_tokens
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    return {"seconds": seconds, "cpu_s": cpu, "peak_mib": _status_kb("VmHWM") / 1024, "before_mib": before / 1024,
            "tokens": tokens}


def _case(kind: str, threads: int, corpus: Path, tokenizer: Path, cache: Path, vocab_size: int,
          cores: list[int] | None) -> dict:
    cmd = [sys.executable, __file__, "--case", kind, str(threads), str(corpus), str(tokenizer), str(cache),
           str(vocab_size)]
    pin = (lambda: os.sched_setaffinity(0, cores)) if cores else None
    try:
        done = subprocess.run(cmd, check=True, capture_output=True, text=True, preexec_fn=pin,
                              env={**os.environ, "HF_DATASETS_OFFLINE": "1", "DS_ACCELERATOR": "cpu"})
    except subprocess.CalledProcessError as exc:
        raise RuntimeError(f"case {kind}/{threads} failed:\n{exc.stderr[-3000:]}") from None
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


# ----------------------------------------------------------------------------- the three studies

def throughput(work: Path, corpus: Path, text_mb: float, tok: Path, vocab: int, repeats: int) -> dict:
    cores = sorted(os.sched_getaffinity(0))
    cases = [c for c in THROUGHPUT_CASES if c[1] <= len(cores)]
    runs: dict[str, list[dict]] = {f"{k}/{n}": [] for k, n in cases}
    for rep in range(repeats):
        order = cases[rep % len(cases):] + cases[:rep % len(cases)]
        for kind, n in order:
            res = _case(kind, n, corpus, tok, work / "cache", vocab, cores[:n])
            res["mb_s"] = text_mb / res["seconds"]
            runs[f"{kind}/{n}"].append(res)
            print(f"  repeat {rep + 1}/{repeats} {kind:7s} {n} core(s): {res['seconds']:6.2f} s "
                  f"{res['mb_s']:6.2f} MB/s  {res['cpu_s'] / res['seconds']:4.2f} cores  "
                  f"peak {res['peak_mib']:5.0f} MiB  load {os.getloadavg()[0]:.1f}", flush=True)
    return {"text_mb": text_mb, "runs": runs, **summarize_throughput(runs)}


def summarize_throughput(runs: dict[str, list[dict]]) -> dict:
    """Medians of MB/s, of MB per CPU second (every thread's; what a case costs whatever cores it
    got) and of the per-repetition ratios: the build over the limit, 2 over 1 thread."""
    med = {name: statistics.median(r["mb_s"] for r in rs) for name, rs in runs.items()}
    per_cpu = {name: statistics.median(r["mb_s"] * r["seconds"] / r["cpu_s"] for r in rs)
               for name, rs in runs.items() if all(r.get("cpu_s") for r in rs)}
    ratios = {}
    for n in (1, 2):
        if f"prepare/{n}" in med:
            # per repetition, then the median: the two ran minutes apart at most
            per_rep = [p["mb_s"] / s["mb_s"] for p, s in zip(runs[f"prepare/{n}"], runs[f"spm/{n}"])]
            ratios[f"prepare_over_limit_{n}"] = statistics.median(per_rep)
            if f"prepare/{n}" in per_cpu and f"spm/{n}" in per_cpu:  # CPU seconds the limit took / the build's
                ratios[f"prepare_over_limit_{n}_per_cpu_s"] = statistics.median(
                    s["cpu_s"] / p["cpu_s"] for p, s in zip(runs[f"prepare/{n}"], runs[f"spm/{n}"]))
    if "prepare/2" in med:
        ratios["prepare_2_over_1"] = statistics.median(
            b["mb_s"] / a["mb_s"] for a, b in zip(runs["prepare/1"], runs["prepare/2"]))
        ratios["spm_2_over_1"] = statistics.median(
            b["mb_s"] / a["mb_s"] for a, b in zip(runs["spm/1"], runs["spm/2"]))
    return {"median_mb_s": med, "median_mb_per_cpu_s": per_cpu, "ratios": ratios}


def rss(work: Path, docs: list[str], tok: Path, vocab: int, sizes: list[int], txt_mb: list[int]) -> list[dict]:
    rows = []
    for suffix, mbs in ((".jsonl", sizes), (".txt", txt_mb)):
        for mb in mbs:
            path = work / f"rss_{mb}mb{suffix}"
            text = write_corpus(path, docs, mb)
            res = _case("prepare", len(os.sched_getaffinity(0)), path, tok, work / "cache", vocab, None)
            path.unlink()
            res.update(format=suffix[1:], size_mb=mb, text_mb=text / 1e6, mb_s=text / 1e6 / res["seconds"])
            rows.append(res)
            print(f"  {suffix[1:]:5s} {mb:5d} MB: peak {res['peak_mib']:6.0f} MiB (before {res['before_mib']:4.0f}), "
                  f"{res['seconds']:6.1f} s, {res['mb_s']:5.2f} MB/s, {res['tokens']} tokens  "
                  f"load {os.getloadavg()[0]:.1f}", flush=True)
    return rows


def launch(work: Path, docs: list[str], tok: Path, vocab: int, size_mb: int) -> dict:
    from plsh_dist.config import load_config

    corpus = work / f"launch_{size_mb}mb.jsonl"
    text = write_corpus(corpus, docs, size_mb)
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "DS_ACCELERATOR": "cpu", "PYTHONUNBUFFERED": "1"}
    out: dict = {"file_mb": corpus.stat().st_size / 1e6, "text_mb": text / 1e6}

    cache = work / "cache_prepare"
    cmd = [sys.executable, str(ROOT / "launchers" / "prepare_data.py"), "--config", str(DEBUG_CONFIG),
           "--threads", str(len(os.sched_getaffinity(0))), *_overrides(corpus, tok, cache, vocab)]
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
    out["prepare"] = {"exit": done.returncode, "seconds": time.perf_counter() - start,
                      "cache_bytes": sum(p.stat().st_size for p in cache.rglob("*") if p.is_file())}
    if done.returncode:
        out["prepare"]["tail"] = (done.stdout + done.stderr)[-2000:]
    (work / "prepare.log").write_text(done.stdout + done.stderr)
    with open(next(cache.rglob("meta.json"))) as f:
        out["prepare"]["tokens"] = json.load(f)["num_tokens"]
    shutil.rmtree(cache)
    print(f"  prepare_data.py: exit {done.returncode}, {out['prepare']['seconds']:.1f} s, "
          f"{out['prepare']['tokens']} tokens, cache {out['prepare']['cache_bytes'] / 1e6:.0f} MB", flush=True)

    cache = work / "cache_launch"
    overrides = [*_overrides(corpus, tok, cache, vocab), "--run.max_steps=2", f"--run.out_dir={work / 'run'}",
                 "--data.micro_batch_size=2"]
    timeout = load_config(str(DEBUG_CONFIG), overrides).parallel.timeout_s
    cmd = [str(Path(sys.executable).with_name("torchrun")), "--nproc_per_node", "2", "--master_port", "29561",
           str(ROOT / "launchers" / "pretrain.py"), "--config", str(DEBUG_CONFIG), *overrides]
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
    log = done.stdout + done.stderr
    (work / "launch.log").write_text(log)
    out["launch"] = {"exit": done.returncode, "seconds": time.perf_counter() - start, "timeout_s": timeout,
                     "built_at_launch": "building token cache" in log, "steps": 2}
    if done.returncode:
        out["launch"]["tail"] = log[-3000:]
    shutil.rmtree(cache, ignore_errors=True)
    print(f"  2-rank first launch: exit {done.returncode}, {out['launch']['seconds']:.1f} s "
          f"(timeout_s {timeout}; cache built at launch: {out['launch']['built_at_launch']})", flush=True)
    corpus.unlink()
    return out


def extrapolate(launch_res: dict, rss_rows: list[dict], cores: int) -> list[dict]:
    """Linear in the text: seconds and cache bytes per text MB from the 1 GB prepare; memory flat."""
    p = launch_res["prepare"]
    s_per_mb = p["seconds"] / launch_res["text_mb"]
    cache_per_mb = p["cache_bytes"] / launch_res["text_mb"]
    peak = max((r["peak_mib"] for r in rss_rows), default=None)
    return [{"text_gb": gb, "hours": s_per_mb * gb * 1000 / 3600, "core_hours": s_per_mb * gb * 1000 * cores / 3600,
             "cache_gb": cache_per_mb * gb * 1000 / 1e9, "peak_mib": peak} for gb in (10, 100)]


# ----------------------------------------------------------------------------- main

def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=float, default=50, help="the throughput corpus (jsonl), MB")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--vocab-size", type=int, default=8192)
    parser.add_argument("--rss", action="store_true", help="peak RSS against corpus size")
    parser.add_argument("--rss-sizes-mb", type=int, nargs="+", default=[50, 500])
    parser.add_argument("--txt-mb", type=int, nargs="+", default=[50, 1000])
    parser.add_argument("--launch", action="store_true", help="a corpus of --launch-mb: prepare_data.py, 2-rank launch")
    parser.add_argument("--launch-mb", type=int, default=1000)
    parser.add_argument("--dir", default=None, help="where the data goes (default: a new temporary directory)")
    parser.add_argument("--out", default=None, help="write results.json here")
    parser.add_argument("--summarize", metavar="RESULTS_JSON", help="print the throughput summary of a saved run")
    parser.add_argument("--case", nargs=6, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.summarize:
        saved = json.loads(Path(args.summarize).read_text())
        summary = summarize_throughput(saved["throughput"]["runs"])
        print(json.dumps(summary, indent=1))
        return summary
    if args.case:
        kind, threads, corpus, tok, cache, vocab = args.case
        print(json.dumps(run_case(kind, int(threads), corpus, tok, cache, int(vocab))))
        return {}

    cores = len(os.sched_getaffinity(0))
    work = Path(tempfile.mkdtemp(prefix="bench_prepare_data_", dir=args.dir))
    result: dict = {"date": datetime.date.today().isoformat(), "cores": cores, "cpu": platform.processor() or
                    platform.machine(), "load_at_start": os.getloadavg(), "args": {k: v for k, v in vars(args).items()
                                                                                    if k != "case"}}
    def save() -> None:  # after each study: a long run that is stopped keeps what it measured
        if args.out:
            Path(args.out).mkdir(parents=True, exist_ok=True)
            (Path(args.out) / "results.json").write_text(json.dumps(result, indent=1) + "\n")

    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
        result["commit"] = commit.stdout.strip() or None
        print(f"{cores} core(s), load {os.getloadavg()[0]:.1f}; data in {work}", flush=True)
        docs = _stdlib_documents(work)
        corpus = work / "throughput.jsonl"
        text = write_corpus(corpus, docs, args.size_mb)
        from plsh_dist.data.tokenizer import train_tokenizer

        start = time.perf_counter()
        tok = train_tokenizer(str(corpus), work / "tok", args.vocab_size).path
        print(f"corpus {corpus.stat().st_size / 1e6:.1f} MB ({text / 1e6:.1f} MB of text), tokenizer "
              f"{args.vocab_size} pieces in {time.perf_counter() - start:.1f} s", flush=True)

        print("throughput (MB of text per second):", flush=True)
        t = result["throughput"] = throughput(work, corpus, text / 1e6, tok, args.vocab_size, args.repeats)
        corpus.unlink()
        for name, v in t["median_mb_s"].items():
            print(f"  median {name:10s} {v:6.2f} MB/s, {t['median_mb_per_cpu_s'].get(name, 0):6.2f} MB per CPU s")
        for name, v in t["ratios"].items():
            print(f"  {name:24s} {v:5.2f}x")
        save()
        if args.rss:
            print("peak RSS of the whole prepare (every core):", flush=True)
            rows = result["rss"] = rss(work, docs, tok, args.vocab_size, args.rss_sizes_mb, args.txt_mb)
            base = {r["format"]: r["peak_mib"] for r in rows if r["size_mb"] == min(args.rss_sizes_mb)}
            for r in rows:
                r["over_smallest_jsonl"] = r["peak_mib"] / base["jsonl"] if "jsonl" in base else None
                print(f"  {r['format']:5s} {r['size_mb']:5d} MB / jsonl {min(args.rss_sizes_mb)} MB: "
                      f"{r['over_smallest_jsonl']:.2f}x")
            save()
        if args.launch:
            print(f"a {args.launch_mb} MB corpus:", flush=True)
            result["launch"] = launch(work, docs, tok, args.vocab_size, args.launch_mb)
            result["extrapolation"] = extrapolate(result["launch"], result.get("rss", []), cores)
            for e in result["extrapolation"]:
                peak = (f"{e['peak_mib']:.0f} MiB (flat)" if e["peak_mib"] is not None else
                        "not measured (add --rss)")
                print(f"  {e['text_gb']:4d} GB of text: {e['hours']:6.1f} h on {cores} cores "
                      f"({e['core_hours']:6.1f} core-hours), cache {e['cache_gb']:6.1f} GB, peak RSS {peak}")
        result["load_at_end"] = os.getloadavg()
        save()
        return result
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
