"""The progress line a log file gets (stderr not a terminal): the bar's elapsed time and ETA,
counted from this call's steps (a resumed run's earlier steps and the start-up before the
logger do not count)."""

from __future__ import annotations

from plsh_dist.train.metrics_log import MetricsLogger


def test_log_line_has_elapsed_and_eta_of_this_calls_steps(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PLSH_PROGRESS", "1")  # the training tests' conftest turns progress off
    now = [100.0]
    log = MetricsLogger(tmp_path, enabled=True, tensorboard=False, progress=True, total_steps=20, initial_step=10,
                        clock=lambda: now[0])
    now[0] = 112.0  # resumed at step 10: the first step of this call took 12 s
    log.advance(1, {"loss": "7.254"}, line=True)
    now[0] = 118.0
    log.advance(1, {"loss": "7.1"})  # not a logged step: no line
    now[0] = 124.0
    log.advance(1, {"loss": "7.0", "lr": "3.00e-04"}, line=True)
    log.close()
    assert capsys.readouterr().err.splitlines() == [
        "train step 11/20: loss 7.254  elapsed 00:12  ETA 01:48",  # 9 steps left at 12 s each
        "train step 13/20: loss 7.0  lr 3.00e-04  elapsed 00:24  ETA 00:56",  # 7 left at 8 s each
    ]
