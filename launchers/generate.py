"""Generate text from a checkpoint, under its trained attention or another mode.

    python launchers/generate.py --checkpoint runs/quickstart --prompt "def main(" --max-new-tokens 64
    python launchers/generate.py --checkpoint runs/quickstart/final --prompt-file p.txt --mode plsh:s=16 \
        --temperature 0.8 --top-p 0.95

    # many prompts: one a line (or .jsonl records with "prompt" or "text"), in batches of 8,
    # one jsonl record per prompt, in input order
    python launchers/generate.py --checkpoint runs/quickstart --prompts prompts.txt --batch-size 8 \
        --out completions.jsonl

--checkpoint: a run dir, its final/ export or a checkpoints/step_XXXXXXXX tag.
--mode: one of evaluate.py's modes (listed under --mode below); default the
trained attention. The text goes to stdout, the statistics (tokens/s) to stderr.

--prompts FILE: a .jsonl file holds one object per line whose "prompt" (or
else "text") is the prompt; any other file one prompt per line (empty lines
skipped; a prompt of several lines needs .jsonl). They run in batches of
--batch-size, padded on the left: a prompt's greedy tokens are those it gets
alone. Each prompt's record ({"index", "prompt", "completion", "new_tokens",
"stopped_at_eos"}) goes to --out (default stdout), in input order.

Decoding keeps a KV cache (one forward per new token, the logits of a full
forward); --no-cache re-runs the whole sequence per token instead
(use_cache=False) to compare. The statistics line names the decoder.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path


def read_prompts(path: Path) -> list[str]:
    """The prompts of ``--prompts`` (module doc); ValueError naming the file and line when one is bad."""
    if not path.is_file():
        raise ValueError(f"--prompts {path} does not exist")
    lines = path.read_text(encoding="utf-8").splitlines()
    if path.suffix != ".jsonl":
        prompts = [line for line in lines if line.strip()]
    else:
        prompts = []
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as exc:
                raise ValueError(f"{path}:{number} is not a JSON object ({exc})") from None
            text = record.get("prompt", record.get("text")) if isinstance(record, dict) else None
            if not isinstance(text, str):
                raise ValueError(f"{path}:{number} has no \"prompt\" or \"text\" string field; each line of a "
                                 f'.jsonl prompts file is an object like {{"prompt": "def main("}}')
            prompts.append(text)
    if not prompts:
        raise ValueError(f"--prompts {path} holds no prompt")
    return prompts


def _write_records(prompts: list[str], results, stream) -> None:
    """One jsonl record per prompt, in input order."""
    for i, (prompt, r) in enumerate(zip(prompts, results)):
        stream.write(json.dumps({"index": i, "prompt": prompt, "completion": r.completion,
                                 "new_tokens": r.new_tokens, "stopped_at_eos": r.stopped_at_eos}) + "\n")
    stream.flush()


def batch_summary(results, batch_size: int) -> str:
    """One line: prompts, batches, tokens and tokens/s of a ``generate_batch`` call."""
    batches: dict[int, float] = {}  # a batch's results share its wall time: count it once
    for i, r in enumerate(results):
        batches[i // batch_size] = r.seconds
    seconds, tokens = sum(batches.values()), sum(r.new_tokens for r in results)
    rate = tokens / seconds if seconds > 0 else float("inf")
    return (f"generated {tokens} tokens for {len(results)} prompts in {len(batches)} batches of up to {batch_size} "
            f"in {seconds:.2f} s: {rate:.1f} tokens/s ({results[0].decoder})")


def main(argv: list[str] | None = None) -> int:
    from plsh_dist.eval.mode_specs import spec_usage

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True, help="run dir, its final/ export, or checkpoints/step_XXXXXXXX")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text")
    src.add_argument("--prompt-file", help="file holding the prompt (UTF-8)")
    src.add_argument("--prompts", help="file of prompts: one a line, or .jsonl with a \"prompt\" or \"text\" field")
    p.add_argument("--batch-size", type=int, default=None, help="prompts per batch with --prompts (default 8)")
    p.add_argument("--out", default=None, help="with --prompts: the jsonl file to write (default stdout)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--mode", default=None, help=f"attention mode (default: the trained one), one of: {spec_usage()}")
    p.add_argument("--hash-seed", type=int, default=None, help="seed of the PLSH masks (default: the run's seed)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    p.add_argument("--no-doc-start", action="store_true", help="do not prefix the prompt with EOS (a document start)")
    p.add_argument("--no-stop", action="store_true", help="keep generating past EOS")
    p.add_argument("--no-cache", action="store_true", help="re-run the whole sequence per token (no KV cache)")
    p.add_argument("--max-context", type=int, default=None, help="override the mode's context limit (tokens)")
    p.add_argument("--tokenizer", default=None, help="tokenizer .model (default: the checkpoint's own)")
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    p.add_argument("--sampler-module", default=None,
                   help="module to import first: it registers a sampler that --mode names and the "
                        "checkpoint's [attention].sampler_module does not (e.g. experiments.samplers)")
    args = p.parse_args(argv)

    import torch

    from plsh_dist.checkpoint.loading import load_model
    from plsh_dist.eval.generation import generate, generate_batch
    from plsh_dist.hashing import import_sampler_module

    with contextlib.ExitStack() as stack:  # holds --out open until its records are written
        out = sys.stdout
        try:
            if args.prompts is None and (args.batch_size is not None or args.out is not None):
                raise ValueError("--batch-size and --out go with --prompts FILE (many prompts); --prompt and "
                                 "--prompt-file generate one, to stdout")
            if args.sampler_module is not None:
                import_sampler_module(args.sampler_module, "--sampler-module")
            if args.prompts is not None:
                prompts = read_prompts(Path(args.prompts))
                if args.out is not None:  # opened before any work: a path that cannot be written is refused first
                    try:
                        out = stack.enter_context(open(args.out, "w", encoding="utf-8"))
                    except OSError as exc:
                        raise ValueError(f"--out {args.out} cannot be written ({exc.strerror}); choose another "
                                         f"path") from None
            elif args.prompt_file is not None:
                path = Path(args.prompt_file)
                if not path.is_file():
                    raise ValueError(f"--prompt-file {path} does not exist")
                prompt = path.read_text(encoding="utf-8")
            else:
                prompt = args.prompt
            if args.device.startswith("cuda") and not torch.cuda.is_available():
                raise ValueError(f"--device {args.device} but no CUDA device is visible; use --device cpu")
            ck = load_model(args.checkpoint, tokenizer=args.tokenizer)
            ck.model.to(device=args.device, dtype=getattr(torch, args.dtype))
            settings = dict(max_new_tokens=args.max_new_tokens, mode=args.mode, hash_seed=args.hash_seed,
                            temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed,
                            doc_start=not args.no_doc_start, stop_at_eos=not args.no_stop,
                            max_context=args.max_context, use_cache=not args.no_cache)
            if args.prompts is not None:
                batch_size = 8 if args.batch_size is None else args.batch_size
                results = generate_batch(ck, prompts, batch_size=batch_size, **settings)
                _write_records(prompts, results, out)
                print(batch_summary(results, batch_size), file=sys.stderr)
                return 0
            result = generate(ck, prompt, **settings)
        except ValueError as exc:
            print(f"generate: error: {exc}", file=sys.stderr)
            return 2
    sys.stdout.write(result.text + "\n")
    sys.stdout.flush()
    print(result.summary(), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
