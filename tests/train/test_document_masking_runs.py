"""Document masking through the trainer: SP=2 reproduces SP=1, and masking matters.

The stdlib files of the other training tests are far longer than their
64-token windows, so few batches there hold a document border. Here the
corpus is short documents (a few lines of a stdlib file each, ~2 per window):
with ``[data].document_masking`` on, a 2-rank SP run (each rank its chunk,
both the same whole-batch ``cu_seqlens``) matches the 1-rank run's losses,
gradient norms and validation loss (1e-5 relative, as tests/train/
test_equivalence.py), and the same run without masking trains differently.
"""

from __future__ import annotations

import json

import pytest

from tests.train.conftest import base_overrides
from tests.train.spawn import run_training

REL = 1e-5


def _short_documents(tiny_data, tmp_path) -> list[str]:
    """Overrides pointing the data at short documents cut from the tiny corpus."""
    paths = {a.split("=", 1)[0]: a.split("=", 1)[1] for a in tiny_data}
    out = []
    for key, name in (("--data.train_files", "train"), ("--data.val_files", "val")):
        src = paths[key].strip("[]'")
        docs = []
        with open(src, encoding="utf-8") as f:
            for line in f:
                lines = json.loads(line)["text"].splitlines()
                docs += ["\n".join(lines[i : i + 4]) for i in range(0, min(len(lines), 200), 4)]
        path = tmp_path / f"{name}_short.jsonl"
        path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs if d.strip()), encoding="utf-8")
        out.append(f"{key}=['{path}']")
    return out


def test_sp2_matches_sp1_with_document_masking(tiny_data, tmp_path):
    data = [*_short_documents(tiny_data, tmp_path), "--data.cache_dir=" + str(tmp_path / "cache")]
    flags = ["--attention.bias=plsh", "--attention.num_samples=2", "--data.min_doc_tokens=1", *data]

    def run(name: str, sp: int, masking: bool) -> list[str]:
        return base_overrides(tiny_data, tmp_path / name, *flags, f"--parallel.sp_size={sp}",
                              f"--data.document_masking={'true' if masking else 'false'}")

    sp1, plain = run_training(1, run("sp1", 1, True), run("plain", 1, False))
    (sp2,) = run_training(2, run("sp2", 2, True))
    for key in ("losses", "grad_norms"):
        assert sp2[key] == pytest.approx(sp1[key], rel=REL), key
    assert sp2["val_loss"] == pytest.approx(sp1["val_loss"], rel=REL)
    # Masking changes what the model sees (documents are ~half a window): not the same run.
    assert max(abs(a - b) / b for a, b in zip(sp1["losses"], plain["losses"])) > 100 * REL
