"""Exit codes through ``launchers/pretrain.py``: a refused input exits 2 with one message; a bug exits 1.

The table these tests pin is docs/training.md's ("Exit codes"). A refusal
prints ``<kind> error: <message>`` exactly once, no traceback, writes no
``failures/rank_N.txt`` and changes nothing on disk: an out_dir that did not
exist is not created, one that did keeps every byte (the run's record,
``config.resolved.*``, included), and a failed token-cache build leaves no
file behind. One process (plain ``python``) unless the test says otherwise.
``make test-slow``: every test starts the launcher (the in-process checks are
test_config_validation.py's and test_resume_check.py's, in ``make test``).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path

import pytest

from plsh_dist.checkpoint.line import tag_for_step
from plsh_dist.config import load_config, write_resolved
from plsh_dist.data.tokenizer import train_tokenizer
from tests.train.conftest import base_overrides
from tests.train.launcher_runs import PRETRAIN, Finished, deepspeed_cmd, empty_config, launcher_env, run

pytestmark = pytest.mark.slow

_TIMEOUT_S = 300  # one process on 2 busy cores: ~15-60 s; a hang fails the test


def _launch(tmp_path: Path, overrides: list[str], name: str, **env: str) -> Finished:
    cmd = [sys.executable, str(PRETRAIN), "--config", str(empty_config(tmp_path)), *overrides]
    return run(cmd, launcher_env(**env), tmp_path / "logs", name, _TIMEOUT_S)


def _snapshot(directory: Path) -> dict[str, str]:
    """Every file under ``directory`` with its SHA-256 (directories too, as "dir")."""
    if not directory.exists():
        return {}
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(directory.rglob("*"))}


def assert_refused(proc: Finished, kind: str, expected: str, out_dir: Path) -> None:
    """Exit 2, ``<kind> error: ...expected...`` once, no traceback, no failure file."""
    text = proc.stdout + proc.stderr
    assert proc.returncode == 2, f"exit {proc.returncode}, expected 2:\n{text[-3000:]}"
    assert text.count(f"{kind} error: ") == 1, text[-3000:]
    assert text.count(expected) == 1, f"{expected!r} not printed exactly once:\n{text[-3000:]}"
    assert "Traceback" not in text, text[-3000:]
    assert not (out_dir / "failures").exists()


def test_sp_size_larger_than_the_world_exits_2(tiny_data, tmp_path):
    """The quickstart config (sp_size = 2) run as one plain process."""
    out = tmp_path / "run"
    proc = _launch(tmp_path, base_overrides(tiny_data, out, "--parallel.sp_size=2"), "sp_size")
    assert_refused(proc, "config", "[parallel].sp_size=2 does not divide world_size=1", out)
    assert not out.exists()


def test_seq_len_not_divisible_by_sp_size_exits_2(tiny_data, tmp_path):
    out = tmp_path / "run"
    proc = _launch(tmp_path, base_overrides(tiny_data, out, "--parallel.sp_size=2", "--data.seq_len=129"), "seq_len")
    assert_refused(proc, "config", "[data].seq_len=129 is not divisible by [parallel].sp_size=2", out)
    assert not out.exists()


def test_empty_data_file_exits_2_and_leaves_no_cache_file(tiny_data, tmp_path):
    out, cache, empty = tmp_path / "run", tmp_path / "cache", tmp_path / "empty.txt"
    empty.write_text("")
    overrides = base_overrides(tiny_data, out, f"--data.train_files=['{empty}']", f"--data.cache_dir={cache}")
    proc = _launch(tmp_path, overrides, "empty_data")
    assert_refused(proc, "data", f"no usable data file among ['{empty}']", out)
    assert not out.exists()
    assert [p for p in cache.rglob("*") if p.is_file()] == []  # no 0-byte tokens.bin.tmp
    assert not cache.exists() or list(cache.iterdir()) == []  # nor an empty cache entry


def _without_files(overrides: list[str]) -> list[str]:
    return [o for o in overrides if not o.startswith(("--data.train_files=", "--data.val_files="))]


def test_corpus_too_small_for_the_tokenizer_to_train_exits_2(tiny_data, tmp_path):
    """SentencePiece cannot make 2048 pieces of a few lines: refused naming the field, the data and the fix."""
    out, small, tok = tmp_path / "run", tmp_path / "small.txt", tmp_path / "tok" / "new.model"
    small.write_text("def f(x):\n    return x + 1\n" * 20)
    overrides = _without_files(base_overrides(tiny_data, out, f"--tokenizer.model_path={tok}",
                                              "--tokenizer.vocab_size=2048", f"--data.cache_dir={tmp_path / 'cache'}"))
    overrides.append(f"--data.train_files=['{small}']")
    proc = _launch(tmp_path, overrides, "tokenizer_too_large")
    assert_refused(proc, "data", f"[tokenizer].vocab_size = 2048 is too large for the tokenizer's training data "
                                 f"['{small}']: SentencePiece can make at most", out)
    assert "train on more data" in proc.stderr
    assert not out.exists() and not tok.parent.exists()


def test_file_builder_without_data_files_exits_2_before_any_work(tiny_data, tmp_path):
    """``load_dataset("json")`` alone would read the working directory (the repository's .py files)."""
    out = tmp_path / "run"
    proc = _launch(tmp_path, _without_files(base_overrides(tiny_data, out, "--data.dataset_name=json")), "json")
    assert_refused(proc, "config", "[data].dataset_name = 'json' is a datasets builder that reads files, and "
                                   "[data].data_files is not set", out)
    assert not out.exists()


def test_file_builder_reads_data_files(tiny_data, tmp_path):
    """The stdlib corpus's train.jsonl through ``--data.dataset_name=json --data.data_files=[...]``: one step."""
    out = tmp_path / "run"
    train = next(o for o in tiny_data if o.startswith("--data.train_files="))[len("--data.train_files="):]
    overrides = _without_files(base_overrides(tiny_data, out, "--data.dataset_name=json", f"--data.data_files={train}",
                                              "--run.max_steps=1", "--optim.warmup_steps=1",
                                              f"--data.cache_dir={tmp_path / 'cache'}"))
    proc = _launch(tmp_path, overrides, "json_files")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert len((out / "metrics.jsonl").read_text().splitlines()) >= 1


@pytest.mark.parametrize("layout", ["Dataset", "DatasetDict"])
def test_save_to_disk_directory_trains(tiny_data, tmp_path, layout):
    """A ``save_to_disk`` directory as ``--data.dataset_name``, read with ``load_from_disk``: a ``Dataset``'s
    (one split, read as ``train``; ``load_dataset`` asked for ``load_from_disk`` and the run exited 2) or a
    ``DatasetDict``'s ``train`` split, ``--data.val_split`` picking its validation split: one step."""
    import datasets

    out, saved = tmp_path / "run", tmp_path / "saved"
    train = next(o for o in tiny_data if o.startswith("--data.train_files="))[len("--data.train_files=['"):-2]
    docs = datasets.load_dataset("json", data_files=[train], split="train", cache_dir=str(tmp_path / "hf"))
    extra = []
    if layout == "Dataset":
        docs.save_to_disk(str(saved))
    else:
        datasets.DatasetDict({"train": docs, "validation": docs.select(range(8))}).save_to_disk(str(saved))
        extra = ["--data.val_split=validation"]
    overrides = _without_files(base_overrides(tiny_data, out, f"--data.dataset_name={saved}", *extra,
                                              "--run.max_steps=1", "--optim.warmup_steps=1",
                                              f"--data.cache_dir={tmp_path / 'cache'}"))
    proc = _launch(tmp_path, overrides, "save_to_disk")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert len((out / "metrics.jsonl").read_text().splitlines()) >= 1
    # The token caches built: the train split's 24 documents, and the 8 of the DatasetDict's validation split.
    docs_cached = sorted(json.loads(m.read_text())["num_docs"] for m in (tmp_path / "cache").glob("*/meta.json"))
    assert docs_cached == ([24] if layout == "Dataset" else [8, 24]), docs_cached


def _checkpoint_of(config_overrides: list[str], out: Path, step: int) -> None:
    """A run's record and a checkpoint tag as a run with ``config_overrides`` leaves them
    (the refusal comes before any weight is read, so no shard is needed)."""
    cfg = load_config(None, config_overrides)
    write_resolved(cfg, out)
    tag_dir = out / "checkpoints" / tag_for_step(step)
    write_resolved(cfg, tag_dir)
    (tag_dir / "trainer_state.json").write_text(json.dumps({"step": step}))
    (out / "checkpoints" / "latest").write_text(tag_for_step(step))
    (out / "metrics.jsonl").write_text(json.dumps({"step": step, "loss": 5.0}) + "\n")


def test_resume_config_mismatch_exits_2_and_changes_nothing_on_disk(tiny_data, tmp_path):
    out = tmp_path / "run"
    _checkpoint_of(base_overrides(tiny_data, out, "--model.num_layers=3"), out, step=2)
    before = _snapshot(out)
    proc = _launch(tmp_path, base_overrides(tiny_data, out, "--checkpoint.resume=auto"), "resume_mismatch")
    assert_refused(proc, "resume", "[model].num_layers: checkpoint 3, this config 2", out)
    assert _snapshot(out) == before  # config.resolved.* still describe the checkpoint's run


@pytest.fixture(scope="module")
def other_tokenizer(tiny_data, tmp_path_factory) -> Path:
    """Another 512-piece tokenizer of the same corpus (fewer sentences): same size, other token ids."""
    train = next(o for o in tiny_data if o.startswith("--data.train_files="))[len("--data.train_files=['"):-2]
    prefix = tmp_path_factory.mktemp("other_tok") / "other"
    train_tokenizer([train], prefix, vocab_size=512, input_sentence_size=200)
    return prefix.with_suffix(".model")


@pytest.mark.parametrize("case", ["existing", "trained_in_setup"])
def test_resume_with_another_tokenizer_exits_2_and_changes_nothing_on_disk(tiny_data, other_tokenizer, tmp_path,
                                                                           case):
    """The checkpoint's tokenizer.model is the other one; this config's is the run's own: an existing
    file (refused before the data), or one the data preparation trains (refused after it, before a step)."""
    out = tmp_path / "run"
    overrides = base_overrides(tiny_data, out, "--checkpoint.resume=auto")
    _checkpoint_of(overrides, out, step=2)
    shutil.copy2(other_tokenizer, out / "checkpoints" / tag_for_step(2) / "tokenizer.model")
    if case == "trained_in_setup":
        overrides.append(f"--tokenizer.model_path={tmp_path / 'new_tok.model'}")
    before = _snapshot(out)
    proc = _launch(tmp_path, overrides, f"resume_tokenizer_{case}")
    assert_refused(proc, "resume", "is another tokenizer than the one the checkpoint was trained with", out)
    assert "[model].init_from" in proc.stdout + proc.stderr
    assert _snapshot(out) == before


def test_a_bug_exits_1_with_its_traceback_and_failure_file(tiny_data, tmp_path):
    """Not a refusal: an error raised inside training (here an injected one)."""
    out = tmp_path / "run"
    proc = _launch(tmp_path, base_overrides(tiny_data, out, "--run.max_steps=1", "--optim.warmup_steps=1"), "bug",
                   PLSH_FAULT="raise:0:1:in_step")
    text = proc.stdout + proc.stderr
    assert proc.returncode == 1, text[-3000:]
    assert "rank 0 failed: RuntimeError: injected fault" in text and "Traceback" in text
    assert (out / "failures" / "rank_0.txt").is_file()
    assert not (out / "run.lock").exists()  # the error left train() through the lock's release


def test_two_ranks_refuse_empty_data_with_one_message(tiny_data, tmp_path):
    """Rank 0 builds the cache and shares its verdict: both ranks exit 2, rank 0 alone prints."""
    out, cache, empty = tmp_path / "run", tmp_path / "cache", tmp_path / "empty.txt"
    empty.write_text("")
    overrides = base_overrides(tiny_data, out, f"--data.train_files=['{empty}']", f"--data.cache_dir={cache}")
    proc = run(deepspeed_cmd(2, empty_config(tmp_path), overrides), launcher_env(), tmp_path / "logs", "two_ranks",
               _TIMEOUT_S)
    assert_refused(proc, "data", f"no usable data file among ['{empty}']", out)
    assert not out.exists() and [p for p in cache.rglob("*") if p.is_file()] == []


def test_two_ranks_refuse_a_bad_config_with_one_message(tiny_data, tmp_path):
    """load_config refuses on every rank before any process group: the node's first rank prints."""
    out = tmp_path / "run"
    overrides = base_overrides(tiny_data, out, "--parallel.sp_size=2", "--data.seq_len=129")
    proc = run(deepspeed_cmd(2, empty_config(tmp_path), overrides), launcher_env(), tmp_path / "logs", "two_ranks_cfg",
               _TIMEOUT_S)
    assert_refused(proc, "config", "[data].seq_len=129 is not divisible by [parallel].sp_size=2", out)
    assert not out.exists()
