"""The table of model families: every transformers decoder plsh_dist builds, one entry each.

A family is a transformers decoder whose attention goes through transformers' attention-function
table (``ALL_ATTENTION_FUNCTIONS``), which is where plsh_dist's attention hooks in. Everything that
differs between families is in its :class:`Family` entry, and every part of the package reads it:

- the run config (:class:`plsh_dist.models.ModelConfig`: ``family``, ``to_hf_config``,
  ``from_hf_config``) and its presets;
- the registered transformers model types (:mod:`plsh_dist.models.hf_config`: ``<name>_plsh``,
  ``<Prefix>PlshConfig``, ``<Prefix>PlshForCausalLM``, built from the entry when it is registered);
- the exports' remote code (:mod:`plsh_dist.models.remote_code`: the entry modules' classes);
- the planner (:mod:`plsh_dist.plan.shapes`: qk-norm).

Adding a family is one call, once, before a config names it (docs/design.md, "Model families")::

    register_family(Family(name="qwen2", class_prefix="Qwen2", hf_config="Qwen2Config",
                           hf_model="Qwen2ForCausalLM", hf_fields={"use_sliding_window": False}))

A family registered in the package (below) is bundled into every export; one registered by other
code loads (from the package or an export) in a process that has run that registration first. A run
config names the module that runs it (``[model].family_module``, :func:`import_family_module`), which
is imported before the family is checked, wherever the config is read (launch, resume, evaluation).

This module imports nothing outside the standard library (the config module reads it before
anything imports transformers); transformers' classes may be named by their attribute name in
``transformers`` and are resolved when a model is first built.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from plsh_dist.plugins import import_plugin_module

#: A ModelConfig field table (its keys are ``ModelConfig`` fields; ``family`` is filled in).
PresetTable = Mapping[str, Any]


@dataclass(frozen=True)
class Family:
    """One model family: what plsh_dist needs to build, save, export and plan it."""

    name: str
    """``ModelConfig.family`` (``"qwen3"``); the registered transformers ``model_type`` is ``<name>_plsh``."""
    class_prefix: str
    """Prefix of plsh_dist's class names (``"Qwen3"``: ``Qwen3PlshConfig``, ``Qwen3PlshForCausalLM``,
    the names an export's ``auto_map`` and ``architectures`` give); also how messages name the family."""
    hf_config: str | type
    """transformers' config class, or its attribute name in ``transformers`` (``"Qwen3Config"``)."""
    hf_model: str | type
    """transformers' causal-LM class, or its attribute name in ``transformers`` (``"Qwen3ForCausalLM"``)."""
    hf_fields: Mapping[str, Any] = field(default_factory=dict)
    """Config keywords this family needs beyond the shared ones that ``ModelConfig.to_hf_config`` sets:
    each family's own sliding window off (the ``"window"`` bias replaces it), no MLP bias, ..."""
    qk_norm: bool = False
    """RMSNorm on q and k per head (Qwen3's), as the family's upstream model has it: the planner
    counts its activations (:mod:`plsh_dist.plan.activations`)."""
    presets: Mapping[str, PresetTable] = field(default_factory=dict)
    """Named architectures of this family: preset name -> ``ModelConfig`` fields (``family`` implied),
    usable as ``[model] preset = "<name>"``."""

    @property
    def model_type(self) -> str:
        """plsh_dist's registered transformers ``model_type`` (``"qwen3_plsh"``)."""
        return f"{self.name}_plsh"

    @property
    def config_class_name(self) -> str:
        return f"{self.class_prefix}PlshConfig"

    @property
    def model_class_name(self) -> str:
        return f"{self.class_prefix}PlshForCausalLM"

    def transformers_config_class(self) -> type:
        """transformers' config class (imports transformers)."""
        return _resolve(self.hf_config)

    def transformers_model_class(self) -> type:
        """transformers' causal-LM class (imports transformers)."""
        return _resolve(self.hf_model)

    def preset_tables(self) -> dict[str, dict[str, Any]]:
        """This family's presets as full ``ModelConfig`` field tables (``family`` included)."""
        return {name: {**table, "family": self.name} for name, table in self.presets.items()}


def _resolve(cls: str | type) -> type:
    if isinstance(cls, str):
        import transformers

        return getattr(transformers, cls)
    return cls


#: The table: family name -> entry, in registration order (the built-in families first).
FAMILIES: dict[str, Family] = {}
_LISTENERS: list[Callable[[Family], None]] = []


def register_family(family: Family) -> Family:
    """Add ``family`` to the table (idempotent for an equal entry) -> ``family``.

    From then on ``ModelConfig(family=family.name)`` is valid, ``build_model`` builds its classes
    (``<Prefix>PlshConfig`` / ``<Prefix>PlshForCausalLM``, registered with transformers' Auto
    classes), exports of it carry them, its presets resolve, and the planner reads it.
    ValueError when the name, the class prefix or a preset name is already another entry's.
    """
    if not isinstance(family, Family):
        raise TypeError(f"register_family takes a Family, got {type(family).__name__}")
    if not family.name.isidentifier() or family.name != family.name.lower():
        raise ValueError(f"family name {family.name!r} must be a lower-case identifier (it is model_type's stem)")
    if not family.class_prefix.isidentifier():
        raise ValueError(f"class_prefix {family.class_prefix!r} must be an identifier (it starts class names)")
    known = FAMILIES.get(family.name)
    if known is not None:
        if known == family:
            return known
        raise ValueError(f"model family {family.name!r} is registered already, with another entry: {known}")
    for other in FAMILIES.values():
        if other.class_prefix == family.class_prefix:
            raise ValueError(f"class_prefix {family.class_prefix!r} is family {other.name!r}'s already")
        clash = set(other.presets) & set(family.presets)
        if clash:
            raise ValueError(f"presets {sorted(clash)} are family {other.name!r}'s already")
    FAMILIES[family.name] = family
    for listener in _LISTENERS:
        listener(family)
    return family


def unregister_family(name: str) -> None:
    """Drop family ``name`` from the table (tests). Its transformers classes stay registered with the
    Auto classes (transformers has no way back), but no config names it and no export is read as it."""
    if name in BUILT_IN:
        raise ValueError(f"{name!r} is a built-in family; it cannot be unregistered")
    FAMILIES.pop(name, None)


def on_register(listener: Callable[[Family], None]) -> None:
    """Call ``listener(family)`` for every family in the table now and for every one registered later
    (:mod:`plsh_dist.models.hf_config` builds and registers the transformers classes this way)."""
    _LISTENERS.append(listener)
    for family in list(FAMILIES.values()):
        listener(family)


def get_family(name: str) -> Family:
    """The entry of ``name``; ValueError listing the table otherwise."""
    family = FAMILIES.get(name)
    if family is None:
        raise ValueError(f"model.family must be one of {tuple(FAMILIES)}, got {name!r} (a new family is added "
                         f"with plsh_dist.models.families.register_family; one registered outside plsh_dist: name "
                         f"the module that registers it in [model].family_module, e.g. family_module = "
                         f"\"mylab.families\")")
    return family


def import_family_module(module: str, setting: str = "[model].family_module") -> None:
    """Import ``module``, which registers its model families when imported (:func:`register_family`);
    ValueError naming ``setting`` and the fix when it cannot be (:mod:`plsh_dist.plugins`)."""
    import_plugin_module(module, setting, registers="model families",
                         register="plsh_dist.models.families.register_family", example="mylab.families",
                         own=f"plsh_dist's own families {BUILT_IN}")


def preset_tables() -> dict[str, dict[str, Any]]:
    """Every registered family's presets: name -> ``ModelConfig`` fields."""
    tables: dict[str, dict[str, Any]] = {}
    for family in FAMILIES.values():
        tables.update(family.preset_tables())
    return tables


def describe_families() -> str:
    """``"Qwen3 / Llama / Mistral"``: the table's families as messages name them."""
    return " / ".join(f.class_prefix for f in FAMILIES.values())


# --- the built-in families --------------------------------------------------------------

register_family(Family(
    name="qwen3", class_prefix="Qwen3", hf_config="Qwen3Config", hf_model="Qwen3ForCausalLM",
    hf_fields={"use_sliding_window": False}, qk_norm=True,
    presets={
        # Qwen3-0.6B's published architecture (plsh_dist.models.presets).
        "qwen3-0.6b": dict(vocab_size=151936, hidden_size=1024, num_layers=28, num_heads=16, num_kv_heads=8,
                           head_dim=128, intermediate_size=3072, max_position_embeddings=40960,
                           rope_theta=1_000_000.0, tie_embeddings=True, rms_norm_eps=1e-6),
    },
))
register_family(Family(
    name="llama", class_prefix="Llama", hf_config="LlamaConfig", hf_model="LlamaForCausalLM",
    hf_fields={"mlp_bias": False},
))
register_family(Family(
    name="mistral", class_prefix="Mistral", hf_config="MistralConfig", hf_model="MistralForCausalLM",
    hf_fields={"sliding_window": None},  # the "window" bias replaces Mistral's own sliding window
))

#: The families registered by the package itself (every export bundles their classes).
BUILT_IN: tuple[str, ...] = tuple(FAMILIES)

__all__ = ["Family", "FAMILIES", "BUILT_IN", "register_family", "unregister_family", "on_register", "get_family",
           "import_family_module", "preset_tables", "describe_families"]
