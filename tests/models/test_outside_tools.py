"""The tools users evaluate and fine-tune an export with, installed as they install them (the
``dev`` extra), none mocked: lm-evaluation-harness's ``HFLM``, PEFT LoRA, TRL's ``SFTTrainer`` and
transformers' ``pipeline``. Each loads the export by its path, as a user does (``trust_remote_code``);
the commands are docs/outside.md's. The export is the tiny one of test_hf_export.py (hidden 32,
2 layers, GQA 2/1, a 384-piece tokenizer), PLSH with 4 sampled masks, rope off, in fp32.

lm-eval runs no task (a task downloads its dataset): its three request types are called directly
with ``Instance`` objects, batch size 3 so rows are padded, and compared with a plain forward of
each window alone."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import transformers  # noqa: E402

from tests.models.test_hf_export import _export, corpus  # noqa: E402,F401  (corpus: the tokenizer fixture)

lm_eval = pytest.importorskip("lm_eval", reason="the dev extra: pip install -e '.[dev]'")
peft = pytest.importorskip("peft", reason="the dev extra: pip install -e '.[dev]'")
trl = pytest.importorskip("trl", reason="the dev extra: pip install -e '.[dev]'")

TEXT = ("def wrap(text, width=70, **kwargs):\n    w = TextWrapper(width=width, **kwargs)\n"
        "    return w.wrap(text)\n\n\ndef fill(text, width=70, **kwargs):\n    w = TextWrapper(width=width, **kwargs)\n"
        "    return w.fill(text)\n")


@pytest.fixture(scope="module")
def export(corpus, tmp_path_factory):  # noqa: F811
    return _export(corpus, tmp_path_factory.mktemp("outside") / "final")


def _load(export):
    model = transformers.AutoModelForCausalLM.from_pretrained(str(export), trust_remote_code=True)
    tok = transformers.AutoTokenizer.from_pretrained(str(export), trust_remote_code=True)
    return model, tok


def _logprobs(model, ids: list[int]) -> torch.Tensor:
    """log p(ids[i] | ids[:i]) for i >= 1: one plain forward of the window alone."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0, :-1].double()
    return logits.log_softmax(-1), torch.tensor(ids[1:])


def test_lm_eval_harness_scores_as_a_plain_forward(export):
    """HFLM(pretrained=export) (before: ValueError, from_pretrained did not support gguf_file, max_memory,
    quantization_config). loglikelihood, loglikelihood_rolling (its perplexity tasks: windows of
    max_length = 32 tokens here, so a text spans several) and generate_until, batch size 3 (padded rows),
    each equal to a forward or greedy decoding of the same window alone. Tolerance: a log-prob sum of n
    tokens to n * 2e-5 (FP32's, per token): a padded batch is a longer matmul than the row alone, the
    same fp32 sums in another tiling; the greedy flags and generated texts are equal."""
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    model, tok = _load(export)
    # Training packs documents after an EOS, with no BOS: the rolling windows' first token is the EOS
    # (lm-eval's default is the tokenizer's BOS).
    lm = HFLM(pretrained=str(export), trust_remote_code=True, batch_size=3, max_length=32, device="cpu",
              prefix_token_id=tok.eos_token_id)
    assert lm.prefix_token_id == tok.eos_token_id == 2
    enc = tok.encode

    pairs = [("def wrap(text,", " width=70"), ("    w = Text", "Wrapper(width"), ("import", " os"),
             ("return w.", "fill(text)\n")]
    got = lm.loglikelihood([Instance("loglikelihood", {}, p, i) for i, p in enumerate(pairs)])
    for (context, continuation), (ll, greedy) in zip(pairs, got):
        whole, ctx = enc(context + continuation), enc(context)
        assert whole[:len(ctx)] == ctx and len(whole) <= 33, (context, continuation)
        logp, target = _logprobs(model, whole)
        rows = slice(len(ctx) - 1, len(whole) - 1)
        n = len(whole) - len(ctx)
        want = logp[rows].gather(1, target[rows, None]).sum().item()
        assert greedy == bool((logp[rows].argmax(-1) == target[rows]).all()), context
        assert ll == pytest.approx(want, abs=n * 2e-5, rel=2e-5), context

    texts = [TEXT, TEXT[:50], TEXT[60:]]
    got = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (t,), i) for i, t in enumerate(texts)])
    for text, ll in zip(texts, got):
        ids, total, done = enc(text), 0.0, 0
        while done < len(ids):  # windows of <= 32 predicted tokens, each after up to 32 - n tokens of context
            end = min(done + 32, len(ids))
            window = ([tok.eos_token_id] + ids[:end]) if done == 0 else ids[end - 33:end]
            logp, target = _logprobs(model, window)
            n = end - done
            total += logp[-n:].gather(1, target[-n:, None]).sum().item()
            done = end
        assert len(ids) > 32 or text is not TEXT
        assert ll == pytest.approx(total, abs=len(ids) * 2e-5, rel=2e-5), text[:20]

    prompts = ["def wrap(text, width", "import os\n", "class TextWrapper:\n    def"]
    args = {"until": ["\n\n"], "max_gen_toks": 6, "do_sample": False}
    got = lm.generate_until([Instance("generate_until", {}, (p, dict(args)), i) for i, p in enumerate(prompts)])
    for prompt, text in zip(prompts, got):
        with torch.no_grad():
            out = model.generate(input_ids=torch.tensor([enc(prompt)]), max_new_tokens=6, do_sample=False)
        alone = tok.decode(out[0, len(enc(prompt)):], skip_special_tokens=True).split("\n\n")[0]
        assert text == alone, prompt


def test_peft_lora_trains_saves_reloads_and_merges(export, tmp_path):
    """LoRA on q/k/v/o: one AdamW step changes the logits; the adapter saved and loaded on a fresh base
    gives the trained model's logits exactly (the same fp32 computation); merged into the weights, the
    plain model (still plsh_dist attention) gives them to FP32 (W + BA in one matmul, rounded once)."""
    from peft import LoraConfig, PeftModel, get_peft_model

    from plsh_dist.models import get_runtime
    from tests.tolerances import FP32

    model, tok = _load(export)
    ids = tok([TEXT], return_tensors="pt").input_ids[:, :48]
    with torch.no_grad():
        base_logits = model(input_ids=ids).logits
    lora = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj",
                                                                             "o_proj"], lora_dropout=0.0))
    lora.train()
    opt = torch.optim.AdamW([p for p in lora.parameters() if p.requires_grad], lr=1e-2)
    lora(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    lora.eval()
    with torch.no_grad():
        trained = lora(input_ids=ids).logits
    assert not torch.allclose(trained, base_logits, atol=1e-4)
    lora.save_pretrained(str(tmp_path / "adapter"))

    fresh, _ = _load(export)
    reloaded = PeftModel.from_pretrained(fresh, str(tmp_path / "adapter")).eval()
    with torch.no_grad():
        assert torch.equal(reloaded(input_ids=ids).logits, trained)
    merged = reloaded.merge_and_unload()
    assert type(merged).__name__ == "Qwen3PlshForCausalLM" and get_runtime(merged).run_seed == 7
    with torch.no_grad():
        torch.testing.assert_close(merged(input_ids=ids).logits, trained, **FP32)


def test_trl_sft_trainer_loss_falls(export, tmp_path):
    """TRL's SFTTrainer on the export, padded batches of 2 texts of different lengths (the collator's
    padding and attention mask), 8 steps on CPU: the loss of the last 2 steps is below the first 2's."""
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    model, tok = _load(export)
    lines = [line for line in TEXT.splitlines() if line.strip()]
    data = Dataset.from_dict({"text": [lines[i % len(lines)] + "\n" + lines[(i + 1) % len(lines)]
                                       for i in range(16)]})
    args = SFTConfig(output_dir=str(tmp_path / "sft"), max_steps=8, per_device_train_batch_size=2,
                     learning_rate=3e-3, lr_scheduler_type="constant", warmup_steps=0, logging_steps=1,
                     report_to=[], save_strategy="no", use_cpu=True, max_length=64, packing=False, seed=0,
                     dataloader_num_workers=0)
    trainer = SFTTrainer(model=model, args=args, train_dataset=data, processing_class=tok)
    trainer.train()
    losses = [row["loss"] for row in trainer.state.log_history if "loss" in row]
    assert len(losses) == 8, trainer.state.log_history
    assert sum(losses[-2:]) < sum(losses[:2]), losses


def test_text_generation_pipeline_from_the_export_path(export):
    """pipeline("text-generation", model=export) loads model and tokenizer from the path; a batch of 3
    prompts of different lengths (batch_size 2: left padding, the exported tokenizer's side) gives each
    prompt's text generated alone. tests/models/test_padding.py runs the same for every mode."""
    pipe = transformers.pipeline("text-generation", model=str(export), trust_remote_code=True, batch_size=2)
    assert pipe.tokenizer.padding_side == "left"
    prompts = ["def wrap(text, width", "import os", "class TextWrapper:\n    def"]
    kw = dict(max_new_tokens=5, do_sample=False, return_full_text=False)
    batched = [out[0]["generated_text"] for out in pipe(prompts, **kw)]
    alone = [pipe(p, **kw)[0]["generated_text"] for p in prompts]
    assert batched == alone and all(batched)
