"""Named model configs.

``"qwen3-0.6b"`` is Qwen3-0.6B's published architecture (hidden 1024, 28
layers, 16 query / 8 KV heads of dim 128, SwiGLU 3072, qk-norm, tied
embeddings, rope base 1e6, vocab 151936): 596,049,920 parameters, of which
440,467,456 outside the embedding (the model card says 0.6B / 0.44B).
Replace ``vocab_size`` with your tokenizer's (``dataclasses.replace``).

``"tiny"`` is a CPU debug flavour of the same shape family for tests and


Plain tables of ``ModelConfig`` fields (this file imports nothing, so the
config module can read it); :data:`plsh_dist.models.presets` holds them
built as ``ModelConfig`` objects.
"""

from __future__ import annotations

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
    "qwen3-0.6b": dict(
        family="qwen3",
        vocab_size=151936,
        hidden_size=1024,
        num_layers=28,
        num_heads=16,
        num_kv_heads=8,
        head_dim=128,
        intermediate_size=3072,
        max_position_embeddings=40960,
        rope_theta=1_000_000.0,
        tie_embeddings=True,
        rms_norm_eps=1e-6,
    ),
}
