"""An export stands alone: in a Python where ``import plsh_dist`` fails, transformers loads it with
``trust_remote_code=True`` and the modelling code bundled in it (plsh_dist/models/remote_code.py)
gives the package's numbers for every attention mode: logits of a plain, a left-padded and a packed
(``position_ids`` restarting at 0) batch, greedy decoding with a KV cache (padded prompts), the
gradients of a training step and the logits after it. CPU fp32 on both sides, the same PyTorch
paths: compared with ``torch.equal`` (no tolerance). One subprocess serves every mode."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import transformers  # noqa: E402

from plsh_dist.checkpoint.export import save_export  # noqa: E402
from plsh_dist.data.tokenizer import train_tokenizer  # noqa: E402
from plsh_dist.models import AttentionRuntime, build_model  # noqa: E402
from plsh_dist.models import remote_code  # noqa: E402
from tests.models.test_hf_export import VOCAB, _run_config  # noqa: E402

#: Every mode an export can run, on the torch paths the bundle has.
MODES = {
    "plsh-onepass": {"bias": "plsh", "num_samples": 4, "method": "onepass"},
    "plsh-per_sample": {"bias": "plsh", "num_samples": 3, "sigma": 6.0, "method": "per_sample",
                        "sampler": "stratified"},
    "fixed_blocks": {"bias": "fixed_blocks", "sigma": 4.0},
    "alibi": {"bias": "alibi"},
    "window": {"bias": "window", "window": 5},
    "truncated": {"bias": "truncated", "num_samples": 4},
    "none": {"bias": "none", "rope": True},
}
FAMILY = {"plsh-onepass": "qwen3", "alibi": "llama", "none": "mistral"}

#: Run in the child: plsh_dist cannot be imported (a meta-path finder refuses it before anything
#: else is imported), then each export is loaded by transformers alone.
BLOCK = """
import importlib.abc, sys
class _NoPlshDist(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "plsh_dist" or name.startswith("plsh_dist."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, _NoPlshDist())
"""

CHILD = BLOCK + """
import sys, torch, transformers
try:
    import plsh_dist  # noqa: F401
except ImportError:
    pass
else:
    raise SystemExit("plsh_dist is importable")
inputs = torch.load(sys.argv[1])
results = {}
for name, directory in inputs["exports"].items():
    model = transformers.AutoModelForCausalLM.from_pretrained(directory, trust_remote_code=True)
    tok = transformers.AutoTokenizer.from_pretrained(directory, trust_remote_code=True)
    results[name] = run(model, inputs)
    results[name]["module"] = type(model).__module__
    results[name]["ids"] = tok("def f(x):\\n    return x\\n").input_ids
# the bundle's Triton gate: the kernels are not in the bundle, so no path launches them
bundle = type(model).__mro__[1].__module__.rpartition(".")[0]
results["triton_status"] = sys.modules[bundle + ".plsh_ops_triton_runtime"].triton_status()
# a re-save under the bundle writes the code it was loaded with, and loads again
first = next(iter(inputs["exports"].values()))
model = transformers.AutoModelForCausalLM.from_pretrained(first, trust_remote_code=True)
model.save_pretrained(inputs["resaved"])
transformers.AutoTokenizer.from_pretrained(first, trust_remote_code=True).save_pretrained(inputs["resaved"])
again = transformers.AutoModelForCausalLM.from_pretrained(inputs["resaved"], trust_remote_code=True)
with torch.no_grad():
    results["resaved_equal"] = torch.equal(again(input_ids=inputs["ids"]).logits, model(input_ids=inputs["ids"]).logits)
results["plsh_dist_imported"] = any(m == "plsh_dist" or m.startswith("plsh_dist.") for m in sys.modules)
torch.save(results, sys.argv[2])
"""

#: The same measurements in parent and child (exec'd in both).
RUN = """
def run(model, inputs):
    import torch
    model.eval()
    ids, mask, packed = inputs["ids"], inputs["mask"], inputs["packed"]
    out = {}
    with torch.no_grad():
        out["logits"] = model(input_ids=ids).logits
        out["padded"] = model(input_ids=ids, attention_mask=mask).logits
        out["packed"] = model(input_ids=ids[:1], position_ids=packed).logits
        gen = model.generate(input_ids=ids[:, :7], attention_mask=mask[:, :7], max_new_tokens=5, do_sample=False,
                             output_scores=True, return_dict_in_generate=True, pad_token_id=0)
        out["generated"], out["scores"] = gen.sequences, torch.stack(gen.scores)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    out["loss"] = loss.detach()
    out["grads"] = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    opt.step()
    model.eval()
    with torch.no_grad():
        out["after_step"] = model(input_ids=ids).logits
    return out
"""
exec(RUN)  # defines run() here


@pytest.fixture(scope="module")
def standalone(tmp_path_factory):
    """Every mode's export, the package's measurements and the child's (plsh_dist blocked)."""
    root = tmp_path_factory.mktemp("standalone")
    text = root / "text.txt"
    text.write_text(Path(textwrap.__file__).read_text())
    train_tokenizer([str(text)], root / "tok", vocab_size=VOCAB, input_sentence_size=300)
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(4, VOCAB, (2, 12), generator=g)
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, :3] = 0  # left padding, what the export's tokenizer gives a batch
    packed = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5, 6]])  # two documents in one row
    inputs = {"ids": ids, "mask": mask, "packed": packed, "exports": {}, "resaved": str(root / "resaved")}
    want = {}
    for name, attention in MODES.items():
        cfg = _run_config(root, FAMILY.get(name, "qwen3"), {"rope": False, **attention}, seed=11)
        torch.manual_seed(0)
        model = build_model(cfg.model, cfg.attention, AttentionRuntime(run_seed=cfg.run.seed))
        out = save_export(model, cfg, cfg.tokenizer.model_path, root / name)
        inputs["exports"][name] = str(out)
        want[name] = run(model, inputs)
    torch.save(inputs, root / "inputs.pt")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": "", "HF_MODULES_CACHE": str(root / "modules")}
    res = subprocess.run([sys.executable, "-c", RUN + CHILD, str(root / "inputs.pt"), str(root / "got.pt")],
                         capture_output=True, text=True, env=env, cwd=root, timeout=600, stdin=subprocess.DEVNULL)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]
    got = torch.load(root / "got.pt")
    got["stderr"] = res.stderr
    return want, got, inputs


@pytest.mark.parametrize("mode", list(MODES))
def test_the_bundle_gives_the_package_numbers_without_plsh_dist(standalone, mode):
    want, got, _ = standalone
    assert not got["plsh_dist_imported"]
    assert got[mode]["module"].startswith("transformers_modules."), got[mode]["module"]
    for key in ("logits", "padded", "packed", "generated", "scores", "loss", "after_step"):
        assert torch.equal(got[mode][key], want[mode][key]), (mode, key)
    assert got[mode]["grads"].keys() == want[mode]["grads"].keys()
    for param, grad in want[mode]["grads"].items():
        assert torch.equal(got[mode]["grads"][param], grad), (mode, param)


def test_the_bundle_says_once_that_it_runs_without_plsh_dist(standalone):
    _, got, _ = standalone
    notices = [line for line in got["stderr"].splitlines() if "code bundled with it" in line]
    assert len(notices) == 1, got["stderr"][-3000:]
    assert "PyTorch paths" in notices[0] and "plsh_dist cannot be imported" in notices[0]


def test_the_bundle_runs_no_triton_kernel_and_resaves_itself(standalone):
    """The kernels are not bundled, so the bundle's Triton gate is shut even where Triton imports (no
    path would launch a kernel it lacks); a model loaded from the bundle saves the same code files
    (byte for byte), and the re-saved directory loads with the same logits."""
    _, got, inputs = standalone
    assert got["triton_status"] is not None
    export, resaved = Path(next(iter(inputs["exports"].values()))), Path(inputs["resaved"])
    assert {p.name: p.read_bytes() for p in resaved.glob("*.py")} == {p.name: p.read_bytes() for p in export.glob("*.py")}
    assert json.loads((resaved / "config.json").read_text())["auto_map"] == \
        json.loads((export / "config.json").read_text())["auto_map"]
    assert got["resaved_equal"]


def test_transformers_copies_the_whole_bundle_and_accepts_its_imports(standalone, tmp_path):
    """transformers' own copier (``get_relative_import_files`` from the entry module) reaches every
    file the export carries as code, and its import check finds nothing outside torch, transformers,
    sentencepiece (and what they bring: numpy, safetensors) in any of them: what a Hub load checks,
    file by file."""
    from transformers.dynamic_module_utils import get_imports, get_relative_import_files

    _, _, inputs = standalone
    export = Path(inputs["exports"]["plsh-onepass"])
    code = {p.name for p in export.glob("*.py")}
    assert code == set(remote_code.bundle_sources())
    reached = set()
    for entry in remote_code.ENTRY_MODULES:
        reached |= {Path(p).name for p in get_relative_import_files(str(export / entry))}
    assert reached == code - set(remote_code.ENTRY_MODULES)
    for name in sorted(code):
        outside = set(get_imports(str(export / name))) - set(remote_code.REQUIRED) - set(sys.stdlib_module_names)
        assert not outside, (name, outside)


def test_the_export_is_ready_to_publish(standalone, tmp_path):
    """README.md is a Hub model card whose metadata block parses (huggingface_hub's own parser), stating
    the attention mode and its parameters, the training run with its tokens seen and the evaluation
    figures given, and both ways to load; the folder holds only regular files that parse, no pickle."""
    import huggingface_hub

    _, _, inputs = standalone
    root = Path(inputs["exports"]["plsh-onepass"]).parent
    cfg = _run_config(root, "qwen3", {"bias": "truncated", "num_samples": 4, "truncate_c": 2.5}, seed=5)
    model = build_model(cfg.model, cfg.attention, AttentionRuntime(run_seed=5))
    training = {"steps": 4, "tokens_seen": 4 * 2 * 128, "evaluation": {"val_loss": 5.25, "val_ppl": 190.57}}
    out = save_export(model, cfg, cfg.tokenizer.model_path, tmp_path / "final", training=training)
    card = huggingface_hub.ModelCard.load(out / "README.md")
    meta = card.data.to_dict()
    assert meta["library_name"] == "transformers" and meta["pipeline_tag"] == "text-generation"
    assert {"plsh_dist", "custom_code", "attention-truncated"} <= set(meta["tags"])
    assert {(r.metric_type, r.metric_value) for r in card.data.eval_results} == {("val_loss", 5.25),
                                                                                  ("val_ppl", 190.57)}
    for text in ('| `bias` | `"truncated"` |', "| `truncate_c` | `2.5` |", "| `num_samples` | `4` |",
                 "tokens seen: 1,024", "optimizer steps: 4", "| val_ppl | 190.5700 |", "trust_remote_code=True",
                 "import plsh_dist.models"):
        assert text in card.text, text
    converted = huggingface_hub.ModelCard.load(Path(inputs["exports"]["alibi"]) / "README.md")
    assert "not recorded" in converted.text and "no evaluation figures" in converted.text
    assert not converted.data.to_dict().get("model-index")
    for directory in (out, Path(inputs["exports"]["alibi"])):
        files = {p.name for p in directory.iterdir()}
        assert {"README.md", "config.json", "generation_config.json", "model.safetensors", "tokenizer.model",
                "tokenizer_config.json", "config.resolved.json", *remote_code.ENTRY_MODULES} <= files
        for path in directory.iterdir():
            assert path.is_file() and not path.is_symlink() and path.suffix not in (".bin", ".pt", ".pkl"), path
            if path.suffix == ".json":
                json.loads(path.read_text())
