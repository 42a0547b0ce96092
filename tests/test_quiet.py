"""plsh_dist/quiet.py: ZeRO-3's per-step ``reduce_scatter_tensor is deprecated`` FutureWarning is
silenced by its exact message and category, as torch emits it for the function DeepSpeed calls;
any other warning, that message in another category included, still shows."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.distributed as dist

from plsh_dist import quiet


def test_zero3_reduce_scatter_notice_is_silenced_and_only_it():
    from deepspeed.comm.torch import TorchBackend

    assert TorchBackend.get_reduce_scatter_function() is dist.reduce_scatter_tensor  # what ZeRO-3 calls
    message = dist.reduce_scatter_tensor.__deprecated__  # torch's own text
    assert message.startswith("`torch.distributed.reduce_scatter_tensor` is deprecated")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")  # every warning shows, unless a filter of quiet drops it
        quiet.install()
        with pytest.raises(ValueError):  # no process group: torch warns on the call, then refuses it
            dist.reduce_scatter_tensor(torch.zeros(1), torch.zeros(1))
        warnings.warn(message, UserWarning)
        warnings.warn("`torch.distributed.reduce_scatter_single` is deprecated.", FutureWarning)
        warnings.warn("`torch.distributed.reduce_op` is deprecated, please use ReduceOp", FutureWarning)
    assert [(w.category, str(w.message)) for w in seen] == [
        (UserWarning, message),
        (FutureWarning, "`torch.distributed.reduce_scatter_single` is deprecated."),
        (FutureWarning, "`torch.distributed.reduce_op` is deprecated, please use ReduceOp"),
    ]


def test_deepspeed_notices_are_dropped_by_their_exact_text_and_only_they():
    """DeepSpeed's logger drops its CPU-accelerator notice and the universal checkpoint's "MPU is not
    provided" (plsh_dist gives no mpu on purpose); another message of that logger still shows."""
    import logging

    import plsh_dist  # noqa: F401  (installs the filters)

    logger = logging.getLogger("DeepSpeed")
    seen = []
    handler = logging.Handler()
    handler.emit = seen.append
    logger.addHandler(handler)
    try:
        logger.warning("MPU is not provided, setting tp size to 1 in checkpoint loading.")
        logger.warning("Setting accelerator to CPU. If you have GPU or other accelerator, we were unable to detect it.")
        logger.warning("MPU is not provided, and something else.")
    finally:
        logger.removeHandler(handler)
    assert [r.getMessage() for r in seen] == ["MPU is not provided, and something else."]
