"""The planner's memory parts against what torch actually saves and allocates (CPU).

- activations per token: every tensor autograd saves in a forward of a tiny
  decoder (storages deduplicated, parameters excluded), per layer and
  outside the layers, for Qwen3 (qk-norm) and Llama, fp32 and bf16, and
  with activation checkpointing;
- the loss's peak, plain and chunked, against the measured peak of live bytes;
- DeepSpeed states per ZeRO stage: the ordering the stages promise, the
  bf16 wrappers (fp32 or bf16 masters), offloading.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from plsh_dist.models import AttentionConfig, apply_activation_checkpointing, build_model, compile_layers, presets
from plsh_dist.plan.activations import activation_bytes, loss_peak_bytes
from plsh_dist.plan.memory_measure import peak_cpu_bytes
from plsh_dist.plan.shapes import model_shapes
from plsh_dist.plan.zero_states import state_bytes
from plsh_dist.train.chunked_ce import chunked_cross_entropy_sums
from plsh_dist.train.loss_head import install_chunked_loss
from plsh_dist.train.losses import forward_sums, token_loss_sums

torch.set_num_threads(1)
B, T = 2, 128


def _saved_bytes(model) -> int:
    """Bytes of the distinct non-parameter storages autograd saves in one forward of a (B, T) batch."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    g = torch.Generator().manual_seed(0)
    batch = {"input_ids": torch.randint(0, model.config.vocab_size, (B, T), generator=g),
             "position_ids": torch.arange(T)[None].expand(B, -1),
             "labels": torch.randint(0, model.config.vocab_size, (B, T), generator=g)}
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        forward_sums(model, batch, torch.device("cpu"))
    return sum(seen.values())


def _model(family: str, layers: int, dtype, checkpointing: bool | str = False, compile: str = "off"):
    torch.manual_seed(0)
    cfg = dataclasses.replace(presets["tiny"], family=family, num_layers=layers, vocab_size=1024)
    model = build_model(cfg, AttentionConfig(bias="plsh", num_samples=2), dtype=dtype)
    install_chunked_loss(model, chunk_tokens=B * T)
    if checkpointing:
        apply_activation_checkpointing(model, "full" if checkpointing is True else checkpointing)
        model.train()
    if compile != "off":
        compile_layers(model, compile)
    return model, cfg


@pytest.mark.parametrize("family,dtype", [("qwen3", torch.float32), ("llama", torch.float32),
                                          ("qwen3", torch.bfloat16)], ids=["qwen3-fp32", "llama-fp32", "qwen3-bf16"])
def test_activation_bytes_are_what_autograd_saves(family, dtype):
    one, cfg = _model(family, 1, dtype)
    two, _ = _model(family, 2, dtype)
    b = torch.finfo(dtype).bits // 8
    per = activation_bytes(model_shapes(cfg, AttentionConfig()), b)
    n = B * T
    assert _saved_bytes(two) - _saved_bytes(one) == n * per.layer
    # outside the layers: the model's (position ids are alive, not saved) and the chunked loss's lse
    assert _saved_bytes(one) - n * per.layer == n * (per.model - 8) + n * 4


def test_checkpointed_layer_keeps_its_input_only():
    one, cfg = _model("qwen3", 1, torch.float32, checkpointing=True)
    two, _ = _model("qwen3", 2, torch.float32, checkpointing=True)
    per = activation_bytes(model_shapes(cfg, AttentionConfig()), 4)
    assert _saved_bytes(two) - _saved_bytes(one) == B * T * per.checkpointed_layer


def test_selective_layer_keeps_its_matmuls_and_attention_outputs():
    """Compiled (aot_eager, where the kept tensors pass through autograd's saved-tensor hooks; eagerly
    selective checkpointing holds them in its own cache): the estimate less down_proj's output, which
    the partitioner drops (backward does not need it; eagerly it is kept), and the 8-byte seed."""
    torch._dynamo.reset()
    one, cfg = _model("qwen3", 1, torch.float32, checkpointing="selective", compile="aot_eager")
    two, _ = _model("qwen3", 2, torch.float32, checkpointing="selective", compile="aot_eager")
    per = activation_bytes(model_shapes(cfg, AttentionConfig()), 4)
    assert _saved_bytes(two) - _saved_bytes(one) == B * T * (per.selective_layer - 4 * cfg.hidden_size) + 8
    assert per.checkpointed_layer < per.selective_layer < per.layer
    torch._dynamo.reset()


@pytest.mark.parametrize("chunk", [0, 256])
def test_loss_peak_matches_the_measured_peak(chunk):
    n, v, d = 2048, 4096, 64
    g = torch.Generator().manual_seed(0)
    h = torch.randn(n, d, generator=g, requires_grad=True)
    w = (torch.randn(v, d, generator=g) * 0.1).requires_grad_()
    y = torch.randint(0, v, (n,), generator=g)

    def step():
        loss = (chunked_cross_entropy_sums(h, w, y, chunk_tokens=chunk)[0] if chunk
                else token_loss_sums(F.linear(h, w)[None], y[None])[0])
        loss.backward()

    _, measured = peak_cpu_bytes(step)
    estimate = loss_peak_bytes(n, v, d, 4, chunk)
    assert max(estimate.forward, estimate.backward) == pytest.approx(measured, rel=0.03)


def test_zero_stages_shrink_per_rank_states_and_offload_moves_them():
    common = dict(params=600_000_000, largest_module=150_000_000, precision="bf16", world=8)
    totals = [state_bytes(stage=s, **common) for s in (1, 2, 3)]
    bucket = 500_000_000 * 2  # DeepSpeed's reduce_bucket_size in bf16: ZeRO 2's per backward, ZeRO 3's kept
    keep = [s.weights + s.master + s.optimizer + s.grad_buffers + s.grads for s in totals]
    keep[2] -= bucket
    assert keep[0] > keep[1] > keep[2]  # buckets aside, each stage partitions more
    assert totals[0].wrapper == "BF16_Optimizer" and totals[2].wrapper == "DeepSpeedZeroOptimizer_Stage3"
    assert totals[1].buckets == bucket and totals[0].buckets == 0
    zero0 = state_bytes(stage=0, **common)  # DeepSpeed's bf16 without ZeRO: fp32 masters of every weight
    assert zero0.master == 4 * 600_000_000 and zero0.step_temp == 4 * 600_000_000
    pure = [state_bytes(stage=s, master_weights="bf16", **common) for s in (1, 2, 3)]
    assert pure[0].wrapper == "DeepSpeedZeroOptimizer"  # BF16_Optimizer keeps fp32 masters only
    assert all(p.master == 2 * 75_000_000 and p.optimizer == 4 * 75_000_000 for p in pure)
    off = state_bytes(stage=2, offload_optimizer=True, **common)
    assert off.master == off.optimizer == 0 and off.cpu == 16 * 75_000_000
    with pytest.raises(ValueError, match="precision must be"):
        state_bytes(stage=1, params=1, largest_module=1, precision="fp16", world=1)
