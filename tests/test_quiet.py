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
