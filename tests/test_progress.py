"""plsh_dist/progress.py: where the stream is not a terminal (a log file, CI, Slurm), progress is
plain lines at intervals, never carriage-return redraws; the evaluation's progress takes that form."""

from __future__ import annotations

import io

from plsh_dist.progress import LineProgress, elapsed_eta, progress_bar


def test_a_stream_that_is_no_terminal_gets_lines_at_intervals():
    stream = io.StringIO()
    assert isinstance(progress_bar(10, "eval", "window", stream=stream), LineProgress)
    now = [0.0]
    bar = LineProgress(10, "extrapolation", "window", stream, interval_s=30.0, clock=lambda: now[0])
    for _ in range(10):
        now[0] += 7.0
        bar.set_postfix_str("alibi L=256")
        bar.update(1)
    bar.close()
    text = stream.getvalue()
    assert "\r" not in text and text.endswith("\n")
    # The first unit, then one line once 30 s passed since the last, then the end.
    assert text.splitlines() == [
        "extrapolation: 1/10 window (10%)  elapsed 00:07  ETA 01:03  alibi L=256",
        "extrapolation: 6/10 window (60%)  elapsed 00:42  ETA 00:28  alibi L=256",
        "extrapolation: 10/10 window (100%)  elapsed 01:10  ETA 00:00  alibi L=256",
    ]


def test_elapsed_eta_before_any_unit():
    assert elapsed_eta(0, 5, 3.0) == "elapsed 00:03  ETA ?"
    assert elapsed_eta(2, 5, 3725.0) == "elapsed 1:02:05  ETA 1:33:07"
