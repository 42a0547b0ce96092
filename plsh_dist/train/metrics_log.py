"""Training outputs on rank 0: metrics.jsonl, tensorboard scalars, progress bar, start-up summary.

Every other rank gets a ``MetricsLogger`` whose methods do nothing, so the
loop calls them unconditionally.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

import torch


def memory_mb(device: torch.device) -> float:
    """Peak memory of this process in MiB: max allocated on CUDA, max RSS on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    # ru_maxrss is KiB on Linux, bytes on macOS.
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / (2**20 if sys.platform == "darwin" else 2**10)


def mfu(tokens_per_s: float, n_params: int, num_layers: int, hidden: int, seq_len: int,
        world_size: int, peak_flops: float) -> float:
    """Model FLOPs utilisation, nanoGPT/PaLM estimate: ``6 N + 12 L H T`` FLOPs per token
    (the attention term counts dense attention; PLSH does less, so this is an upper
    estimate of the work done) over ``world_size`` devices of ``peak_flops`` each."""
    flops_per_token = 6 * n_params + 12 * num_layers * hidden * seq_len
    return tokens_per_s * flops_per_token / (world_size * peak_flops)


def startup_summary(info: dict[str, Any]) -> str:
    """Readable block of what the run is (printed once by rank 0)."""
    width = max(len(k) for k in info)
    lines = ["=" * 60, "plsh_dist pretraining"] + [f"  {k:<{width}} : {v}" for k, v in info.items()] + ["=" * 60]
    return "\n".join(lines)


class MetricsLogger:
    """Appends one JSON object per logged step to ``out_dir/metrics.jsonl`` and
    mirrors numeric values to tensorboard (``out_dir/tensorboard``)."""

    def __init__(self, out_dir: str | Path, *, enabled: bool, tensorboard: bool, progress: bool,
                 total_steps: int, initial_step: int = 0):
        self.enabled = enabled
        self._tb = None
        self._bar = None
        self._fh = None
        if not enabled:
            return
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        self.metrics_path = out_dir / "metrics.jsonl"
        self._fh = self.metrics_path.open("a")
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(out_dir / "tensorboard"))
        if progress:
            from tqdm import tqdm

            # Progress goes to stderr so stdout stays greppable for summaries.
            self._bar = tqdm(total=total_steps, initial=initial_step, desc="train", unit="step",
                             dynamic_ncols=True, file=sys.stderr, mininterval=2.0,
                             disable=os.environ.get("PLSH_PROGRESS", "1") == "0")
        self._t0 = time.time()

    def truncate_after(self, step: int) -> None:
        """Keep only the records of steps <= ``step`` in metrics.jsonl."""
        if not self.enabled:
            return
        self._fh.close()
        kept = [line for line in self.metrics_path.read_text().splitlines()
                if line.strip() and json.loads(line)["step"] <= step]
        self.metrics_path.write_text("".join(line + "\n" for line in kept))
        self._fh = self.metrics_path.open("a")

    def print(self, text: str) -> None:
        if self.enabled:
            (self._bar.write if self._bar is not None else print)(text)
            sys.stdout.flush()

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        """Write ``{"step": step, **metrics}``; tensorboard gets every number under ``train/``
        (keys containing "/" keep their own prefix)."""
        if not self.enabled:
            return
        record = {"step": step, **metrics, "time_s": round(time.time() - self._t0, 3)}
        self._fh.write(json.dumps(record) + "\n")
        self._fh.flush()
        if self._tb is not None:
            for key, value in metrics.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    self._tb.add_scalar(key if "/" in key else f"train/{key}", value, step)
            self._tb.flush()

    def advance(self, n: int, postfix: dict[str, Any] | None = None) -> None:
        if self._bar is not None:
            self._bar.update(n)
            if postfix:
                self._bar.set_postfix(postfix, refresh=False)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        if self._tb is not None:
            self._tb.close()
        if self._fh is not None:
            self._fh.close()
