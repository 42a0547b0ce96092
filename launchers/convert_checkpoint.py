"""Write the self-describing export of any checkpoint (for transformers' from_pretrained).

    python launchers/convert_checkpoint.py --checkpoint runs/quickstart/checkpoints/step_00000200 --out exports/q200
    python launchers/convert_checkpoint.py --checkpoint old_runs/x/final --out exports/x     # an older export

--checkpoint: a DeepSpeed tag (ZeRO 0-3), a run directory (its final/ or newest
tag) or an export written before exports described their attention. --out
(new or empty) gets model.safetensors, config.json (model_type qwen3_plsh ...,
with the attention mode, sigma, s, sampler, method, rope and the hash-seed
rule), config.resolved.json, tokenizer.model + tokenizer_config.json, and the
modules transformers' trust_remote_code runs (plsh_dist/models/remote_code.py). Then:

    from transformers import AutoModelForCausalLM, AutoTokenizer
    model = AutoModelForCausalLM.from_pretrained(OUT, trust_remote_code=True)
    tok = AutoTokenizer.from_pretrained(OUT, trust_remote_code=True)

(or ``import plsh_dist.models`` first and drop trust_remote_code; docs/training.md).

The export keeps the dtype the checkpoint's weights were saved in (bf16 for a
bf16 run; config.json says "dtype"), and the converter checks that it gives the
checkpoint's logits exactly, in that dtype, before it reports success.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True, help="DeepSpeed tag, run dir, or an older export")
    p.add_argument("--out", required=True, help="new (or empty) output directory")
    p.add_argument("--tokenizer", default=None, help="tokenizer .model (default: the checkpoint's own)")
    p.add_argument("--sampler-module", default=None,
                   help="module to import first: it registers the sampler of a checkpoint written before "
                        "[attention].sampler_module existed (e.g. experiments.samplers)")
    args = p.parse_args(argv)

    import torch
    import transformers

    from plsh_dist.checkpoint.export import export_loaded
    from plsh_dist.checkpoint.loading import load_model
    from plsh_dist.hashing import import_sampler_module

    try:
        if args.sampler_module is not None:
            import_sampler_module(args.sampler_module, "--sampler-module")
        ck = load_model(args.checkpoint, tokenizer=args.tokenizer, dtype=None)  # the dtype it was saved in
        out = export_loaded(ck, args.out)
        ref = ck.model
        model = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype="auto")
        ids = torch.arange(min(64, ref.config.vocab_size))[None] % ref.config.vocab_size
        with torch.no_grad():
            same = torch.equal(ref(input_ids=ids).logits, model(input_ids=ids).logits)
        if not same:
            raise ValueError(f"{out}: the written export does not reproduce the checkpoint's logits; please report")
    except ValueError as exc:
        print(f"convert_checkpoint: error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {out} (config.json model_type {model.config.model_type}; logits equal to the checkpoint's)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
