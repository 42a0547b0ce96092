"""Training outputs on rank 0: metrics.jsonl, tensorboard scalars, progress, start-up summary, MFU's peak.

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
from typing import Any, Callable

import torch

from plsh_dist.progress import elapsed_eta


def memory_mb(device: torch.device) -> float:
    """Peak memory of this process in MiB: max allocated on CUDA, max RSS on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    # ru_maxrss is KiB on Linux, bytes on macOS.
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / (2**20 if sys.platform == "darwin" else 2**10)


PEAK_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "H800": 989.0, "A100": 312.0, "A800": 312.0}
"""Dense bf16 tensor-core peak TFLOP/s per GPU (NVIDIA's datasheets, SXM; no sparsity), by a
word of ``torch.cuda.get_device_name``. [logging].peak_tflops overrides it (other GPUs, PCIe
parts, fp32 runs)."""


def peak_flops(device: torch.device, precision: str, configured_tflops: float) -> tuple[float | None, str]:
    """``(peak FLOP/s of one device or None, where it comes from)`` for MFU.

    ``configured_tflops`` ([logging].peak_tflops) wins when > 0; else the table
    above for a bf16 run on a GPU it names. A CPU has no meaningful peak (its
    vector units, clock and threads vary; the run shares them), nor an fp32 GPU run
    in the table: MFU is then not logged, only the achieved TFLOP/s."""
    if configured_tflops > 0:
        return configured_tflops * 1e12, f"{configured_tflops:g} TFLOP/s per device ([logging].peak_tflops)"
    if device.type != "cuda":
        return None, ("none for a CPU: only the achieved TFLOP/s is logged (set [logging].peak_tflops for "
                      "an MFU)")
    name = torch.cuda.get_device_name(device)
    words = name.replace("-", " ").upper().split()
    known = next((gpu for gpu in PEAK_BF16_TFLOPS if gpu in words), None)
    if known is None or precision != "bf16":
        why = f"{name} is not in the table" if known is None else f"a {precision} run"
        return None, f"unknown ({why}): only the achieved TFLOP/s is logged (set [logging].peak_tflops for an MFU)"
    return PEAK_BF16_TFLOPS[known] * 1e12, f"{PEAK_BF16_TFLOPS[known]:g} TFLOP/s per device ({name}, bf16 dense)"


def startup_summary(info: dict[str, Any]) -> str:
    """Readable block of what the run is (printed once by rank 0)."""
    width = max(len(k) for k in info)
    lines = ["=" * 60, "plsh_dist pretraining"] + [f"  {k:<{width}} : {v}" for k, v in info.items()] + ["=" * 60]
    return "\n".join(lines)


class MetricsLogger:
    """Appends one JSON object per logged step to ``out_dir/metrics.jsonl`` and
    mirrors numeric values to tensorboard (``out_dir/tensorboard``)."""

    def __init__(self, out_dir: str | Path, *, enabled: bool, tensorboard: bool, progress: bool,
                 total_steps: int, initial_step: int = 0, clock: Callable[[], float] = time.monotonic):
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
        # Progress goes to stderr so stdout stays greppable for summaries: a bar on a terminal;
        # in a log file (stderr not a terminal) a bar's redraws pile up, so one line per logged step.
        self._total = total_steps
        self._lines = progress and os.environ.get("PLSH_PROGRESS", "1") != "0" and not sys.stderr.isatty()
        if progress and not self._lines:
            from tqdm import tqdm

            self._bar = tqdm(total=total_steps, initial=initial_step, desc="train", unit="step",
                             dynamic_ncols=True, file=sys.stderr, mininterval=2.0,
                             disable=os.environ.get("PLSH_PROGRESS", "1") == "0")
        self._step = initial_step
        self._t0 = time.time()
        # The progress line's elapsed time and ETA count this call's steps from here, as the bar
        # does: the engine is built and a resume loaded; a resumed run's earlier steps do not count.
        self._initial, self._clock = initial_step, clock
        self._started = clock()

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

    def advance(self, n: int, postfix: dict[str, Any] | None = None, *, line: bool = False) -> None:
        """``n`` more steps done; ``postfix``: the bar's values, or with ``line`` (a logged step) the
        progress line's when stderr is not a terminal (``train step 3/5: loss 7.254  lr ...  elapsed
        00:12  ETA 00:08``, the bar's times: ``plsh_dist.progress.elapsed_eta``)."""
        if not self.enabled:
            return
        self._step += n
        if self._bar is not None:
            self._bar.update(n)
            if postfix:
                self._bar.set_postfix(postfix, refresh=False)
        elif self._lines and line:
            values = "".join(f"{k} {v}  " for k, v in (postfix or {}).items())
            times = elapsed_eta(self._step - self._initial, self._total - self._initial,
                                self._clock() - self._started)
            print(f"train step {self._step}/{self._total}: {values}{times}", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        if self._tb is not None:
            self._tb.close()
        if self._fh is not None:
            self._fh.close()
