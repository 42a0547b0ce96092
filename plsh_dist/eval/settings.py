"""What an extrapolation evaluation measures: one documented settings object.

    settings = EvalSettings(lengths=[256, 512, 1024], modes="plsh:s=4,alibi,none", scorings=("last",),
                            last_tokens=128, reference="alibi")
    results = evaluate_checkpoint("runs/quickstart", settings, out_dir="runs/quickstart/extrapolation")

``evaluate_checkpoint`` reads all of it; ``evaluate_model`` (a model already
loaded, tokens already read) reads what scores windows: every field but
``data``, ``split`` and ``reference``. Bad values fail here, before any
checkpoint is loaded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from plsh_dist.eval.mode_specs import EvalMode, parse_modes
from plsh_dist.eval.scoring import mean_ci


@dataclass
class EvalSettings:
    """Lengths, modes, scoring and uncertainty of one evaluation (``launchers/evaluate.py``'s flags)."""

    lengths: Sequence[int]
    """Context lengths L (tokens)."""
    modes: Sequence[EvalMode] | str
    """Attention modes: ``EvalMode`` list or a spec string (``"plsh:s=8,alibi"``, see
    :mod:`plsh_dist.eval.mode_specs`); parsed here into a list."""
    seeds: Sequence[int] = (0, 1, 2)
    """Hash seeds of stochastic (PLSH) modes: mean and sample std over them."""
    scorings: Sequence[str] = ("whole",)
    """``"whole"`` (every token of a window) and/or ``"last"`` (its last ``last_tokens``)."""
    last_tokens: int | None = None
    """K of ``"last"`` scoring (the paper: 8192); a length shorter than K has no ``"last"`` row."""
    max_windows: int | None = 16
    """Windows per (length, scoring); None = all the data fills."""
    align: bool = True
    """``"last"`` windows of every length end where the longest length's scored span
    ends (every length scores the same target tokens)."""
    ci: str = "se"
    """Confidence interval over windows: ``"se"`` (t x standard error) or ``"bootstrap"``."""
    ci_level: float = 0.95
    bootstrap_resamples: int = 2000
    reference: str | None = None
    """A mode name: every other mode is paired with it (perplexity ratio over the same windows)."""
    document_masking: bool = False
    """Attend within documents only (each ends with EOS); off by default, comparable with
    earlier results and the paper's protocol."""
    data: str | None = None
    """None = the checkpoint's own split ``split``; else files or globs (comma-separated)
    or a ``datasets`` name (``owner/name[:config]``)."""
    split: str = "val"
    """Split of the checkpoint's data or of a ``datasets`` name."""
    progress: bool = True
    """Progress on rank 0's stderr: a bar on a terminal, else a plain line every 30 s and at the end."""

    def __post_init__(self) -> None:
        self.modes = parse_modes(self.modes) if isinstance(self.modes, str) else list(self.modes)
        try:
            self.lengths = [int(x) for x in self.lengths]
        except (TypeError, ValueError):
            raise ValueError(f"lengths must be integers, got {self.lengths!r}") from None
        if not self.lengths or min(self.lengths) < 1:
            raise ValueError(f"lengths needs integers >= 1, got {self.lengths!r}")
        self.seeds = [int(s) for s in self.seeds]
        if not self.seeds:
            raise ValueError("seeds must name at least one hash seed, e.g. seeds=(0, 1, 2)")
        self.scorings = list(self.scorings)
        mean_ci([0.0, 1.0], **self.ci_args)  # bad ci options fail before any work
        names = [m.name for m in self.modes]
        if self.reference is not None and self.reference not in names:
            raise ValueError(f"reference mode {self.reference!r} is not one of the evaluated modes {names}")

    @property
    def ci_args(self) -> dict[str, Any]:
        """Keyword arguments of ``scoring.mean_ci`` / ``paired_ci``."""
        return {"method": self.ci, "level": self.ci_level, "resamples": self.bootstrap_resamples}
