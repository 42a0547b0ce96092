"""The sizes the planner works from: one rank's micro-batch and the model's shapes.

Parameter counts come from the real model built on the ``meta`` device
(nothing is allocated), so ties, norms and biases are counted exactly as
the trainer's model has them.
"""

from __future__ import annotations

from dataclasses import dataclass

from plsh_dist.models import build_model, count_parameters
from plsh_dist.models.families import get_family


@dataclass(frozen=True)
class ModelShapes:
    """Dimensions and parameter counts of the decoder LM."""

    family: str
    layers: int
    hidden: int
    """H."""
    q_heads: int
    kv_heads: int
    head_dim: int
    """D."""
    intermediate: int
    """I, the SwiGLU width."""
    vocab: int
    """V."""
    tied: bool
    qk_norm: bool
    """RMSNorm on q and k per head: the family table's ``Family.qk_norm`` (Qwen3's; Llama, Mistral: none)."""
    params: int
    """Distinct parameters (a tied head counted once)."""
    layer_params: int
    """Parameters of one decoder layer."""
    largest_module_params: int
    """Parameters of the largest single module (ZeRO-3 gathers module by module)."""

    @property
    def q_dim(self) -> int:
        return self.q_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def head_params(self) -> int:
        """Weights of the LM head matmul (V x H), whether or not tied."""
        return self.vocab * self.hidden

    @property
    def matmul_params_per_layer(self) -> int:
        """Weights a token meets in one layer's matmuls: q, k, v, o and the MLP's three."""
        h = self.hidden
        return h * (2 * self.q_dim + 2 * self.kv_dim) + 3 * h * self.intermediate


@dataclass(frozen=True)
class RankBatch:
    """One rank's micro-batch: ``batch`` rows of ``tokens`` (= seq_len / sp_size) tokens."""

    batch: int
    tokens: int
    seq_len: int
    sp_size: int

    @property
    def n(self) -> int:
        """Tokens of the micro-batch on this rank, B x T_local."""
        return self.batch * self.tokens


def model_shapes(model_cfg, attn_cfg) -> ModelShapes:
    """``ModelShapes`` of ``model_cfg`` (a ``plsh_dist.models.ModelConfig``), counted on a meta model."""
    model = build_model(model_cfg, attn_cfg, device="meta")
    layer = model.get_decoder().layers[0]
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    return ModelShapes(
        family=model_cfg.family, layers=model_cfg.num_layers, hidden=model_cfg.hidden_size,
        q_heads=model_cfg.num_heads, kv_heads=model_cfg.num_kv_heads, head_dim=model_cfg.head_dim,
        intermediate=model_cfg.intermediate_size, vocab=model_cfg.vocab_size, tied=model_cfg.tie_embeddings,
        qk_norm=get_family(model_cfg.family).qk_norm, params=count_parameters(model),
        layer_params=sum(p.numel() for p in layer.parameters()), largest_module_params=largest,
    )
