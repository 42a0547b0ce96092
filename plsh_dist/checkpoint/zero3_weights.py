"""The full weights of a ZeRO-3 checkpoint tag, gathered from its per-rank shards, read safely.

Under ZeRO-3 no file holds a whole parameter. A tag written by ``W`` ranks has

- ``zero_pp_rank_0_mp_rank_00_model_states.pt``: the parameter names and shapes
  in the optimizer's order (``param_shapes``: one ordered dict per parameter
  group), the buffers (``module`` restricted to ``buffer_names``) and the tied
  parameters (``shared_params``: name -> the name it shares storage with);
- ``zero_pp_rank_{r}_mp_rank_00_optim_states.pt`` for r < W (``bf16_zero_pp_rank_...``
  when the engine ran bf16): rank r's partition of the master weights of every
  group, ``optimizer_state_dict.fp32_flat_groups`` (one flat tensor per group;
  fp32, or bf16 under ``master_weights = "bf16"``), next to the AdamW moments,
  which are not read.

Each parameter of ``n`` elements owns ``ceil(n / W)`` consecutive elements of
every rank's flat partition (the last rank's slice padded with zeros), the
parameters one after the other in ``param_shapes`` order; the parameter is the
ranks' slices concatenated in rank order, cut to ``n`` and viewed to its
shape, then cast to the dtype the engine's module held it in (``module``'s
empty placeholder of it: bf16 in a bf16 run, the masters rounded to nearest as
DeepSpeed copies them for the forward). DeepSpeed's own ``zero_to_fp32`` does the same merge but unpickles with
``weights_only=False``; here every file goes through ``safe_torch_load`` (the
optimizer shards memory-mapped, so the moments are never read into memory).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import torch

from plsh_dist.checkpoint.safe_load import safe_torch_load

ZERO3_MODEL_FILE = "zero_pp_rank_0_mp_rank_00_model_states.pt"
_OPTIM_FILE = re.compile(r"^(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_00_optim_states\.pt$")


def is_zero3_tag(directory: str | Path) -> bool:
    """A DeepSpeed tag written under ZeRO-3 (its rank-0 model states file is ZeRO-3's)."""
    return (Path(directory) / ZERO3_MODEL_FILE).is_file()


def _optim_files(directory: Path) -> list[Path]:
    """Rank r's optimizer shard at index r; a gap in the ranks is an incomplete tag."""
    found = {int(m.group(1)): directory / m.group(0)
             for m in map(_OPTIM_FILE.match, (p.name for p in directory.iterdir())) if m}
    if not found or sorted(found) != list(range(len(found))):
        raise ValueError(f"ZeRO-3 checkpoint {directory} has optimizer shards for ranks {sorted(found)}, "
                         "expected 0 .. W-1: the tag is incomplete; use another checkpoint")
    return [found[r] for r in range(len(found))]


def _flat_groups(path: Path, world: int) -> list[torch.Tensor]:
    blob = safe_torch_load(path, map_location="cpu", mmap=True,
                           advice="Use another checkpoint, or the run's safetensors export (out_dir/final).")
    state = blob.get("optimizer_state_dict") if isinstance(blob, dict) else None
    if not isinstance(state, dict) or state.get("fp32_flat_groups") is None:
        raise ValueError(f"{path} holds no fp32_flat_groups: not a ZeRO-3 optimizer shard")
    count = state.get("partition_count")
    count = max(count) if isinstance(count, list) else count
    if count != world:
        raise ValueError(f"{path} was written by {count} ranks but the tag has {world} optimizer shards: "
                         "the tag mixes two saves; use another checkpoint")
    return list(state["fp32_flat_groups"])


def gather_zero3_weights(directory: str | Path) -> dict[str, torch.Tensor]:
    """Every parameter and buffer of the ZeRO-3 tag ``directory`` as full tensors in the engine's dtypes (module doc),
    tied names sharing one tensor. Raises ``ValueError`` for an incomplete or inconsistent tag and
    ``CheckpointLoadError`` (naming the file) for one that cannot be read safely."""
    directory = Path(directory)
    model = safe_torch_load(directory / ZERO3_MODEL_FILE, map_location="cpu",
                            advice="Use another checkpoint, or the run's safetensors export (out_dir/final).")
    if not isinstance(model, dict) or "param_shapes" not in model:
        raise ValueError(f"{directory / ZERO3_MODEL_FILE} holds no param_shapes: not a ZeRO-3 model states file")
    files = _optim_files(directory)
    world = len(files)
    ranks = [torch.cat([g.reshape(-1) for g in _flat_groups(f, world)]) for f in files]

    buffers = set(model.get("buffer_names") or ())
    module = model.get("module") or {}
    state = {k: v for k, v in module.items() if k in buffers}
    offset = 0
    for name, shape in ((k, v) for group in model["param_shapes"] for k, v in group.items()):
        numel = math.prod(shape)
        part = math.ceil(numel / world)
        if offset + part > ranks[0].numel():
            raise ValueError(f"{directory}: the optimizer shards end before parameter {name} "
                             f"(shape {tuple(shape)}): the tag is damaged; use another checkpoint")
        pieces = [r[offset:offset + part] for r in ranks]
        held = module.get(name)
        dtype = held.dtype if isinstance(held, torch.Tensor) else ranks[0].dtype
        state[name] = torch.cat(pieces)[:numel].view(tuple(shape)).to(dtype, copy=True)
        offset += part
    if offset != ranks[0].numel():
        raise ValueError(f"{directory}: {ranks[0].numel() - offset} elements of rank 0's partition belong to no "
                         "parameter in param_shapes: the model states and optimizer shards disagree")
    for name, source in (model.get("shared_params") or {}).items():
        if source in state:
            state[name] = state[source]
    return state
