"""launchers/generate.py: prompt -> text with a KV cache (default) or by full re-forward
per token, equal to a hand-written greedy loop and to transformers' own generate(); modes
selectable; the tokens/s line; context limits and bad arguments as clear errors; a file of
prompts in left-padded batches, each row's tokens its prompt's alone, written in input order."""

from __future__ import annotations

import json
import logging
import os
import sys
import textwrap
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import transformers  # noqa: E402

from plsh_dist.checkpoint.export import save_export  # noqa: E402
from plsh_dist.checkpoint.loading import load_model  # noqa: E402
from plsh_dist.config import config_from_table  # noqa: E402
from plsh_dist.data.tokenizer import train_tokenizer  # noqa: E402
from plsh_dist.eval.generation import Reforward, generate, generate_batch, sample_next  # noqa: E402
from plsh_dist.models import AttentionRuntime, build_model  # noqa: E402
from tests.launchers import load_launcher  # noqa: E402

VOCAB = 384
generate_launcher = load_launcher("generate")


def _export(root: Path, name: str, attention: dict, max_pos: int = 512) -> Path:
    cfg = config_from_table({
        "run": {"out_dir": str(root / name), "seed": 5},
        "model": dict(family="qwen3", vocab_size=VOCAB, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1,
                      head_dim=16, intermediate_size=64, max_position_embeddings=max_pos, rope_theta=10000.0),
        "attention": attention,
        "data": {"train_files": [str(root / "text.txt")], "cache_dir": str(root / "cache")},
        "tokenizer": {"model_path": str(root / "tok.model"), "vocab_size": VOCAB},
    })
    torch.manual_seed(0)
    model = build_model(cfg.model, cfg.attention, AttentionRuntime(run_seed=cfg.run.seed))
    return save_export(model, cfg, cfg.tokenizer.model_path, root / name / "final")


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    root = tmp_path_factory.mktemp("generate")
    (root / "text.txt").write_text(Path(textwrap.__file__).read_text())
    train_tokenizer([str(root / "text.txt")], root / "tok", vocab_size=VOCAB, input_sentence_size=300)
    return {"plsh": _export(root, "plsh", {"bias": "plsh", "num_samples": 4, "sigma": 6.0}),
            "rope": _export(root, "rope", {"bias": "none", "rope": True}, max_pos=40)}


def test_greedy_equals_a_full_forward_loop_and_hf_generate(exports):
    ck = load_model(exports["plsh"])
    res = generate(ck, "def wrap(", max_new_tokens=6, stop_at_eos=False)
    ids = [ck.tokenizer.eos_id] + ck.tokenizer.encode("def wrap(")
    want = []
    with torch.no_grad():
        for _ in range(6):
            x = torch.tensor([ids + want])
            want.append(int(ck.model(input_ids=x, use_cache=False).logits[0, -1].argmax()))
    assert res.completion == ck.tokenizer.decode(want) and res.new_tokens == 6
    assert res.prompt_tokens == len(ids) and "KV cache (DynamicCache)" in res.summary() and "tokens/s" in res.summary()
    again = generate(ck, "def wrap(", max_new_tokens=6, stop_at_eos=False, use_cache=False)
    assert again.completion == res.completion and "no KV cache" in again.summary()
    # transformers' generate() on the same export (its generation_config: use_cache=true).
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(exports["plsh"]))
    out = hf.generate(torch.tensor([ids]), max_new_tokens=6, do_sample=False, eos_token_id=None)
    assert out[0, len(ids):].tolist() == want
    # The checkpoint's model is back in its trained mode afterwards.
    assert ck.model.model.layers[0].self_attn.plsh_binding.cfg == ck.trained_attention


def test_decoder_can_be_plugged_in(exports):
    ck = load_model(exports["plsh"])

    class Counting(Reforward):
        description = "counting test decoder"
        steps = 0

        def step(self, token):
            Counting.steps += 1
            return super().step(token)

    res = generate(ck, "x = ", max_new_tokens=4, stop_at_eos=False, decoder=Counting(ck.model))
    assert Counting.steps == 3 and res.decoder == "counting test decoder"
    assert res.text == "x = " + res.completion


def test_launcher_modes_and_tokens_per_s(exports, capsys):
    for mode in ("alibi", "plsh:s=8", "window:4", "none:rope=true"):
        assert generate_launcher.main(["--checkpoint", str(exports["plsh"]), "--prompt", "import os\n",
                                       "--max-new-tokens", "3", "--mode", mode, "--no-stop"]) == 0
        out = capsys.readouterr()
        assert out.out.startswith("import os\n")
        assert "tokens/s" in out.err and "KV cache (DynamicCache)" in out.err
    assert generate_launcher.main(["--checkpoint", str(exports["plsh"]), "--prompt", "import os\n",
                                   "--max-new-tokens", "3", "--no-cache", "--no-stop"]) == 0
    assert "full re-forward per token (no KV cache" in capsys.readouterr().err
    assert generate_launcher.main(["--checkpoint", str(exports["plsh"]), "--prompt", "a", "--max-new-tokens", "3",
                                   "--temperature", "0.8", "--top-k", "20", "--top-p", "0.9", "--seed", "1"]) == 0


def test_bad_arguments_are_clear_errors(exports, capsys, tmp_path):
    rope = load_model(exports["rope"])
    with pytest.raises(ValueError, match=r"exceeds what this mode supports \(40: rope is on"):
        generate(rope, "word " * 30, max_new_tokens=10)
    assert generate(rope, "word " * 30, max_new_tokens=10, mode="alibi:rope=false").new_tokens >= 1  # no limit
    ck = load_model(exports["plsh"])
    for kwargs, match in [({"max_new_tokens": 0}, "max_new_tokens"), ({"mode": "alibi,none"}, "one attention mode"),
                          ({"mode": "bogus"}, "unknown mode"), ({"temperature": -1.0}, "temperature"),
                          ({"doc_start": False}, "prompt is empty"), ({"max_context": 3}, "--max-context 3")]:
        with pytest.raises(ValueError, match=match):
            generate(ck, "" if "doc_start" in kwargs else "hello world", **kwargs)
    assert generate_launcher.main(["--checkpoint", str(tmp_path / "none"), "--prompt", "x"]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert generate_launcher.main(["--checkpoint", str(exports["plsh"]), "--prompt-file", str(tmp_path / "p")]) == 2


def test_sampling_filters():
    logits = torch.tensor([0.0, 5.0, 4.0, -3.0])
    assert sample_next(logits) == 1
    g = torch.Generator().manual_seed(0)
    assert {sample_next(logits, temperature=1.0, top_k=2, generator=g) for _ in range(50)} <= {1, 2}
    assert {sample_next(logits, temperature=1.0, top_p=0.5, generator=g) for _ in range(20)} == {1}


def test_launcher_text_ends_with_a_newline_before_the_stats_line(exports):
    """stdout and stderr on one terminal: the statistics line starts a line of its own."""
    import subprocess

    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, str(root / "launchers" / "generate.py"), "--checkpoint",
                           str(exports["plsh"]), "--prompt", "x = ", "--max-new-tokens", "3", "--no-stop"],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120, cwd=root,
                          env={**os.environ, "PYTHONPATH": str(root)})
    assert done.returncode == 0, done.stdout
    assert done.stdout.endswith("\n")
    text, stats = done.stdout[:-1].rsplit("\n", 1)
    assert text.startswith("x = ") and stats.startswith("generated 3 tokens in "), done.stdout


class _Records(logging.Handler):
    """The messages transformers logs while it is attached (its loggers do not propagate)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def test_an_exports_tokenizer_batches_prompts_for_generate(exports):
    """A user's batched generate through transformers alone: the export's tokenizer pads on the left,
    so each row's greedy tokens equal its prompt's alone; a right-padded batch is warned about
    (the export's pad id reaches transformers' generate, whose check needs it)."""
    import plsh_dist.models  # noqa: F401  (registers the model types and the tokenizer)

    model = transformers.AutoModelForCausalLM.from_pretrained(str(exports["plsh"]))
    tok = transformers.AutoTokenizer.from_pretrained(str(exports["plsh"]))
    prompts = ["def wrap(text, width", "import os", "class TextWrapper:\n    def"]
    kw = dict(max_new_tokens=5, do_sample=False)
    assert tok.padding_side == "left"
    batch = tok(prompts, return_tensors="pt", padding=True)
    with torch.no_grad():
        batched = model.generate(**batch, **kw)[:, batch.input_ids.shape[1]:]
        for row, prompt in zip(batched, prompts):
            alone = tok(prompt, return_tensors="pt")
            assert row.tolist() == model.generate(**alone, **kw)[0, alone.input_ids.shape[1]:].tolist(), prompt
    records = _Records()
    logging.getLogger("transformers").addHandler(records)
    try:
        tok.padding_side = "right"
        with torch.no_grad():
            model.generate(**tok(prompts, return_tensors="pt", padding=True), **kw)
    finally:
        logging.getLogger("transformers").removeHandler(records)
    assert any("right-padding was detected" in m for m in records.messages), records.messages


PROMPTS = ["def wrap(text, width=70, **kwargs):", "import os", "x", "class TextWrapper:\n    def __init__(self"]


@pytest.mark.parametrize("mode", ["plsh:s=8", "alibi", "window:4", "none:rope=true"])
def test_batched_rows_equal_each_prompt_alone(exports, mode):
    ck = load_model(exports["plsh"])
    kw = dict(max_new_tokens=5, stop_at_eos=False, mode=mode)
    alone = [generate(ck, p, **kw).completion for p in PROMPTS]
    for use_cache in (True, False):
        results = generate_batch(ck, PROMPTS, batch_size=3, use_cache=use_cache, **kw)
        assert [r.completion for r in results] == alone, (mode, use_cache)
        assert [r.text for r in results] == [p + c for p, c in zip(PROMPTS, alone)]
    assert ck.model.model.layers[0].self_attn.plsh_binding.cfg == ck.trained_attention
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        generate_batch(ck, ["a", ""], doc_start=False)
    with pytest.raises(ValueError, match="batch_size must be an int >= 1"):
        generate_batch(ck, PROMPTS, batch_size=0)


def test_launcher_prompts_file_in_batches_in_input_order(exports, tmp_path, capsys):
    ck = load_model(exports["plsh"])
    alone = [generate(ck, p, max_new_tokens=4, stop_at_eos=False).completion for p in PROMPTS]
    lines = tmp_path / "prompts.txt"  # one a line, empty lines skipped (the multi-line prompt needs jsonl)
    lines.write_text("\n".join(PROMPTS[:3]) + "\n\n" + PROMPTS[3].replace("\n", " ") + "\n")
    out = tmp_path / "out.jsonl"
    assert generate_launcher.main(["--checkpoint", str(exports["plsh"]), "--prompts", str(lines), "--batch-size", "2",
                                   "--max-new-tokens", "4", "--no-stop", "--out", str(out)]) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["index"] for r in records] == [0, 1, 2, 3]
    assert [r["prompt"] for r in records] == PROMPTS[:3] + [PROMPTS[3].replace("\n", " ")]
    assert [r["completion"] for r in records[:3]] == alone[:3] and all(r["new_tokens"] == 4 for r in records)
    assert "generated 16 tokens for 4 prompts in 2 batches of up to 2 in " in capsys.readouterr().err
    # jsonl: "prompt", else "text"; records to stdout; the same rows with --no-cache.
    jsonl = tmp_path / "prompts.jsonl"
    jsonl.write_text("".join(json.dumps({"prompt": p} if i % 2 else {"text": p, "id": i}) + "\n"
                             for i, p in enumerate(PROMPTS)))
    assert generate_launcher.main(["--checkpoint", str(exports["plsh"]), "--prompts", str(jsonl), "--max-new-tokens",
                                   "4", "--no-stop", "--no-cache"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["prompt"] for r in records] == PROMPTS and [r["completion"] for r in records] == alone


def test_launcher_refuses_bad_prompt_files(exports, tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "a"}) + "\n" + json.dumps({"question": "b"}) + "\n")
    base = ["--checkpoint", str(exports["plsh"])]
    assert generate_launcher.main(base + ["--prompts", str(bad)]) == 2
    assert f'{bad}:2 has no "prompt" or "text" string field' in capsys.readouterr().err
    assert generate_launcher.main(base + ["--prompt", "a", "--batch-size", "2"]) == 2
    assert "--batch-size and --out go with --prompts" in capsys.readouterr().err
    (tmp_path / "empty.txt").write_text("\n\n")
    assert generate_launcher.main(base + ["--prompts", str(tmp_path / "empty.txt")]) == 2
    assert "holds no prompt" in capsys.readouterr().err
    (tmp_path / "p.txt").write_text("a\n")
    assert generate_launcher.main(base + ["--prompts", str(tmp_path / "p.txt"), "--out",
                                          str(tmp_path / "missing" / "out.jsonl")]) == 2
    assert "cannot be written" in capsys.readouterr().err
