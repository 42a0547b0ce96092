"""Matplotlib helpers shared by the evaluation tools (Agg backend: files only, no display)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import matplotlib

matplotlib.use("Agg")  # before pyplot: headless machines and CI have no display
import matplotlib.pyplot as plt  # noqa: E402


@dataclass
class Series:
    """One curve of a plot."""

    label: str
    """Legend entry."""
    x: Sequence[float]
    """Abscissae."""
    y: Sequence[float]
    """Ordinates, same length as ``x``."""
    yerr: Sequence[float] | None = None
    """Optional symmetric error bars (e.g. std over seeds), same length as ``x``."""
    ylow: Sequence[float] | None = None
    """Optional lower ends of asymmetric error bars (e.g. a confidence interval); needs ``yhigh``."""
    yhigh: Sequence[float] | None = None
    """Optional upper ends of asymmetric error bars; needs ``ylow``."""
    style: str = "-o"
    """Matplotlib format string: '-o' measured, '--' guides and bounds."""
    kwargs: dict = field(default_factory=dict)
    """Extra keyword arguments for ``plot`` / ``errorbar`` (color, alpha...)."""

    def __post_init__(self):
        if len(self.x) != len(self.y):
            raise ValueError(f"Series {self.label!r}: x has {len(self.x)} points, y has {len(self.y)}")
        if self.yerr is not None and len(self.yerr) != len(self.y):
            raise ValueError(f"Series {self.label!r}: yerr has {len(self.yerr)} points, y has {len(self.y)}")
        if (self.ylow is None) != (self.yhigh is None):
            raise ValueError(f"Series {self.label!r}: give both ylow and yhigh (an interval) or neither")
        if self.ylow is not None:
            if self.yerr is not None:
                raise ValueError(f"Series {self.label!r}: give yerr or ylow/yhigh, not both")
            if not len(self.ylow) == len(self.yhigh) == len(self.y):
                raise ValueError(f"Series {self.label!r}: ylow/yhigh need {len(self.y)} points each")


def _plain_log_ticks(ax, xs, ys, logx: bool, logy: bool) -> None:
    """Readable log axes: x ticks at the measured abscissae (few, e.g. context lengths) in plain
    numbers; y labels in plain numbers when the data span less than a decade (such a range has
    only minor ticks, which matplotlib labels as overlapping powers of ten)."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    plain = FuncFormatter(lambda v, _: f"{v:g}")
    if logx and xs and len(set(xs)) <= 12:
        ax.set_xticks(sorted(set(xs)))
        ax.xaxis.set_major_formatter(plain)
        ax.xaxis.set_minor_formatter(NullFormatter())
    if logy and ys and min(ys) > 0 and max(ys) / min(ys) < 10:
        ax.yaxis.set_major_formatter(plain)
        ax.yaxis.set_minor_formatter(plain)
        ax.tick_params(axis="y", which="minor", labelsize=7)


def line_plot(
    path: str | Path,
    panels: Sequence[tuple[str, Sequence[Series]]],
    xlabel: str,
    ylabel: str,
    logx: bool = True,
    logy: bool = True,
) -> Path:
    """Save one PNG with a row of panels ``(title, series)`` sharing axis labels."""
    if not panels:
        raise ValueError("line_plot needs at least one panel")
    fig, axes = plt.subplots(1, len(panels), figsize=(4.8 * len(panels), 4.0), squeeze=False)
    for ax, (title, series) in zip(axes[0], panels):
        for s in series:
            if s.ylow is not None:
                # y may sit a hair outside its interval (a mean over seeds of exp(loss) vs exp of the mean)
                err = [[max(0.0, y - lo) for y, lo in zip(s.y, s.ylow)],
                       [max(0.0, hi - y) for y, hi in zip(s.y, s.yhigh)]]
                ax.errorbar(s.x, s.y, yerr=err, fmt=s.style, label=s.label, capsize=2, ms=3, **s.kwargs)
            elif s.yerr is not None:
                ax.errorbar(s.x, s.y, yerr=s.yerr, fmt=s.style, label=s.label, capsize=2, ms=3, **s.kwargs)
            else:
                ax.plot(s.x, s.y, s.style, label=s.label, ms=3, **s.kwargs)
        ax.set_xscale("log" if logx else "linear")
        ax.set_yscale("log" if logy else "linear")
        _plain_log_ticks(ax, [x for s in series for x in s.x], [y for s in series for y in s.y], logx, logy)
        ax.set_title(title)
        ax.set_xlabel(xlabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel(ylabel)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
