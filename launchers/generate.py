"""Generate text from a checkpoint, under its trained attention or another mode.

    python launchers/generate.py --checkpoint runs/quickstart --prompt "def main(" --max-new-tokens 64
    python launchers/generate.py --checkpoint runs/quickstart/final --prompt-file p.txt --mode plsh:s=16 \
        --temperature 0.8 --top-p 0.95

--checkpoint: a run dir, its final/ export or a checkpoints/step_XXXXXXXX tag.
--mode: one of evaluate.py's modes (listed under --mode below); default the
trained attention. The text goes to stdout, the statistics (tokens/s) to stderr.

Decoding keeps a KV cache (one forward per new token, the logits of a full
forward); --no-cache re-runs the whole sequence per token instead
(use_cache=False) to compare. The statistics line names the decoder.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    from plsh_dist.eval.mode_specs import spec_usage

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True, help="run dir, its final/ export, or checkpoints/step_XXXXXXXX")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text")
    src.add_argument("--prompt-file", help="file holding the prompt (UTF-8)")
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
    from plsh_dist.eval.generation import generate
    from plsh_dist.hashing import import_sampler_module

    try:
        if args.sampler_module is not None:
            import_sampler_module(args.sampler_module, "--sampler-module")
        if args.prompt_file is not None:
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
        result = generate(ck, prompt, max_new_tokens=args.max_new_tokens, mode=args.mode, hash_seed=args.hash_seed,
                          temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed,
                          doc_start=not args.no_doc_start, stop_at_eos=not args.no_stop,
                          max_context=args.max_context, use_cache=not args.no_cache)
    except ValueError as exc:
        print(f"generate: error: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(result.text + "\n")
    sys.stdout.flush()
    print(result.summary(), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
