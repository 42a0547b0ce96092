"""An export's ``README.md``: the Hub's model card (a YAML metadata block, then Markdown), written
with every export so the directory can be published as it is (``huggingface_hub.upload_folder`` /
``push_to_hub``).

It states what a user of the checkpoint needs and cannot see in the weights: the attention mode
and its parameters (the model is that mode: another one runs the weights as another model), the
architecture, the training run (steps, tokens seen, optimizer, sequence length), the evaluation
figures the run produced (its final validation), and how to load it with and without plsh_dist.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from plsh_dist.config.schema import RunConfig


def _yaml_scalar(value: Any) -> str:
    """A YAML scalar that parses back to ``value`` (JSON strings are YAML strings)."""
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(str(value))


def _table(rows: dict[str, Any]) -> str:
    lines = ["| field | value |", "|---|---|"]
    lines += [f"| `{k}` | `{json.dumps(v)}` |" for k, v in rows.items()]
    return "\n".join(lines)


def model_card(cfg: RunConfig, model_config, training: dict | None = None) -> str:
    """The card of an export of a run of ``cfg`` whose transformers config is ``model_config``.

    ``training``: what the run did, when the export is written at its end (``export_final``):
    ``steps``, ``tokens_seen`` and ``evaluation`` (``{"val_loss": ..., "val_ppl": ...}``, or empty when
    the run did not validate); None (a converted checkpoint): the card says they were not recorded.
    """
    attn = cfg.attention
    family = cfg.model.family
    evaluation = (training or {}).get("evaluation") or {}
    tags = ["plsh_dist", "custom_code", f"attention-{attn.bias}", family, "text-generation"]
    meta = ["---", "library_name: transformers", "pipeline_tag: text-generation", "tags:"]
    meta += [f"- {_yaml_scalar(t)}" for t in tags]
    if evaluation:
        meta += ["model-index:", f"- name: {_yaml_scalar(cfg.run.name)}",
                 "  results:", "  - task:", "      type: text-generation", "    dataset:",
                 "      type: validation", "      name: the run's validation set", "    metrics:"]
        for key, value in evaluation.items():
            meta += [f"    - type: {_yaml_scalar(key)}", f"      value: {_yaml_scalar(float(value))}"]
    meta.append("---")

    if training is not None:
        tokens = training.get("tokens_seen")
        run_lines = [f"- optimizer steps: {training.get('steps')}",
                     f"- tokens seen: {tokens:,}" if isinstance(tokens, int) else "- tokens seen: not recorded"]
    else:
        run_lines = ["- steps and tokens seen: not recorded (this export was converted from a checkpoint; its "
                     "`trainer_state.json` has them)"]
    run_lines += [f"- sequence length: {cfg.data.seq_len}, micro-batch {cfg.data.micro_batch_size}, gradient "
                  f"accumulation {cfg.optim.grad_accum_steps} (per data-parallel rank)",
                  f"- run seed: {cfg.run.seed} (also the hash seed of the attention's masks)",
                  "- the whole resolved run config: `config.resolved.json`"]
    optim = dataclasses.asdict(cfg.optim)
    if evaluation:
        eval_lines = [f"| {k} | {float(v):.4f} |" for k, v in evaluation.items()]
        eval_text = "The run's final validation (its own validation set):\n\n| metric | value |\n|---|---|\n" + \
            "\n".join(eval_lines)
    else:
        eval_text = "The run produced no evaluation figures (no validation at its end)."
    d = "path/to/this/export"
    body = f"""
# A {family} decoder trained with plsh_dist attention (`bias = "{attn.bias}"`)

Trained with plsh_dist (distributed long-context pretraining with positional-LSH attention). The weights belong to the attention mode below: `config.json`'s `plsh_dist` section states it,
and the loader rebuilds it. Running them under plain attention (SDPA, rope only) gives another model.

## Attention

{_table(attn.to_dict())}

## Architecture

{_table(cfg.model.to_dict())}

## Training

{chr(10).join(run_lines)}

Optimizer:

{_table(optim)}

## Evaluation

{eval_text}

## Loading

With transformers, torch and sentencepiece only (no plsh_dist): the export carries plsh_dist's modelling
code (`modeling_plsh.py` and the `plsh_*.py` files it imports), which runs on PyTorch:

```python
from transformers import AutoModelForCausalLM, AutoTokenizer
model = AutoModelForCausalLM.from_pretrained("{d}", trust_remote_code=True)
tok = AutoTokenizer.from_pretrained("{d}", trust_remote_code=True)
```

With plsh_dist installed, the same lines run the package's own code (its fused Triton kernel on CUDA), as
does `import plsh_dist.models` followed by `from_pretrained` without `trust_remote_code`. Either way,
`from_pretrained(..., attention={{"bias": "alibi"}})` runs the weights under another attention mode.
"""
    return "\n".join(meta) + "\n" + body
