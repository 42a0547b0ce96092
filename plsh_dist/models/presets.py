"""Named model configs: ``[model] preset = "<name>"``, :data:`plsh_dist.models.presets`.

``"tiny"`` (here) is a CPU debug model for tests and smoke runs (hidden 128, 4 layers, 4 query /
2 KV heads of dim 32, vocab 512, family ``"qwen3"``).

A family's own architectures are in its entry of the family table (:mod:`plsh_dist.models.families`,
``Family.presets``): ``"qwen3-0.6b"`` is Qwen3-0.6B's published architecture (hidden 1024, 28
layers, 16 query / 8 KV heads of dim 128, SwiGLU 3072, qk-norm, tied embeddings, rope base 1e6,
vocab 151936): 596,049,920 parameters, of which 440,467,456 outside the embedding (the model card
says 0.6B / 0.44B). Replace ``vocab_size`` with your tokenizer's (``dataclasses.replace``).

Plain tables of ``ModelConfig`` fields (this file and the family table import nothing heavy, so the
config module can read them); :data:`plsh_dist.models.presets` holds them built as ``ModelConfig`` objects.
"""

from __future__ import annotations

from plsh_dist.models.families import preset_tables as _family_presets

PRESET_TABLES: dict[str, dict] = {
    "tiny": dict(
        family="qwen3",
        vocab_size=512,
        hidden_size=128,
        num_layers=4,
        num_heads=4,
        num_kv_heads=2,
        head_dim=32,
        intermediate_size=256,
        max_position_embeddings=4096,
        rope_theta=10_000.0,
        tie_embeddings=True,
    ),
}


def preset_tables() -> dict[str, dict]:
    """Every preset: the ones above and the registered families' own (``Family.presets``)."""
    return {**PRESET_TABLES, **_family_presets()}
