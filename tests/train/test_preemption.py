"""Preemption: SIGTERM / SIGUSR1 -> every rank finishes its step, checkpoints, exits 75 (fast tests).

- The handler only sets a flag, is removed afterwards, and ``save_on_signal`` is validated.
- A signal during a checkpoint write (a stand-in engine that signals its own
  process while it writes its shard): the save finishes and publishes, the
  previous checkpoint is untouched; if the process then dies before the
  publish, the last published checkpoint and ``latest`` are intact.
- Two spawned ranks run ``launchers/pretrain.py``'s ``main`` (the launcher's
  code, without its process start-up): rank 1 alone gets SIGUSR1 during
  step 3 -> both ranks stop after step 3, checkpoint it and return 75; the
  resumed run gets SIGTERM during the periodic checkpoint of step 4 -> that
  checkpoint is published and the run stops there (no step 5); the next
  resume finishes, and the per-step losses and grad norms of the three
  pieces equal an uninterrupted run's exactly.

The same through the real deepspeed / torchrun launchers with signals sent
from outside: test_preemption_launcher.py (slow).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import signal
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from plsh_dist.checkpoint.line import checkpoint_root, complete_tags, tag_for_step
from plsh_dist.checkpoint.manifest import verify_manifest
from plsh_dist.checkpoint.tags import find_resume, save_checkpoint
from plsh_dist.config import RunConfig, load_config
from plsh_dist.distributed.ports import free_port
from plsh_dist.train.preemption import EXIT_PREEMPTED, STOP_SIGNALS, handle_stop_signals
from tests.launchers import load_launcher
from tests.train.conftest import base_overrides
from tests.train.launcher_runs import empty_config

# --------------------------------------------------------------- the handler


def test_handler_only_records_the_signal_and_is_removed_afterwards():
    before = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    with handle_stop_signals() as stop:
        assert not stop.requested
        os.kill(os.getpid(), signal.SIGUSR1)  # would end pytest without the handler
        assert stop.signum == signal.SIGUSR1 and stop.name == "SIGUSR1"
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # before the first step: ends the rank at once
        stop.arm()  # the first step begins
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.name == "SIGTERM"
    assert {sig: signal.getsignal(sig) for sig in STOP_SIGNALS} == before


def test_disabled_handler_gives_the_default_action_even_where_the_parent_ignored_it():
    """save_on_signal = false: the signals kill the process, also under a wrapper that
    left them ignored (slurm_pretrain.sh starts torchrun, hence the ranks, with SIGUSR1 ignored)."""
    before = {sig: signal.signal(sig, signal.SIG_IGN) for sig in STOP_SIGNALS}
    try:
        with handle_stop_signals(enabled=False) as stop:
            assert all(signal.getsignal(sig) == signal.SIG_DFL for sig in STOP_SIGNALS)
            assert not stop.requested
        assert all(signal.getsignal(sig) == signal.SIG_IGN for sig in STOP_SIGNALS)  # restored
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def test_save_on_signal_is_a_documented_validated_bool():
    assert load_config(None, []).checkpoint.save_on_signal is True
    assert load_config(None, ["--checkpoint.save_on_signal=false"]).checkpoint.save_on_signal is False
    with pytest.raises(ValueError, match=r"\[checkpoint\]\.save_on_signal must be a bool"):
        load_config(None, ["--checkpoint.save_on_signal=1"])


# --------------------------------------------------------------- a signal during a checkpoint write


class _SignallingEngine:
    """Writes one shard the way DeepSpeed does and sends its own process ``sig`` halfway
    through the write; ``die_after`` then raises, as a process the scheduler killed
    before the publish would stop there (nothing after the fault point runs)."""

    def __init__(self, sig: int | None = None, die_after: bool = False):
        self.sig, self.die_after = sig, die_after

    def save_checkpoint(self, root, tag, client_state, save_latest):
        path = Path(root) / tag
        path.mkdir(parents=True, exist_ok=True)
        with open(path / "mp_rank_00_model_states.pt", "wb") as fh:
            torch.save({"module": {"w": torch.arange(1000.0)}, **client_state}, fh)
            fh.flush()
            if self.sig is not None:
                os.kill(os.getpid(), self.sig)
            fh.write(b"")  # the write goes on after the signal
        if self.die_after:
            raise RuntimeError("killed before the publish")


def _cfg(tmp_path, keep_last: int) -> RunConfig:
    cfg = RunConfig()
    cfg.run.out_dir = str(tmp_path / "run")
    cfg.checkpoint.keep_last = keep_last
    return cfg


def _save(cfg, step, engine):
    return save_checkpoint(engine, cfg, step, {"step": step}, tokenizer_path="/nonexistent/tok.model")


def _digests(tag_dir: Path) -> dict[str, str]:
    return {str(p.relative_to(tag_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(tag_dir.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1], ids=["SIGTERM", "SIGUSR1"])
def test_signal_during_checkpoint_write_finishes_the_save_and_keeps_the_previous_one(tmp_path, sig):
    cfg = _cfg(tmp_path, keep_last=2)
    previous = _save(cfg, 2, _SignallingEngine())
    before = _digests(previous)
    with handle_stop_signals() as stop:
        stop.arm()  # a periodic checkpoint: training has begun
        tag_dir = _save(cfg, 4, _SignallingEngine(sig))
    assert stop.signum == sig  # recorded, and nothing else happened
    root = checkpoint_root(cfg.run.out_dir)
    assert complete_tags(root) == [tag_for_step(2), tag_for_step(4)]
    assert (root / "latest").read_text() == tag_for_step(4)
    assert verify_manifest(tag_dir) == [] and verify_manifest(previous) == []
    assert _digests(previous) == before
    assert sorted(p.name for p in root.iterdir()) == ["latest", tag_for_step(2), tag_for_step(4)]  # no .partial


def test_signal_then_death_during_checkpoint_write_keeps_the_last_published_one(tmp_path):
    cfg = _cfg(tmp_path, keep_last=1)
    previous = _save(cfg, 2, _SignallingEngine())
    before = _digests(previous)
    with handle_stop_signals() as stop, pytest.raises(RuntimeError, match="killed before the publish"):
        stop.arm()
        _save(cfg, 4, _SignallingEngine(signal.SIGTERM, die_after=True))
    assert stop.requested
    root = checkpoint_root(cfg.run.out_dir)
    assert complete_tags(root) == [tag_for_step(2)]
    assert (root / "latest").read_text() == tag_for_step(2)
    assert _digests(previous) == before and verify_manifest(previous) == []
    assert find_resume("auto", cfg.run.out_dir) == (root, tag_for_step(2))


# --------------------------------------------------------------- the loop, two ranks

_STEPS = 6
_COMMON = ["--attention.bias=plsh", "--attention.num_samples=2", "--parallel.sp_size=2", "--deepspeed.zero_stage=1",
           f"--run.max_steps={_STEPS}", "--checkpoint.every_steps=2", "--checkpoint.keep_last=0",
           "--logging.every_steps=1", "--logging.eval_batches=0"]


def _load_pretrain():
    return load_launcher("pretrain")


def _worker(rank: int, world: int, port: int, runs: list[tuple[list[str], str | None]], out) -> None:
    """Each run: ``launchers/pretrain.py``'s ``main(argv)`` with ``PLSH_FAULT`` set as given."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), DS_ACCELERATOR="cpu")
    torch.set_num_threads(1)
    pretrain = _load_pretrain()
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        results = []
        for argv, fault in runs:
            os.environ.pop("PLSH_FAULT", None)
            if fault:
                os.environ["PLSH_FAULT"] = fault
            text = io.StringIO()
            with contextlib.redirect_stdout(text):
                code = pretrain.main(argv)
            results.append({"code": code, "stdout": text.getvalue()})
        out[rank] = results
    finally:
        dist.destroy_process_group()


def _step_metrics(out_dir: Path) -> dict[int, tuple]:
    records = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: (r["loss"], r["grad_norm"], r["lr"]) for r in records if "loss" in r}


def test_signal_stops_every_rank_after_the_step_checkpoints_and_resumes_exactly(tiny_data, tmp_path):
    config = empty_config(tmp_path)
    cut, full = tmp_path / "cut", tmp_path / "full"

    def argv(out, resume):
        return ["--config", str(config), *base_overrides(tiny_data, out, *_COMMON, f"--checkpoint.resume={resume}")]

    runs = [
        (argv(cut, "never"), "sigusr1:1:3:in_step"),      # rank 1 only, during step 3
        (argv(cut, "auto"), "sigterm:0:4:in_checkpoint"),  # rank 0, inside step 4's periodic save
        (argv(cut, "auto"), None),
        (argv(full, "never"), None),                       # the uninterrupted run
    ]
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_worker, args=(2, free_port(), runs, out), nprocs=2)
        ranks = [list(out[r]) for r in range(2)]
    root = checkpoint_root(cut)

    # 1. SIGUSR1 on rank 1 during step 3: both ranks finish step 3, save it, return 75.
    assert [r[0]["code"] for r in ranks] == [EXIT_PREEMPTED, EXIT_PREEMPTED]
    line = f"preempted at step 3 (a stop signal on 1 of 2 rank(s)): checkpoint {root / tag_for_step(3)} written"
    assert line in ranks[0][0]["stdout"], ranks[0][0]["stdout"]
    assert "preempted" not in ranks[1][0]["stdout"]  # one line, from rank 0

    # 2. SIGTERM inside step 4's periodic save: it is published and the run stops there.
    assert [r[1]["code"] for r in ranks] == [EXIT_PREEMPTED, EXIT_PREEMPTED]
    assert (f"preempted at step 4 (SIGTERM on 1 of 2 rank(s)): checkpoint {root / tag_for_step(4)} written"
            in ranks[0][1]["stdout"])
    assert json.loads((root / tag_for_step(4) / "trainer_state.json").read_text())["step"] == 4
    for step in (2, 3, 4):
        assert verify_manifest(root / tag_for_step(step)) == []

    # 3. The last piece finishes; the pieces together are the uninterrupted run.
    assert [r[2]["code"] for r in ranks] == [0, 0] and [r[3]["code"] for r in ranks] == [0, 0]
    assert complete_tags(root) == [tag_for_step(s) for s in (2, 3, 4, _STEPS)]
    cut_metrics, full_metrics = _step_metrics(cut), _step_metrics(full)
    assert sorted(cut_metrics) == list(range(1, _STEPS + 1))
    assert cut_metrics == full_metrics  # exact: losses, grad norms, learning rates
