"""plsh_dist's own transformers model types: a ``config.json`` that names the attention it needs.

Saved as plain ``qwen3``, a model trained here (transformers' decoder with *our* attention) would
be rebuilt by ``AutoModelForCausalLM.from_pretrained`` with RoPE and SDPA and no bias, silently a
different model. So ``build_model`` builds subclasses with a distinct ``model_type``
(``qwen3_plsh``, ``llama_plsh``, ``mistral_plsh``: one pair of classes per entry of the family
table, :mod:`plsh_dist.models.families`, made here when the family is registered), ``config.json``
gets a ``"plsh_dist"`` section (``SECTION``: the attention and the hash seed), importing
``plsh_dist.models`` registers the types, and their ``from_pretrained`` is transformers' own, with
the package's checks (:func:`check_export`) and the ``attention`` keyword added around it. The
types, the section's format, the loading path and the seed rule: docs/training.md, "Loading an
export with transformers", "The model types".
"""

from __future__ import annotations

import json
import shutil
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import transformers

from plsh_dist.models.build import register_model_types, set_attention_mode
from plsh_dist.models.config import AttentionConfig, ModelConfig
from plsh_dist.models.families import FAMILIES, Family, on_register
from plsh_dist.biases import BIASES
from plsh_dist.models.remote_code import MODEL_MODULES, auto_map, write_remote_code
from plsh_dist.models.runtime import AttentionRuntime

#: Key of plsh_dist's section in ``config.json``.
SECTION = "plsh_dist"
#: Layout version of that section (bumped when its meaning changes).
FORMAT = 1
SEED_RULE = ("seed(layer) = hash_seed(run_seed, step, micro_step, layer), a chained SplitMix64 "
             "(plsh_dist.models.runtime); a loaded model starts at (step, micro_step) and keeps those masks "
             "until get_runtime(model).set_step() is called; attention.fixed_masks pins (0, 0)")
#: Attention fields an export must state (they define the model); the others
#: (backend, method, chunk_size) only choose how it is computed, equal to rounding.
REQUIRED_ATTENTION = ("bias", "rope", "num_samples", "sigma", "window", "fixed_masks", "sampler")
_CONVERT = "re-export it: python launchers/convert_checkpoint.py --checkpoint <run dir or checkpoint tag> --out DIR"


#: family name -> (its table entry, config class, causal-LM class), made by ``_add_family``.
_BUILT: dict[str, tuple[Family, type, type]] = {}


class _FamilyClasses(Mapping):
    """family name -> one of its classes (``which``: 1 config, 2 causal LM), for the families in the
    table now (a live view: a family registered later is in it)."""

    def __init__(self, which: int):
        self._which = which

    def __getitem__(self, name: str) -> type:
        if name not in FAMILIES or name not in _BUILT:
            raise KeyError(name)
        return _BUILT[name][self._which]

    def __iter__(self):
        return (name for name in FAMILIES if name in _BUILT)

    def __len__(self) -> int:
        return sum(1 for _ in self)


class _ModelTypes(Mapping):
    """registered ``model_type`` -> family name (``"qwen3_plsh"`` -> ``"qwen3"``), live as above."""

    def __getitem__(self, model_type: str) -> str:
        name = model_type.removesuffix("_plsh") if isinstance(model_type, str) else None
        if name not in FAMILIES or name not in _BUILT or FAMILIES[name].model_type != model_type:
            raise KeyError(model_type)
        return name

    def __iter__(self):
        return (FAMILIES[name].model_type for name in FAMILIES if name in _BUILT)

    def __len__(self) -> int:
        return sum(1 for _ in self)


#: family -> registered config class (``"qwen3"`` -> ``Qwen3PlshConfig``).
CONFIG_CLASSES: Mapping[str, type] = _FamilyClasses(1)
#: family -> registered model class (``"qwen3"`` -> ``Qwen3PlshForCausalLM``).
MODEL_CLASSES: Mapping[str, type] = _FamilyClasses(2)
#: registered model_type -> family.
MODEL_TYPES: Mapping[str, str] = _ModelTypes()


def plsh_config_types() -> tuple[type, ...]:
    """The registered config classes of every family in the table (for ``isinstance``)."""
    return tuple(CONFIG_CLASSES.values())


def _refuse_output_attentions(module, args, kwargs):
    """Forward pre-hook: ``model(..., output_attentions=True)`` would return an empty tuple of weights."""
    if kwargs.get("output_attentions"):
        raise ValueError(_NO_ATTENTION_WEIGHTS)


class _PlshCausalLM:
    """Mixin of the registered model classes: a model built from a config that carries the section
    (``from_config``, and transformers' ``from_pretrained``, which builds it from config.json) gets its
    attention mode; ``from_pretrained`` adds the package's checks and the ``attention`` keyword."""

    def __init__(self, config, *args, **kwargs):
        super().__init__(config, *args, **kwargs)
        if isinstance(getattr(config, SECTION, None), dict):
            attn, seed = read_section(config)
            set_attention_mode(self, attn, AttentionRuntime(**seed))
        # A hook, not a forward override: Trainer and PEFT read forward's signature.
        self.register_forward_pre_hook(_refuse_output_attentions, with_kwargs=True)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, attention=None, **kwargs):
        """transformers' ``PreTrainedModel.from_pretrained``, every keyword of it, with the package's
        additions around it: :func:`check_export` first (the trained mode is stated and consistent;
        no ``attn_implementation`` that would drop the bias; no ``output_attentions``), a weight that
        does not match the config is an error (not a random init), and ``attention``: run the weights
        under another attention mode, a dict of ``AttentionConfig`` fields replacing the trained ones
        (``{"bias": "alibi"}``, ``{"num_samples": 16}``) or a whole ``AttentionConfig`` (the hash
        seed stays the export's). The model's ``__init__`` binds the trained mode from the config's
        section. ``dtype`` is transformers' default (``"auto"`` since transformers 5: the saved dtype)."""
        check_export(pretrained_model_name_or_path, **kwargs)
        want_info = kwargs.pop("output_loading_info", False)
        model, info = super().from_pretrained(pretrained_model_name_or_path, *model_args, output_loading_info=True,
                                              **kwargs)
        _check_loaded(info, pretrained_model_name_or_path)
        if attention is not None:
            trained, _ = read_section(model.config)
            set_attention_mode(model, _chosen_attention(trained, attention))
        return (model, info) if want_info else model

    def save_pretrained(self, save_directory, *args, **kwargs):
        """transformers' ``save_pretrained``, plus ``auto_map`` in ``config.json`` and the
        remote-code modules (:mod:`plsh_dist.models.remote_code`): the directory loads as an
        export does, also with ``trust_remote_code=True`` in a Python that never imports
        plsh_dist, however this model was loaded (a loaded model is built by ``build_model``,
        so transformers' own remote-code marks are not on it)."""
        family = FAMILIES[MODEL_TYPES[self.config.model_type]]
        self.config.auto_map = auto_map(family.class_prefix)
        out = super().save_pretrained(save_directory, *args, **kwargs)
        if kwargs.get("is_main_process", True):
            write_remote_code(save_directory, MODEL_MODULES, family=family)
        return out


def _add_family(family: Family) -> None:
    """Make ``family``'s two classes (once per table entry) and register them with transformers' Auto
    classes: ``<Prefix>PlshConfig``, transformers' config class with ``model_type`` ``<name>_plsh``,
    and ``<Prefix>PlshForCausalLM``, transformers' causal LM with ``_PlshCausalLM`` mixed in. Both are
    attributes of this module (``from plsh_dist.models.hf_config import Qwen3PlshConfig``; pickle)."""
    from plsh_dist.models.hf_tokenizer import PlshTokenizer

    built = _BUILT.get(family.name)
    if built is None or built[0] != family:
        config_name, model_name = family.config_class_name, family.model_class_name
        config_cls = type(config_name, (family.transformers_config_class(),), {
            "__module__": __name__, "__qualname__": config_name, "model_type": family.model_type,
            "__doc__": f"plsh_dist's {family.class_prefix} config: model_type {family.model_type!r} (module doc)."})
        model_cls = type(model_name, (_PlshCausalLM, family.transformers_model_class()), {
            "__module__": __name__, "__qualname__": model_name, "config_class": config_cls,
            "__doc__": f"plsh_dist's {family.class_prefix} causal LM: transformers' own, with our attention."})
        built = _BUILT[family.name] = (family, config_cls, model_cls)
        globals().update({config_name: config_cls, model_name: model_cls})
    _, config_cls, model_cls = built
    transformers.AutoConfig.register(family.model_type, config_cls, exist_ok=True)
    transformers.AutoModelForCausalLM.register(config_cls, model_cls, exist_ok=True)
    transformers.AutoTokenizer.register(config_cls, tokenizer_class=PlshTokenizer, exist_ok=True)


def export_class(name: str) -> type:
    """The class an export's entry modules name (``Qwen3PlshConfig``, ``Qwen3PlshForCausalLM``,
    ``PlshTokenizer``): what the export's chooser (``plsh_export.py``, :mod:`plsh_dist.models.remote_code`)
    hands them from this code. AttributeError when no family in the table has that class."""
    if name == "PlshTokenizer":
        from plsh_dist.models.hf_tokenizer import PlshTokenizer

        return PlshTokenizer
    for family_name in FAMILIES:
        for cls in _BUILT[family_name][1:] if family_name in _BUILT else ():
            if cls.__name__ == name:
                return cls
    raise AttributeError(
        f"{name}: no model family of this plsh_dist has this class (families: {list(FAMILIES)}); an export of a "
        f"family added with plsh_dist.models.families.register_family loads where that registration ran first")


# --- the section ----------------------------------------------------------------------


def describe(hf_config, attn_cfg: AttentionConfig, run_seed: int) -> None:
    """Write the ``plsh_dist`` section (attention + seed rule) into a registered config."""
    from plsh_dist import __version__

    if not isinstance(hf_config, plsh_config_types()):
        raise ValueError(f"{type(hf_config).__name__} is not a plsh_dist config (build the model with "
                         "plsh_dist.models.build_model); its config.json would not describe the attention")
    setattr(hf_config, SECTION, {
        "format": FORMAT,
        "version": __version__,
        "attention": attn_cfg.to_dict(),
        "hash_seed": {"run_seed": int(run_seed), "step": 0, "micro_step": 0, "rule": SEED_RULE},
        "load": "import plsh_dist.models, then transformers.AutoModelForCausalLM.from_pretrained(this directory)",
    })


def _int_field(seed: dict, key: str, source: str, minimum: int | None = 0) -> int:
    value = seed.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or (minimum is not None and value < minimum):
        raise ValueError(f"{source}: {SECTION}.hash_seed.{key} must be an int"
                         + (f" >= {minimum}" if minimum is not None else "") + f", got {value!r}; {_CONVERT}")
    return value


def read_section(hf: Any, source: str = "config.json") -> tuple[AttentionConfig, dict[str, int]]:
    """``(AttentionConfig, {"run_seed", "step", "micro_step"})`` stored in a config (object or dict).

    Raises ValueError naming ``source`` and the field when the section is
    missing, of another format, lacks an attention field or holds an invalid one.
    """
    section = hf.get(SECTION) if isinstance(hf, dict) else getattr(hf, SECTION, None)
    if not isinstance(section, dict):
        raise ValueError(f"{source} has no {SECTION!r} section (the attention mode, sigma, s, sampler, method, "
                         f"rope and the hash seed the weights were trained with), so the model cannot be rebuilt "
                         f"exactly; {_CONVERT}")
    if section.get("format") != FORMAT:
        raise ValueError(f"{source}: {SECTION}.format = {section.get('format')!r}, this plsh_dist reads format "
                         f"{FORMAT}; {_CONVERT}")
    attn = section.get("attention")
    if not isinstance(attn, dict):
        raise ValueError(f"{source}: {SECTION}.attention is missing; {_CONVERT}")
    missing = [k for k in REQUIRED_ATTENTION if k not in attn]
    if missing:
        raise ValueError(f"{source}: {SECTION}.attention lacks {missing} (a default could differ from what the "
                         f"weights were trained with); {_CONVERT}")
    defaulted = sorted(set(AttentionConfig().to_dict()) - set(attn))
    if defaulted:  # compute choices (backend, method, ...) or fields newer than the export
        warnings.warn(f"{source}: {SECTION}.attention lacks {defaulted}; using their defaults", stacklevel=3)
    try:
        attn_cfg = AttentionConfig.from_dict(attn)
    except ValueError as exc:
        raise ValueError(f"{source}: {SECTION}.{exc}; fix that field or {_CONVERT}") from None
    seed = section.get("hash_seed")
    if not isinstance(seed, dict):
        raise ValueError(f"{source}: {SECTION}.hash_seed is missing (the seed rule of the PLSH masks); {_CONVERT}")
    seeds = {"run_seed": _int_field(seed, "run_seed", source, None), "step": _int_field(seed, "step", source),
             "micro_step": _int_field(seed, "micro_step", source)}
    return attn_cfg, seeds


# --- weights ----------------------------------------------------------------------------

_PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


def _safetensors_files(directory: Path, what: str) -> list[Path]:
    """The safetensors files of ``directory``: ``model.safetensors``, or the shards its
    ``model.safetensors.index.json`` names (``read_safetensors_dir``'s errors otherwise)."""
    single, index = directory / "model.safetensors", directory / "model.safetensors.index.json"
    if single.is_file():
        return [single]
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{index}: not a safetensors index (no weight_map): {exc}") from None
        shards = [directory / shard for shard in sorted(set(weight_map.values()))]
        for shard in shards:
            if not shard.is_file():
                raise ValueError(f"{index} names shard {shard.name!r}, which is missing from {directory}")
        return shards
    pickles = sorted(p.name for p in directory.iterdir() if p.suffix in _PICKLE_SUFFIXES) if directory.is_dir() else []
    if pickles:
        # The printed conversion works as written in any Python where plsh_dist is installed, for a plain
        # transformers directory and for a plsh export alike (whose own loader reads safetensors only,
        # so transformers' from_pretrained, even with trust_remote_code=True, cannot convert it).
        new = f"{directory}-safetensors"
        raise ValueError(
            f"{what} {directory} holds only pickle weight files {pickles[:4]}; plsh_dist reads safetensors only "
            f"(unpickling can run arbitrary code). Convert it once (the tensors are read with torch.load("
            f"weights_only=True), which unpickles tensors only): python -c \"from plsh_dist.models.hf_config import "
            f"pickle_to_safetensors; pickle_to_safetensors({str(directory)!r}, {new!r})\" and point at {new}"
        )
    raise ValueError(f"{what} {directory} has no model.safetensors (or model.safetensors.index.json)")


def pickle_to_safetensors(directory: str | Path, out: str | Path) -> Path:
    """Write a copy of the transformers directory ``directory`` whose weights are pickle files
    (``pytorch_model*.bin``, sharded or not; else its ``.pt``/``.pth``/... files) to ``out`` with
    ``model.safetensors`` instead -> ``out``. The tensors are read with ``torch.load(weights_only=True)``
    (tensors and plain containers only: no code runs); a tensor stored under two names (tied
    embeddings) is written once, under its first name, as transformers saves it. Every other file
    (config.json, the tokenizer, generation_config.json, a modelling file) is copied unchanged."""
    directory, out = Path(directory), Path(out)
    pickles = sorted(p for p in directory.iterdir() if p.suffix in _PICKLE_SUFFIXES) if directory.is_dir() else []
    weights = [p for p in pickles if p.name.startswith("pytorch_model")] or pickles
    if not weights:
        raise ValueError(f"{directory} holds no pickle weight file ({', '.join(_PICKLE_SUFFIXES)})")
    if out.exists():
        raise ValueError(f"{out} exists; give a directory that does not exist yet")
    tensors: dict[str, torch.Tensor] = {}
    seen: set[tuple] = set()
    for path in weights:
        state = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(state, dict) or not all(isinstance(t, torch.Tensor) for t in state.values()):
            raise ValueError(f"{path} is not a state dict (a mapping of names to tensors); convert it by hand")
        for name, tensor in state.items():
            where = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape),
                     tuple(tensor.stride()))
            if where not in seen:
                seen.add(where)
                tensors[name] = tensor.detach().clone().contiguous()
    left_out = {p.name for p in weights} | {"pytorch_model.bin.index.json"}
    shutil.copytree(directory, out,
                    ignore=lambda d, names: [n for n in names if Path(d) == directory and n in left_out])
    from safetensors.torch import save_file

    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    return out


def _damaged(path: Path, exc: Exception) -> ValueError:
    return ValueError(f"{path} is damaged or truncated ({exc}): copy or export it again (an interrupted copy or a "
                      f"full disk leaves a short file); a run's export is rewritten from its checkpoints by "
                      f"launchers/convert_checkpoint.py")


def check_safetensors_dir(directory: str | Path, *, what: str = "weights") -> None:
    """Raise ValueError naming the file when a safetensors file of ``directory`` is missing,
    damaged or truncated: its header is read and checked against the file's size, the tensors
    are not loaded (so it is cheap before any work starts)."""
    from safetensors import SafetensorError, safe_open

    for path in _safetensors_files(Path(directory), what):
        try:
            with safe_open(str(path), framework="pt", device="cpu"):
                pass
        except (SafetensorError, OSError) as exc:
            raise _damaged(path, exc) from None


def read_safetensors_dir(directory: str | Path, *, what: str = "weights") -> dict[str, torch.Tensor]:
    """All tensors of ``directory``'s ``model.safetensors`` (or its sharded
    ``model.safetensors.index.json``), on the CPU. Pickle files are never
    opened (unpickling runs arbitrary code): a directory with only those is
    refused with the conversion to use; a damaged or truncated file is named.
    ``what`` names the directory in errors."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    state: dict[str, torch.Tensor] = {}
    for path in _safetensors_files(Path(directory), what):
        try:
            state.update(load_file(str(path), device="cpu"))
        except (SafetensorError, OSError) as exc:
            raise _damaged(path, exc) from None
    return state


# --- from_pretrained ------------------------------------------------------------------


def _mode_spec(run_attn: dict, attn: AttentionConfig) -> str:
    """The launchers' ``--mode`` spec of ``attn``'s bias with the fields that differ from the run's
    (``plsh:s=8``), for the refusal of an edited config.json."""
    mode = BIASES.get(attn.bias)
    if mode is None:
        return "MODE"
    opts = []
    for field, value in attn.to_dict().items():
        key = next((o for o, f in mode.options.items() if f == field), None)
        if key and run_attn.get(field) != value and isinstance(value, (bool, int, float, str)):
            opts.append(f"{key}={str(value).lower() if isinstance(value, bool) else value}")
    return ":".join([mode.spec, *opts])


def _compare_with_run(run_table: dict, resolved: str, directory: Path, model_cfg: ModelConfig,
                      attn: AttentionConfig, seed: dict) -> None:
    """ValueError when ``config.json`` (``model_cfg``, ``attn``, ``seed``) and the run config
    ``run_table`` saved beside it describe different models. An edit of the attention alone is
    how one would switch modes by hand: its message names the field and the supported way
    (``from_pretrained(..., attention=...)``, the launchers' ``--mode``)."""
    try:
        run_model = {k: v for k, v in run_table["model"].items() if k != "init_from"}
        run_attn, run_seed = run_table["attention"], run_table["run"]["seed"]
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{resolved}: not a resolved run config (no {exc}); delete it or {_CONVERT}") from None
    config_json = directory / "config.json"
    both = f"in {Path(resolved).name}, {{!r}} in {config_json.name}"
    model_diffs = [f"model.{k}: {run_model.get(k)!r} " + both.format(v) for k, v in model_cfg.to_dict().items()
                   if run_model.get(k) != v]
    edited = {k: v for k, v in attn.to_dict().items() if run_attn.get(k) != v}
    attn_diffs = [f"attention.{k}: {run_attn.get(k)!r} " + both.format(v) for k, v in edited.items()]
    if run_seed != seed["run_seed"]:
        model_diffs.append(f"run.seed vs hash_seed.run_seed: {run_seed!r} " + both.format(seed["run_seed"]))
    if model_diffs:
        raise ValueError(f"{resolved} and {config_json} describe different models "
                         f"({'; '.join((model_diffs + attn_diffs)[:6])}); one of them was edited by hand: {_CONVERT}")
    if attn_diffs:
        raise ValueError(
            f"{resolved} and {config_json} describe different models ({'; '.join(attn_diffs[:6])}): "
            f"config.json's {SECTION}.attention was edited, but it must state the attention the weights were "
            f"trained with. To run them under another attention, restore config.json and choose the mode when "
            f"loading: AutoModelForCausalLM.from_pretrained(dir, trust_remote_code=True, attention={edited!r}) "
            f"(a dict of attention fields or an AttentionConfig; plsh_dist.checkpoint.loading.load_model takes "
            f"attention= too); launchers/generate.py --mode {_mode_spec(run_attn, attn)} "
            f"(launchers/evaluate.py --modes)")


def check_against_run(config: Any, run_table: dict, directory: str | Path):
    """``config.json`` (dict or config object) of ``directory`` against the run config
    ``run_table`` saved with it -> ``(ModelConfig, AttentionConfig, seeds)``; ValueError
    naming both files when they describe different models (or the section is bad)."""
    directory = Path(directory)
    source = str(directory / "config.json")
    attn, seed = read_section(config, source)
    model_cfg = ModelConfig.from_hf_config(config, source=source)
    _compare_with_run(run_table, str(directory / "config.resolved.json"), directory, model_cfg, attn, seed)
    return model_cfg, attn, seed


def _check_resolved(directory: Path, model_cfg: ModelConfig, attn: AttentionConfig, seed: dict) -> None:
    """ValueError when ``config.resolved.json`` (the run config written with an export) disagrees with config.json."""
    resolved = directory / "config.resolved.json"
    if not resolved.is_file():
        return
    try:
        table = json.loads(resolved.read_text())
    except ValueError as exc:
        raise ValueError(f"{resolved}: not valid JSON ({exc}); delete it or {_CONVERT}") from None
    _compare_with_run(table, str(resolved), directory, model_cfg, attn, seed)


def _check_tokenizer(directory: Path, model_cfg: ModelConfig) -> None:
    tok = directory / "tokenizer.model"
    if not tok.is_file():
        return
    import sentencepiece as spm

    try:
        pieces = spm.SentencePieceProcessor(model_file=str(tok)).get_piece_size()
    except (RuntimeError, OSError) as exc:
        raise ValueError(f"{tok} is not a SentencePiece model ({exc}); copy the run's tokenizer there") from None
    model_cfg.check_vocab_covers(pieces, str(tok), field=f"{directory / 'config.json'} vocab_size",
                                 fix=f"tokenizer and weights do not match; copy the tokenizer the run trained with "
                                     f"([tokenizer].model_path) into {directory}")


def _chosen_attention(trained: AttentionConfig, attention) -> AttentionConfig:
    """``from_pretrained``'s ``attention``: None (the trained mode), an ``AttentionConfig``, or a
    dict of fields that replace the trained config's (``{"bias": "alibi"}``)."""
    if attention is None:
        return trained
    if isinstance(attention, AttentionConfig):
        return attention
    if isinstance(attention, dict):
        try:
            return AttentionConfig.from_dict({**trained.to_dict(), **attention})
        except (ValueError, TypeError) as exc:
            raise ValueError(f"from_pretrained(attention={attention!r}): {exc}") from None
    raise ValueError(f"from_pretrained(attention=...) takes a dict of attention fields ({{'bias': 'alibi'}}) or "
                     f"a plsh_dist.models.AttentionConfig, got {type(attention).__name__}")


#: from_pretrained's keywords that say where the files are (a local directory or a Hub repo at a
#: revision): the package's checks read config.json, config.resolved.json and tokenizer.model from
#: the place transformers' loader reads the weights from. Forwarded, never consumed.
_WHERE = ("cache_dir", "force_download", "local_files_only", "proxies", "revision", "subfolder", "token")

#: Why output_attentions=True is refused (transformers' own message names attn_implementation='eager').
_NO_ATTENTION_WEIGHTS = (
    "output_attentions=True: plsh_dist attention returns no attention weights. Its kernels never form the "
    "(T x T) probabilities, and a sampled mode has no single matrix to return: a PLSH output is the mean over "
    "num_samples block-masked softmaxes, each with its own weights. Load without output_attentions "
    "(output_hidden_states=True works); to run the weights under transformers' eager attention, which returns "
    "weights but drops the trained positional bias, load them as the plain family's model yourself")


def _export_dir(path, kwargs: dict) -> Path | None:
    """The directory that holds ``path``'s ``config.json`` (a local export, or the Hub cache's copy at
    ``revision``) with ``tokenizer.model`` and ``config.resolved.json`` fetched beside it when the repo
    has them; None when transformers' loader will not find a config.json there either (it then raises
    its own error)."""
    from transformers.utils import cached_file

    where = {k: kwargs[k] for k in _WHERE if kwargs.get(k) is not None}
    found = {}
    for name in ("config.json", "config.resolved.json", "tokenizer.model"):
        try:
            found[name] = cached_file(str(path), name, _raise_exceptions_for_missing_entries=False,
                                      _raise_exceptions_for_connection_errors=False, **where)
        except OSError:
            found[name] = None
        if found["config.json"] is None:
            return None  # and the files beside it are not looked up
    return Path(found["config.json"]).parent


def check_export(path, config=None, **kwargs) -> None:
    """The package's checks of an export before transformers' loader reads a weight: ``config.json``
    (or the ``config`` object an Auto class loaded from it) is a plsh_dist type whose ``plsh_dist``
    section is valid, agrees with the run config saved beside it (``config.resolved.json``) and with
    ``tokenizer.model``'s size; ``attn_implementation`` (keyword or config) is ``plsh_dist`` or unset;
    ``output_attentions`` is off. ValueError naming the file and field."""
    directory = _export_dir(path, kwargs)
    if directory is None:
        return
    source = directory / "config.json"
    if not isinstance(config, transformers.PreTrainedConfig):
        try:
            config = json.loads(source.read_text())
        except ValueError:
            return  # transformers' loader names the broken file
    model_type = config.get("model_type") if isinstance(config, dict) else getattr(config, "model_type", None)
    if model_type not in MODEL_TYPES:
        raise ValueError(f"{source}: model_type {model_type!r} is not a plsh_dist type ({sorted(MODEL_TYPES)}); "
                         f"{_CONVERT}" + _UNREGISTERED_HINT * str(model_type).endswith("_plsh"))
    attn, seed = read_section(config, str(source))
    model_cfg = ModelConfig.from_hf_config(config, source=str(source))
    get = config.get if isinstance(config, dict) else lambda k, d=None: getattr(config, k, d)
    if kwargs.get("output_attentions") or get("output_attentions") or get("_output_attentions"):
        raise ValueError(f"{source}: {_NO_ATTENTION_WEIGHTS}")
    implementation = kwargs.get("attn_implementation") or get("_attn_implementation")
    if implementation not in (None, "plsh_dist"):
        raise ValueError(
            f"{source}: this model was trained with plsh_dist attention (bias={attn.bias}, rope={attn.rope}); "
            f"attn_implementation={implementation!r} would run it without that positional bias. Load it "
            f"with attention={{'bias': 'alibi'}} (or another mode) instead to run it under another attention")
    _check_resolved(directory, model_cfg, attn, seed)
    _check_tokenizer(directory, model_cfg)


def _check_loaded(info: dict, path) -> None:
    """transformers' loading report of an export -> ValueError when a weight is missing, extra or of
    another shape (transformers would initialise a missing one at random and only log it)."""
    missing, unexpected = sorted(info.get("missing_keys") or ()), sorted(info.get("unexpected_keys") or ())
    mismatched = sorted(str(m) for m in info.get("mismatched_keys") or ())
    if missing or unexpected or mismatched:
        raise ValueError(f"{path}: weights do not match its config: missing {missing[:5]}, unexpected "
                         f"{unexpected[:5]}, other shapes {mismatched[:5]}")

# --- registration ---------------------------------------------------------------------


_UNREGISTERED_HINT = ("; or its family was added to the family table by code outside plsh_dist "
                      "(plsh_dist.models.families.register_family): run that registration first")


def register() -> None:
    """Make and register the model types of every family in the table, and of every family registered
    later, with AutoConfig / AutoModelForCausalLM / AutoTokenizer (once; idempotent)."""
    if not _BUILT:
        on_register(_add_family)
    register_model_types(MODEL_CLASSES, CONFIG_CLASSES, describe)  # build_model builds these classes


register()
