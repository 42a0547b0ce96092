"""Model and attention configs: documented dataclasses, checked in ``__post_init__``.

``ModelConfig`` describes the decoder (a transformers decoder of a family of
:mod:`plsh_dist.models.families`: Qwen3, Llama, Mistral, or one registered
there); ``AttentionConfig`` describes how its attention is computed (which
positional bias, rope on or off, the hash's parameters). They are separate
on purpose: evaluation runs the *same* weights under several attention
configs (``set_attention_mode``), and a checkpoint's model config never
changes when only the attention mode does.

Both serialise to plain dicts (``to_dict`` / ``from_dict``) so a TOML run
config maps onto them one section each.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from plsh_dist.config_check import check_field_types, did_you_mean
from plsh_dist.biases import BIASES, bias_class
from plsh_dist.hashing import import_sampler_module
from plsh_dist.models.families import FAMILIES, describe_families, get_family
from plsh_dist.models.presets import preset_tables


def _default(obj, name: str) -> Any:
    """The dataclass default of field ``name`` of ``obj``: the 'e.g.' of a value error."""
    return obj.__dataclass_fields__[name].default


def _from_dict(cls, d: dict[str, Any], section: str):
    """Build dataclass ``cls`` from ``d``, naming unknown keys instead of a TypeError."""
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - names)
    if unknown:
        raise ValueError(
            f"[{section}] unknown keys {unknown}; valid keys are {sorted(names)}{did_you_mean(unknown, sorted(names))}"
        )
    return cls(**d)


@dataclass
class AttentionConfig:
    """How attention is computed inside the decoder.

    The model's weights do not depend on it: switch it on a built or loaded
    model with :func:`plsh_dist.models.set_attention_mode`.
    """

    bias: str = "plsh"
    """Positional bias, one of :data:`plsh_dist.biases.BIASES` (one file each): ``"none"`` (plain
    causal attention; positions only via rope), ``"alibi"`` (exact ALiBi), ``"plsh"``
    (positional-LSH estimate of ALiBi), ``"fixed_blocks"`` (the paper's fixed-blocks
    baseline: pitch 2*sigma, one sample), ``"window"`` (exact ALiBi on a sliding window) or
    ``"truncated"`` (exact ALiBi on a window per head, ``w_h = ceil(c * sigma_h)``:
    the weights below ``e^-c`` dropped; see ``truncate_c``)."""

    rope: bool = False
    """Rotate q and k with the model's rotary embedding. ALiBi-style biases
    are usually trained without rope; ``bias="none"`` needs rope on to see
    positions at all."""

    num_samples: int = 8
    """``s``, number of hash samples averaged by ``"plsh"`` (error ~ 1/sqrt(s))."""

    sigma: float | None = None
    """Kernel scale. ``None``: per head, ``sigma_h = 1 / m_h`` with ALiBi's slopes
    (Press et al.). A float: one constant for all heads (the paper trains with
    256); ``"alibi"`` and ``"window"`` then use slope ``1 / sigma`` on every head,
    so the exact baselines are exactly the kernel ``"plsh"`` estimates."""

    window: int = 512
    """Key window of ``"window"``: a query sees keys less than ``window``
    positions back (itself included)."""

    truncate_c: float | None = None
    """``c`` of ``"truncated"``: head h sees keys less than ``ceil(c * sigma_h)``
    positions away, dropping ALiBi weights below ``e^-c``. ``None``: ``ln s + 0.58``
    with ``s = num_samples``, the window that costs what PLSH's one-pass band of s
    samples costs (``results/truncated_alibi``)."""

    fixed_masks: bool = False
    """``False`` (default): every forward draws fresh hash masks, seeded by
    (run seed, step, micro-step, layer). ``True``: masks depend on (run seed,
    layer) only, fixed for the whole run (they are step 0's masks)."""

    sampler: str = "iid"
    """``"iid"`` (the paper's estimator) or ``"stratified"`` (same expectation,
    lower max-norm error of the mask); see :class:`plsh_dist.hashing.PositionalLSH`.
    Any other name is registered by the module ``sampler_module`` names.
    Train with ``"iid"``: the stratified samplers resolve the kernel's tail with
    few distinct pitches, and their training gradients are further from exact
    ALiBi's from s = 20 on (``results/grad_fidelity``)."""

    sampler_module: str | None = None
    """A module to import before ``sampler`` is checked, which registers samplers
    when imported (:func:`plsh_dist.hashing.register_sampler`), e.g. ``"mylab.samplers"``
    (importable here: its folder on ``sys.path``; the repository's lab samplers: docs/evaluation.md).
    ``None``: plsh_dist's own samplers only. Written into checkpoints and exports
    with ``sampler``, so whatever reads them imports the same module."""

    backend: str = "auto"
    """Block-attention backend of the hash ops, one of
    :data:`plsh_dist.ops.backends.BACKENDS`; ``"auto"`` takes the first row of
    the table of :mod:`plsh_dist.ops.backends` that applies (where each backend
    runs is there too)."""

    method: str = "auto"
    """How ``"plsh"`` and ``"fixed_blocks"`` compute the estimator: ``"per_sample"``
    (s block attentions merged by log-sum-exp; cost grows like s), ``"onepass"``
    (one attention with the bias ``log c_ij``, c_ij the number of samples in
    which i and j share a block; cost grows like log s) or ``"auto"`` (the
    faster for the device: the table of :mod:`plsh_dist.ops.backends`).
    Same hash seeds and blocks either way, so a run's masks do not depend on it;
    the outputs agree to rounding."""

    chunk_size: int | None = None
    """Query chunk of exact ALiBi (``"alibi"``/``"window"``): memory O(T * chunk).
    ``None`` lets the op choose."""

    def __post_init__(self) -> None:
        check_field_types(self, "attention", {"sigma": 256.0, "chunk_size": 1024,  # examples for None defaults
                                              "truncate_c": 2.66, "sampler_module": "mylab.samplers"})
        bias_class(self.bias)  # a known bias, else the list of them
        # Types were checked above (one rule for every section); what follows checks values: the
        # shared ones here, each bias's own fields in its file (all of them, whichever bias is chosen).
        if self.sigma is not None and not self.sigma > 0:
            raise ValueError(
                f"attention.sigma must be a finite float > 0 (a kernel scale in tokens), got {self.sigma!r}; "
                f"e.g. sigma = 256.0 (the paper's), or leave sigma out for per-head 1/alibi_slope"
            )
        if self.sampler_module is not None:
            import_sampler_module(self.sampler_module, "[attention].sampler_module")
        for bias in BIASES.values():
            bias.check_fields(self)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "AttentionConfig":
        return _from_dict(cls, d, "attention")


@dataclass
class ModelConfig:
    """The decoder's architecture; maps one-to-one onto a transformers config.

    Qwen3 has RMSNorm on q and k per head (qk-norm); Llama and Mistral do not
    (the family decides, as in the upstream models: its entry in the family table,
    :mod:`plsh_dist.models.families`).
    """

    family: str = "qwen3"
    """transformers decoder: ``"qwen3"``, ``"llama"`` or ``"mistral"``, or a family added to the
    family table (:func:`plsh_dist.models.families.register_family`; docs/design.md, "Model families")."""

    vocab_size: int = 151936
    """Embedding rows; set it from the tokenizer (``len(tokenizer)``, possibly
    padded up to a multiple of 64 for fast matmuls)."""

    hidden_size: int = 1024
    """Width of the residual stream (the embedding dimension)."""
    num_layers: int = 28
    """Decoder layers."""
    num_heads: int = 16
    """Query heads (``Hq``)."""
    num_kv_heads: int = 8
    """Key/value heads (``Hkv``, grouped-query attention); must divide ``num_heads``."""
    head_dim: int = 128
    """Dimension of one attention head (even: rotary pairs dimensions)."""
    intermediate_size: int = 3072
    """Width of the SwiGLU MLP."""
    max_position_embeddings: int = 40960
    """Only informs the rotary embedding's bookkeeping; nothing is sized by it."""
    rope_theta: float = 1_000_000.0
    """Rotary base (used only when ``AttentionConfig.rope`` is on)."""
    tie_embeddings: bool = True
    """Share the input embedding with the LM head."""
    rms_norm_eps: float = 1e-6
    """Epsilon of the RMSNorm layers."""
    init_std: float = 0.02
    """Std of the normal init of linear and embedding weights."""
    attention_bias: bool = False
    """Bias terms on the q/k/v/o projections."""

    def __post_init__(self) -> None:
        check_field_types(self, "model")
        if self.family not in FAMILIES:
            get_family(self.family)  # the error: the table's families
        # Types were checked above (one rule for every section); what follows checks values.
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                     "intermediate_size", "max_position_embeddings"):
            if getattr(self, name) < 1:
                raise ValueError(f"model.{name} must be an int >= 1, got {getattr(self, name)!r}; "
                                 f"e.g. {name} = {_default(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"model.num_heads ({self.num_heads}) must be a multiple of model.num_kv_heads "
                f"({self.num_kv_heads}) for grouped-query attention (each KV head serves num_heads / "
                f"num_kv_heads query heads); set num_kv_heads to a divisor of {self.num_heads}: "
                f"{[d for d in range(1, self.num_heads + 1) if self.num_heads % d == 0]}"
            )
        if self.head_dim % 2:
            raise ValueError(f"model.head_dim must be even (rotary pairs dimensions), got {self.head_dim}")
        for name in ("rope_theta", "rms_norm_eps", "init_std"):
            if not getattr(self, name) > 0:
                raise ValueError(f"model.{name} must be a number > 0, got {getattr(self, name)!r}; "
                                 f"e.g. {name} = {_default(self, name)}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def check_vocab_covers(self, tokenizer_vocab: int, tokenizer: str, *, fix: str,
                           field: str = "[model].vocab_size") -> None:
        """ValueError unless the embedding has a row for every id of a tokenizer of
        ``tokenizer_vocab`` pieces: the one vocabulary check (run config, training
        start, checkpoint loading). ``tokenizer`` names the file, ``field`` where this
        model's vocabulary was read, ``fix`` what to do."""
        if tokenizer_vocab > self.vocab_size:
            raise ValueError(
                f"{field} = {self.vocab_size} is smaller than the tokenizer's vocabulary of {tokenizer_vocab} "
                f"pieces ({tokenizer} has {tokenizer_vocab} pieces but the model's embedding has {self.vocab_size} "
                f"rows): ids up to {tokenizer_vocab - 1} would index past the embedding; {fix}"
            )

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ModelConfig":
        """Plain dict -> config. A ``preset`` key starts from that preset and
        the other keys override it (``{"preset": "qwen3-0.6b", "vocab_size": 32000}``)."""
        d = dict(d)
        preset = d.pop("preset", None)
        if preset is None:
            return _from_dict(cls, d, "model")
        tables = preset_tables()
        if preset not in tables:
            raise ValueError(f"[model] preset must be one of {sorted(tables)}, got {preset!r}")
        base = cls(**tables[preset]).to_dict()
        unknown = sorted(set(d) - set(base))
        if unknown:
            raise ValueError(
                f"[model] unknown keys {unknown}; valid keys are {sorted(base)} and 'preset'"
                f"{did_you_mean(unknown, sorted(base))}"
            )
        return cls(**{**base, **d})

    def to_hf_config(self, attn_implementation: str = "plsh_dist", *, config_classes: dict | None = None):
        """The transformers config of this model (its family's: ``Qwen3Config``, ``LlamaConfig``,
        ``MistralConfig``, ...), no sliding window, no KV cache, no dropout.

        ``config_classes``: family -> config class to build instead; ``build_model``
        passes plsh_dist's own (``Qwen3PlshConfig``, model_type ``"qwen3_plsh"``, ...;
        :mod:`plsh_dist.models.hf_config`) so that a saved ``config.json`` names the
        attention it needs. The family's own keywords (``Family.hf_fields``) are added
        to the shared ones."""
        family = get_family(self.family)
        cls = config_classes[self.family] if config_classes else family.transformers_config_class()

        common = dict(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_layers,
            num_attention_heads=self.num_heads,
            num_key_value_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            hidden_act="silu",
            max_position_embeddings=self.max_position_embeddings,
            initializer_range=self.init_std,
            rms_norm_eps=self.rms_norm_eps,
            # Training and perplexity evaluation never decode token by token;
            # a cache would also hand our op keys longer than the queries.
            use_cache=False,
            tie_word_embeddings=self.tie_embeddings,
            rope_parameters={"rope_type": "default", "rope_theta": self.rope_theta},
            attention_bias=self.attention_bias,
            attention_dropout=0.0,
        )
        cfg = cls(**common, **family.hf_fields)
        cfg._attn_implementation = attn_implementation
        return cfg

    @classmethod
    def from_hf_config(cls, hf: Any, *, source: str = "config.json") -> "ModelConfig":
        """The ``ModelConfig`` of a transformers config (object or ``config.json`` dict):
        the inverse of ``to_hf_config`` (``from_hf_config(c.to_hf_config()) == c``).

        Accepts the ``model_type`` of a family of the table (qwen3 / llama / mistral, ...)
        and plsh_dist's own ``<family>_plsh``; v4 (``rope_theta``) and v5 (``rope_parameters``)
        layouts. Raises ValueError naming ``source`` and the field for what
        these decoders cannot be built with (another family, activation, MLP
        bias). Rope scaling and sliding windows are not architecture (no
        weight depends on them) and are not checked here.
        """
        d = hf if isinstance(hf, dict) else hf.to_dict()
        model_type = str(d.get("model_type", ""))
        family = model_type.removesuffix("_plsh")
        if family not in FAMILIES:
            raise ValueError(
                f"{source}: model_type {model_type!r} is not a decoder plsh_dist builds; supported: "
                f"{list(FAMILIES)} (transformers' {describe_families()}) and plsh_dist's own "
                f"{[f'{f}_plsh' for f in FAMILIES]}"
            )
        if d.get("hidden_act", "silu") != "silu":
            raise ValueError(f"{source}: hidden_act = {d['hidden_act']!r}; plsh_dist builds SwiGLU (silu) MLPs only")
        if d.get("mlp_bias", False):
            raise ValueError(f"{source}: mlp_bias = true; plsh_dist builds MLPs without bias")
        missing = [k for k in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                               "intermediate_size") if d.get(k) is None]
        if missing:
            raise ValueError(f"{source}: missing {missing}; not a complete transformers decoder config")
        rope = d.get("rope_parameters") or {}
        theta = rope.get("rope_theta", d.get("rope_theta", 10000.0))
        heads = d["num_attention_heads"]
        table = dict(
            family=family,
            vocab_size=d["vocab_size"],
            hidden_size=d["hidden_size"],
            num_layers=d["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=d.get("num_key_value_heads") or heads,
            head_dim=d.get("head_dim") or d["hidden_size"] // heads,
            intermediate_size=d["intermediate_size"],
            max_position_embeddings=d.get("max_position_embeddings", 40960),
            rope_theta=float(theta),
            tie_embeddings=bool(d.get("tie_word_embeddings", False)),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            init_std=float(d.get("initializer_range", 0.02)),
            attention_bias=bool(d.get("attention_bias", False)),
        )
        try:
            return cls(**table)
        except ValueError as exc:
            raise ValueError(f"{source}: {exc}") from None


class _Presets(Mapping):
    """Preset name -> a fresh ``ModelConfig``, read from the tables when asked: the generic ones
    (:mod:`plsh_dist.models.presets`) and every registered family's (``Family.presets``)."""

    def __getitem__(self, name: str) -> ModelConfig:
        return ModelConfig(**preset_tables()[name])

    def __iter__(self):
        return iter(preset_tables())

    def __len__(self) -> int:
        return len(preset_tables())

    def __repr__(self) -> str:
        return f"presets({sorted(self)})"


#: Named architectures (:mod:`plsh_dist.models.presets`): ``"tiny"``, ``"qwen3-0.6b"`` and the
#: registered families' own.
presets: Mapping[str, ModelConfig] = _Presets()
