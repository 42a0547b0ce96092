"""What users of a pretraining launcher expect (issue 40, item 6), through the launcher and the run's outputs."""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from pathlib import Path

import pytest
import torch

from plsh_dist.config import load_config
from plsh_dist.plan import model_flops
from plsh_dist.train.metrics_log import peak_flops
from plsh_dist.train.preemption import handle_stop_signals
from tests.launchers import load_launcher
from tests.train.conftest import base_overrides
from tests.train.launcher_runs import PRETRAIN, Launch, empty_config, launcher_env, run
from tests.train.spawn import run_training


def test_help_says_both_override_spellings_work(capsys):
    with pytest.raises(SystemExit) as done:
        load_launcher("pretrain").main(["--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--section.key=value or --section.key value" in text, text[-600:]


@pytest.fixture(scope="module")
def own_data_run(tiny_data, tmp_path_factory):
    """A user's run: their own [data].train_files, an existing tokenizer, progress on, stderr a file (not a
    terminal), no DS_ACCELERATOR (DeepSpeed detects the CPU itself), a peak given for the MFU."""
    tmp = tmp_path_factory.mktemp("own_data")
    env = launcher_env(PLSH_PROGRESS="1")
    env.pop("DS_ACCELERATOR")
    overrides = base_overrides(tiny_data, tmp / "run", "--run.max_steps=3", "--logging.progress=true",
                               "--logging.peak_tflops=0.05")
    done = run([sys.executable, str(PRETRAIN), "--config", str(empty_config(tmp)), *overrides], env, tmp, "own",
               timeout_s=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done, tmp / "run", tiny_data


def _summary_value(stdout: str, key: str) -> str:
    return next(line.split(" : ", 1)[1] for line in stdout.splitlines() if line.strip().startswith(key + " "))


def test_mfu_in_progress_metrics_and_summary(own_data_run):
    done, out_dir, _ = own_data_run
    records = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "loss" in r]
    assert [r["step"] for r in steps] == [1, 2, 3]
    for r in steps:
        assert r["tflops"] > 0 and r["mfu"] == pytest.approx(r["tflops"] / 0.05, rel=1e-9)
    assert "peak 0.05 TFLOP/s per device ([logging].peak_tflops)" in _summary_value(done.stdout, "flops/step")
    assert "expected query-key pairs" in _summary_value(done.stdout, "flops/step")
    assert re.search(r"train step 3/3: loss \S+  lr \S+  tok/s \d+  TFLOP/s \S+  mfu \S+%", done.stderr), done.stderr


def test_no_peak_on_cpu_logs_achieved_tflops_only():
    assert peak_flops(torch.device("cpu"), "fp32", 0.0)[0] is None
    assert peak_flops(torch.device("cpu"), "fp32", 312.0)[0] == 312e12


def test_model_flops_count_plsh_band_not_dense():
    T, L, D, heads, rows = 8192, 4, 32, 4, 4  # the debug model at 8k: dense = 12 D per causal pair, layer, head
    cfg = load_config("configs/debug.toml", [f"--data.seq_len={T}"])
    dense = load_config("configs/debug.toml", [f"--data.seq_len={T}", "--attention.bias=alibi"])
    plsh, alibi = model_flops(cfg, world_size=1, device="cpu"), model_flops(dense, world_size=1, device="cpu")
    assert alibi.attention == 12 * D * T * (T + 1) / 2 * heads * L * rows
    assert plsh.rest == alibi.rest and 0 < plsh.attention < alibi.attention / 10


def test_progress_is_one_line_per_logged_step_in_a_log_file(own_data_run):
    done, _, _ = own_data_run
    assert "\r" not in done.stderr
    assert [line.split(":")[0] for line in done.stderr.splitlines() if line.startswith("train step")] == \
        ["train step 1/3", "train step 2/3", "train step 3/3"]


def test_no_third_party_noise(own_data_run):
    done, _, _ = own_data_run
    assert "Setting accelerator to CPU" not in done.stdout + done.stderr


def test_training_curves_written(own_data_run):
    done, out_dir, _ = own_data_run
    png = out_dir / "training_curves.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"outputs: {out_dir} (metrics.jsonl, training_curves.png" in done.stdout


def test_summary_names_the_tokenizer_and_why(own_data_run):
    done, _, tiny_data = own_data_run
    path = next(o.split("=", 1)[1] for o in tiny_data if o.startswith("--tokenizer.model_path="))
    line = _summary_value(done.stdout, "tokenizer")
    assert line.startswith(f"{path} (an existing file, 512 pieces, used as it is: not retrained on this run's data")
    assert "--tokenizer.model_path" in line


def test_summary_shows_the_corpus_report(own_data_run):
    done, _, _ = own_data_run
    for split in ("train", "val"):
        assert re.fullmatch(r"read 1 files; kept \d+ documents \([\d,]+ tokens\)(; .*)?",
                            _summary_value(done.stdout, f"data {split}")), done.stdout


def test_all_gather_deprecation_not_shown_by_two_ranks(tiny_data, tmp_path, capfd):
    run_training(2, base_overrides(tiny_data, tmp_path / "run", "--run.max_steps=1", "--optim.warmup_steps=1",
                                   "--logging.eval_batches=0", "--deepspeed.zero_stage=1"))
    assert "all_gather_into_tensor" not in capfd.readouterr().err


def test_ctrl_c_saves_a_checkpoint_and_exits_75(tiny_data, tmp_path):
    """With no periodic checkpoint ([checkpoint].every_steps = 0), Ctrl-C keeps what was trained."""
    out = tmp_path / "run"
    overrides = base_overrides(tiny_data, out, "--run.max_steps=100000", "--checkpoint.every_steps=0")
    launch = Launch([sys.executable, str(PRETRAIN), "--config", str(empty_config(tmp_path)), *overrides],
                    launcher_env(), tmp_path, "ctrl_c")
    metrics, deadline = out / "metrics.jsonl", time.time() + 240
    while not (metrics.is_file() and len(metrics.read_text().splitlines()) >= 2):  # two steps trained
        assert launch.proc.poll() is None and time.time() < deadline, launch.wait(1).stderr[-3000:]
        time.sleep(0.2)
    os.kill(launch.proc.pid, signal.SIGINT)
    done = launch.wait(240)
    assert done.returncode == 75, done.stderr[-3000:]
    assert "Ctrl-C: every rank finishes its step and writes a checkpoint" in done.stderr
    found = re.search(r"interrupted \(Ctrl-C\) at step (\d+) \(SIGINT on 1 of 1 rank\(s\)\): checkpoint (\S+) "
                      r"written", done.stdout)
    assert found, done.stdout[-2000:]
    assert Path(found[2]).name == f"step_{int(found[1]):08d}" == (out / "checkpoints" / "latest").read_text().strip()
    assert (out / "training_curves.png").is_file()


def test_ctrl_c_twice_aborts_and_before_the_first_step_at_once():
    with handle_stop_signals(True) as stop:
        with pytest.raises(KeyboardInterrupt):  # nothing trained yet: nothing to save
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
        stop.armed = True  # the loop's first step
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.1)
        assert stop.name == "SIGINT"
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
