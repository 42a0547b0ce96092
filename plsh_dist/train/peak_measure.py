"""Measured peak memory of a real training run on CPU, to hold the planner's estimate against.

``measure_cpu_peak(cfg, steps=2)`` runs the trainer's own ``setup`` and
``train_step`` (one process, gloo, the DeepSpeed engine, fp32) under
``peak_cpu_bytes``: the peak of live torch CPU bytes from before the model
is built to the end of the last step (weights, DeepSpeed's buffers,
optimizer states, activations, the loss, the attention's temporaries), the
CPU counterpart of ``torch.cuda.max_memory_allocated``. Two steps, so the
optimizer states a first step creates are present in the second. Data must
be prepared already (``plsh_dist.data.prepare_data``): tokenising is not
part of a step.

The run is a scratch one: it writes only to a temporary directory of its
own, removed after (``[run].out_dir`` replaced, never resumed, no
checkpoint, export or tensorboard), so measuring never moves aside,
resumes or writes the config's out_dir.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile

from plsh_dist.plan.memory_measure import peak_cpu_bytes
from plsh_dist.train.loop import setup, train_step


def measure_cpu_peak(cfg, steps: int = 2) -> int:
    """Peak live CPU tensor bytes of ``setup(cfg)`` + ``steps`` optimizer steps; initialises
    a 1-process group when none is up. ``cfg.run.device`` must be "cpu"."""
    if cfg.run.device != "cpu":
        raise ValueError(f'measure_cpu_peak runs on CPU: set [run].device = "cpu" (got {cfg.run.device!r})')
    os.environ.setdefault("DS_ACCELERATOR", "cpu")

    with tempfile.TemporaryDirectory(prefix="plsh_measure_") as scratch:
        scratch_cfg = dataclasses.replace(
            cfg, run=dataclasses.replace(cfg.run, out_dir=os.path.join(scratch, "run")),
            checkpoint=dataclasses.replace(cfg.checkpoint, resume="never", every_steps=0, export_safetensors=False),
            logging=dataclasses.replace(cfg.logging, tensorboard=False, progress=False))

        def run() -> None:
            session = setup(scratch_cfg)
            session.engine.train()
            for step in range(steps):
                train_step(session, step)
            session.log.close()

        return peak_cpu_bytes(run)[1]
