"""Progress for terminals and for logs: a tqdm bar on a terminal, plain lines anywhere else.

A bar redraws itself with carriage returns; in a file (CI, Slurm, ``> log``) the redraws
pile up into one huge line. So where the stream is not a terminal, progress is a line of
its own, with what the bar shows: done / total, elapsed time and ETA (tqdm's clock format,
``MM:SS`` or ``H:MM:SS``), counted from the first unit of this call.

    bar = progress_bar(total=48, desc="extrapolation", unit="window")
    bar.update(1); bar.set_postfix_str("alibi L=256"); bar.close()

Training's progress line (``plsh_dist.train.metrics_log``) prints at its logged steps and
takes ``elapsed_eta`` from here.
"""

from __future__ import annotations

import sys
import time
from typing import Callable, TextIO

from tqdm import tqdm


def elapsed_eta(done: int, total: int | None, elapsed_s: float) -> str:
    """``"elapsed 00:12  ETA 00:08"``: the time so far, and the rest at this call's rate
    (``done`` units in ``elapsed_s``); ``ETA ?`` before the first unit or without a total."""
    left = max(total - done, 0) if total is not None else 0
    eta = tqdm.format_interval(elapsed_s / done * left) if done > 0 and total is not None else "?"
    return f"elapsed {tqdm.format_interval(elapsed_s)}  ETA {eta}"


class LineProgress:
    """tqdm's ``update`` / ``set_postfix_str`` / ``close`` as plain lines: one when ``interval_s``
    has passed since the last (the first unit included), and one at ``close``.

    ``desc: 12/48 window (25%)  elapsed 00:10  ETA 00:30  alibi L=256``; with ``unit_scale``
    (bytes, say) the counts are scaled as tqdm scales them and the rate is shown:
    ``tokenizing: 12.6MB/50.3MB (25%)  3.52MB/s  elapsed 00:03  ETA 00:10``
    """

    def __init__(self, total: int | None, desc: str, unit: str, stream: TextIO, *, interval_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic, unit_scale: bool = False):
        self.total, self.desc, self.unit, self.stream = total, desc, unit, stream
        self.unit_scale = unit_scale
        self.interval_s, self.clock = interval_s, clock
        self.n = 0
        self.postfix = ""
        self._t0 = clock()
        self._printed_at: float | None = None  # clock of the last line
        self._printed_n = 0

    def set_postfix_str(self, text: str, refresh: bool = True) -> None:
        self.postfix = text

    def update(self, n: int = 1) -> None:
        self.n += n
        now = self.clock()
        if self._printed_at is None or now - self._printed_at >= self.interval_s:
            self._print(now)

    def close(self) -> None:
        if self.n != self._printed_n:
            self._print(self.clock())

    def line(self, now: float | None = None) -> str:
        """The line this progress prints now (``str(bar)`` of a tqdm bar says the same)."""
        now = self.clock() if now is None else now
        share = f" ({self.n / self.total:.0%})" if self.total else ""
        elapsed = elapsed_eta(self.n, self.total, now - self._t0)
        if self.unit_scale:
            size = lambda n: tqdm.format_sizeof(n) + self.unit  # noqa: E731
            rate = size(self.n / max(now - self._t0, 1e-9)) + "/s"
            total = size(self.total) if self.total is not None else "?"
            line = f"{self.desc}: {size(self.n)}/{total}{share}  {rate}  {elapsed}"
        else:
            line = f"{self.desc}: {self.n}/{self.total} {self.unit}{share}  {elapsed}"
        return line + (f"  {self.postfix}" if self.postfix else "")

    def _print(self, now: float) -> None:
        print(self.line(now), file=self.stream, flush=True)
        self._printed_at, self._printed_n = now, self.n


def progress_bar(total: int | None, desc: str, unit: str, *, stream: TextIO | None = None, interval_s: float = 30.0,
                 unit_scale: bool = False):
    """A tqdm bar when ``stream`` (default stderr) is a terminal, else a ``LineProgress``.
    ``unit_scale``: counts of ``unit`` scaled (``B`` -> kB, MB, GB) and the rate shown, in both."""
    stream = sys.stderr if stream is None else stream
    if stream.isatty():
        return tqdm(total=total, desc=desc, unit=unit, dynamic_ncols=True, file=stream, unit_scale=unit_scale)
    return LineProgress(total, desc, unit, stream, interval_s=interval_s, unit_scale=unit_scale)
