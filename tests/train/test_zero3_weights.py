"""A ZeRO-3 checkpoint tag loads as a model: its per-rank fp32 shards gathered into whole parameters.

Before: ``load_model`` (and so ``convert_checkpoint.py``, evaluation and
generation) refused every ZeRO-3 tag ("holds no weights"); only the export
written at the end of training had the weights. The gather must equal
DeepSpeed's own ``zero_to_fp32`` (which unpickles unsafely, so it is used here
only as the reference) and the training's live gather into ``final/``.
hidden 63: the norm weights (63 elements) do not split evenly over the
2 ranks, so the padding of a partition is exercised.
"""

from __future__ import annotations

import shutil

import pytest
import torch

from tests.launchers import load_launcher
from tests.train.conftest import base_overrides
from tests.train.spawn import run_training

TAG = "step_00000001"


@pytest.fixture(scope="module")
def zero3_run(tiny_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("zero3") / "run"
    run_training(2, base_overrides(tiny_data, out, "--deepspeed.zero_stage=3", "--parallel.sp_size=2",
                                   "--run.max_steps=1", "--optim.warmup_steps=1",
                                   "--model.hidden_size=63", "--logging.eval_batches=0",
                                   "--checkpoint.export_safetensors=true"))
    return out


def test_gather_equals_deepspeeds_own_and_the_live_export(zero3_run):
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    from plsh_dist.checkpoint.zero3_weights import gather_zero3_weights, is_zero3_tag
    from plsh_dist.models.hf_config import read_safetensors_dir

    tag = zero3_run / "checkpoints" / TAG
    assert is_zero3_tag(tag)
    ours = gather_zero3_weights(tag)
    theirs = get_fp32_state_dict_from_zero_checkpoint(str(zero3_run / "checkpoints"), tag=TAG)
    assert sorted(ours) == sorted(theirs)
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
    assert any(v.numel() % 2 for v in ours.values())  # a padded partition was gathered

    live = read_safetensors_dir(zero3_run / "final", what="export")
    assert set(live) <= set(ours)
    assert all(torch.equal(live[k], ours[k]) for k in live)


def test_a_zero3_tag_loads_and_converts_with_equal_logits(zero3_run, tmp_path):
    from plsh_dist.checkpoint.loading import load_model

    tag = zero3_run / "checkpoints" / TAG
    from_tag, from_export = load_model(tag), load_model(zero3_run / "final")
    assert from_tag.kind == "deepspeed"
    ids = torch.arange(40)[None] % from_tag.model.config.vocab_size
    with torch.no_grad():
        assert torch.equal(from_tag.model(input_ids=ids).logits, from_export.model(input_ids=ids).logits)
    # the converter checks from_pretrained(export) against the checkpoint's logits itself (exactly)
    assert load_launcher("convert_checkpoint").main(["--checkpoint", str(tag), "--out", str(tmp_path / "e")]) == 0


@pytest.mark.parametrize("rank, message", [
    (0, r"optimizer shards for ranks \[1\], expected 0 .. W-1: the tag is incomplete"),
    (1, r"written by 2 ranks but the tag has 1 optimizer shards"),
])
def test_a_tag_missing_a_ranks_shard_is_refused_by_name(zero3_run, tmp_path, rank, message):
    from plsh_dist.checkpoint.loading import load_model

    broken = tmp_path / TAG
    shutil.copytree(zero3_run / "checkpoints" / TAG, broken)
    (broken / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt").unlink()
    with pytest.raises(ValueError, match=message):
        load_model(broken)
