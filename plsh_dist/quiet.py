"""Third-party notices that say nothing to a plsh_dist user, silenced one by one at their source.

Each filter matches one message of one emitter (a ``warnings`` filter by
category and message, or a ``logging.Filter`` on the emitting logger), so any
other warning of the same libraries still shows. Installed when ``plsh_dist``
is imported (``install``; idempotent), before DeepSpeed or torch.distributed
emit them.

- DeepSpeed's ``Setting accelerator to CPU. If you have GPU or other
  accelerator, we were unable to detect it.`` (logger ``DeepSpeed``, on import
  wherever ``DS_ACCELERATOR`` is unset and no GPU is found): the run's summary
  names the device it trains on.
- DeepSpeed's ``MPU is not provided, setting tp size to 1 in checkpoint
  loading.`` (logger ``DeepSpeed``, on every resume at another shape, through
  its universal checkpoint): plsh_dist has no tensor parallelism and gives
  DeepSpeed no ``mpu`` on purpose (docs/sequence-parallelism.md).
- torch's ``FutureWarning: `torch.distributed.all_gather_into_tensor` is
  deprecated`` once per rank: DeepSpeed's ZeRO calls it, not plsh_dist.
- torch's ``FutureWarning: `torch.distributed.reduce_scatter_tensor` is
  deprecated`` (two lines, at every ZeRO-3 step): DeepSpeed's ZeRO-3 reduces its
  gradient partitions with it, not plsh_dist.
"""

from __future__ import annotations

import logging
import warnings

_DEEPSPEED_NOTICES = frozenset({
    "Setting accelerator to CPU. If you have GPU or other accelerator, we were unable to detect it.",
    "MPU is not provided, setting tp size to 1 in checkpoint loading.",
})


class _DropMessages(logging.Filter):
    """Drops the records whose message is exactly one of ``messages``."""

    def __init__(self, messages: frozenset[str]):
        super().__init__()
        self.messages = messages

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() not in self.messages


def install() -> None:
    """Add the filters of the module doc (once)."""
    deepspeed_logger = logging.getLogger("DeepSpeed")  # deepspeed.utils.logging's logger, made or found by name
    if not any(isinstance(f, _DropMessages) for f in deepspeed_logger.filters):
        deepspeed_logger.addFilter(_DropMessages(_DEEPSPEED_NOTICES))
    for function in ("all_gather_into_tensor", "reduce_scatter_tensor"):
        warnings.filterwarnings("ignore", message=rf"`torch\.distributed\.{function}` is deprecated",
                                category=FutureWarning)
