"""Run configuration: documented dataclasses, TOML loading, CLI overrides, checks.

One TOML file describes a run; each component receives only its own section:

    [run] [model] [attention] [data] [optim] [deepspeed] [parallel] [checkpoint] [logging]

Precedence: command line ``--section.key=value`` > file > dataclass defaults.
Unknown sections or keys are errors that name the key and list the valid ones.
``[model]`` and ``[attention]`` map onto the model package's ``ModelConfig`` and
``AttentionConfig`` (``[model].preset`` picks a preset; the other keys override
it; ``vocab_size`` defaults to the tokenizer's; ``init_from`` names a transformers
directory to start from, see ``plsh_dist.train.init_from``); ``[data]`` and ``[tokenizer]``
onto the data package's ``DataConfig`` and ``TokenizerConfig``. The DeepSpeed config is
generated from these sections (``deepspeed_config.py``), never written by hand.

The config is resolved once, by ``load_config`` (``config_from_table``), and
not changed afterwards: ``[model]`` and ``[attention]`` become full tables
(preset expanded, defaults filled), ``[model].vocab_size`` the tokenizer's
unless set: the existing tokenizer file's vocabulary, else
``[tokenizer].vocab_size`` (what a tokenizer still to be trained will have).
The resolved config written next to the outputs and into every checkpoint
is this object.
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from plsh_dist.config_check import check_field_types, did_you_mean, toml_literal
from plsh_dist.data.config import DataConfig, TokenizerConfig
from plsh_dist.distributed.sp_chunks import check_sp_divisible

__all__ = [
    "RunSection",
    "OptimSection",
    "DeepSpeedSection",
    "ParallelSection",
    "CheckpointSection",
    "LoggingSection",
    "RunConfig",
    "load_config",
    "parse_overrides",
    "apply_overrides",
    "to_toml",
]


def _positive(section: str, obj: Any, *names: str, allow_zero: bool = False) -> None:
    for name in names:
        value = getattr(obj, name)
        ok = isinstance(value, int) and not isinstance(value, bool) and (value >= 0 if allow_zero else value > 0)
        if not ok:
            bound = ">= 0" if allow_zero else ">= 1"
            raise ValueError(f"[{section}].{name} must be an integer {bound}, got {value!r}")


def _choice(section: str, name: str, value: Any, choices: tuple) -> None:
    if value not in choices:
        raise ValueError(f"[{section}].{name} = {value!r} is invalid; choose one of {list(choices)}")


@dataclass
class RunSection:
    """What the run is and where it writes."""

    name: str = "run"
    """Label shown in logs and tensorboard."""
    out_dir: str = "runs/run"
    """Outputs: metrics.jsonl, tensorboard/, checkpoints/, final/, resolved config."""
    seed: int = 0
    """Run seed: model init, data shuffling and the attention hash seeds derive from it."""
    max_steps: int = 100
    """Optimizer steps to train (each = grad_accum_steps micro-batches on every DP rank)."""
    device: str = "auto"
    """auto (cuda if available, else cpu) | cpu | cuda."""

    def __post_init__(self) -> None:
        check_field_types(self, "run")
        _positive("run", self, "max_steps")
        _positive("run", self, "seed", allow_zero=True)
        _choice("run", "device", self.device, ("auto", "cpu", "cuda"))
        if not self.out_dir:
            raise ValueError("[run].out_dir must be a non-empty path, e.g. out_dir = \"runs/my_run\"")


@dataclass
class OptimSection:
    """AdamW with linear warmup then cosine decay to ``min_lr``."""

    lr: float = 3e-4
    """Peak learning rate."""
    min_lr: float = 3e-5
    """Learning rate at the end of the cosine decay."""
    warmup_steps: int = 10
    """Linear warmup from 0 to lr over this many optimizer steps."""
    weight_decay: float = 0.1
    """AdamW decoupled weight decay (not applied to norms and biases)."""
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0
    """Max global gradient norm; 0 disables clipping."""
    grad_accum_steps: int = 1
    """Micro-batches accumulated per optimizer step."""

    def __post_init__(self) -> None:
        check_field_types(self, "optim")
        if self.lr <= 0:
            raise ValueError(f"[optim].lr must be > 0, got {self.lr}")
        if not 0 <= self.min_lr <= self.lr:
            raise ValueError(f"[optim].min_lr must be in [0, lr={self.lr}], got {self.min_lr}")
        for name in ("beta1", "beta2"):
            if not 0 <= getattr(self, name) < 1:
                raise ValueError(f"[optim].{name} must be in [0, 1), got {getattr(self, name)}")
        if self.weight_decay < 0 or self.eps <= 0 or self.grad_clip < 0:
            raise ValueError("[optim]: weight_decay and grad_clip must be >= 0 and eps > 0")
        _positive("optim", self, "grad_accum_steps")
        _positive("optim", self, "warmup_steps", allow_zero=True)


@dataclass
class DeepSpeedSection:
    """Engine settings; the DeepSpeed JSON is generated from these."""

    zero_stage: int = 0
    """ZeRO stage 0 (plain DDP), 1 (optimizer states), 2 (+gradients), 3 (+parameters)."""
    precision: str = "auto"
    """auto (bf16 on GPU, fp32 on CPU) | bf16 (GPU only) | fp32."""
    activation_checkpointing: bool = False
    """Recompute decoder layers in backward (HF gradient checkpointing) to save memory."""
    offload_optimizer: bool = False
    """ZeRO >= 1: keep optimizer states in CPU memory (GPU runs)."""
    loss_chunk_tokens: int = 2048
    """LM head + cross-entropy over chunks of this many tokens, each chunk's
    logits recomputed in backward (``plsh_dist.train.chunked_ce``): the loss
    holds at most (loss_chunk_tokens, vocab) fp32 logits instead of the whole
    (micro_batch_size x seq_len / sp_size, vocab) tensor and its softmax
    (~10 GB per rank at 16k tokens and a 152k vocabulary). 0 = the plain path
    (the model's full logits through F.cross_entropy). Default 2048: a chunk's
    working set stays under 1 GB at a 32k vocabulary (under 4 GB at 152k)
    while each chunk's matmuls (2048 rows) still run at full speed on a GPU;
    the cost is one extra LM-head matmul per step (the recompute). The two
    paths give the same loss to fp32 rounding (the golden losses pass under
    either). A memory knob like activation_checkpointing, hence this section."""

    def __post_init__(self) -> None:
        check_field_types(self, "deepspeed")
        _choice("deepspeed", "zero_stage", self.zero_stage, (0, 1, 2, 3))
        _choice("deepspeed", "precision", self.precision, ("auto", "bf16", "fp32"))
        if self.loss_chunk_tokens < 0:
            raise ValueError(
                f"[deepspeed].loss_chunk_tokens must be an integer >= 0 (0 = plain loss over the full logits), "
                f"got {self.loss_chunk_tokens}; e.g. loss_chunk_tokens = 4096"
            )


@dataclass
class ParallelSection:
    """Parallel layout; dp_size = world_size / sp_size is derived at launch."""

    sp_size: int = 1
    """Ranks sharing one sequence (sequence parallelism); must divide the world size."""
    timeout_s: int = 600
    """Seconds a collective may wait for a peer before this rank gives up and
    exits non-zero (a hung or dead rank must not hang the job forever)."""

    def __post_init__(self) -> None:
        check_field_types(self, "parallel")
        _positive("parallel", self, "sp_size", "timeout_s")


@dataclass
class CheckpointSection:
    """Checkpoints (DeepSpeed format + resolved config + tokenizer) and resume."""

    every_steps: int = 0
    """Save every N optimizer steps (0 = only at the end)."""
    resume: str = "auto"
    """auto (latest checkpoint in out_dir if any) | never | a checkpoint directory."""
    keep_last: int = 2
    """Keep this many step checkpoints (0 = keep all)."""
    export_safetensors: bool = True
    """Export final weights (HF layout, safetensors) to out_dir/final."""
    save_on_signal: bool = True
    """SIGTERM / SIGUSR1 (a scheduler's preemption or time-limit warning) make
    every rank finish its current optimizer step, write a checkpoint through
    the usual atomic path and exit with code 75; relaunching with --resume auto
    continues exactly (plsh_dist/train/preemption.py). The ranks agree on the
    step through the step's existing all-reduce (no extra collective). false =
    the signals keep their default action: the process dies at once and the
    run resumes from the last periodic checkpoint."""

    def __post_init__(self) -> None:
        check_field_types(self, "checkpoint")
        _positive("checkpoint", self, "every_steps", "keep_last", allow_zero=True)
        if not self.resume:
            raise ValueError("[checkpoint].resume must be auto, never or a checkpoint path")


@dataclass
class LoggingSection:
    """Metrics, progress and evaluation during training."""

    every_steps: int = 1
    """Write metrics.jsonl / tensorboard every N optimizer steps."""
    tensorboard: bool = True
    progress: bool = True
    """Progress bar on rank 0."""
    eval_every: int = 0
    """Validation loss every N steps (0 = only at the end)."""
    eval_batches: int = 8
    """Micro-batches per DP rank used for validation."""

    def __post_init__(self) -> None:
        check_field_types(self, "logging")
        _positive("logging", self, "every_steps")
        _positive("logging", self, "eval_every", "eval_batches", allow_zero=True)


_SECTIONS: dict[str, type] = {
    "run": RunSection,
    "optim": OptimSection,
    "deepspeed": DeepSpeedSection,
    "parallel": ParallelSection,
    "checkpoint": CheckpointSection,
    "logging": LoggingSection,
}
# Sections whose dataclasses live in plsh_dist.models (validated there).
_MODEL_SECTIONS = ("model", "attention")


@dataclass
class RunConfig:
    """The whole run. ``model`` and ``attention`` are plain tables, validated
    by ``plsh_dist.models`` (see ``model_configs``); ``load_config`` and
    ``config_from_table`` resolve them into full tables (module doc)."""

    run: RunSection = field(default_factory=RunSection)
    model: dict = field(default_factory=lambda: {"preset": "tiny"})
    attention: dict = field(default_factory=dict)
    data: DataConfig = field(default_factory=DataConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    optim: OptimSection = field(default_factory=OptimSection)
    deepspeed: DeepSpeedSection = field(default_factory=DeepSpeedSection)
    parallel: ParallelSection = field(default_factory=ParallelSection)
    checkpoint: CheckpointSection = field(default_factory=CheckpointSection)
    logging: LoggingSection = field(default_factory=LoggingSection)

    def to_dict(self) -> dict:
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            out[f.name] = dict(value) if isinstance(value, dict) else dataclasses.asdict(value)
        return out

    @property
    def init_from(self) -> str | None:
        """[model].init_from: a directory saved by transformers whose weights the run
        starts from (``plsh_dist.train.init_from``); None = random init."""
        return self.model.get("init_from")

    def model_configs(self, vocab_size: int | None = None):
        """``(ModelConfig, AttentionConfig)`` from [model] / [attention] ([model].init_from
        is not architecture and is left out).

        ``vocab_size``: the tokenizer's, used unless [model] sets one (a
        resolved config always does); default [tokenizer].vocab_size.
        """
        from plsh_dist.models import AttentionConfig, ModelConfig

        table = dict(self.model)
        init_from = table.pop("init_from", None)
        if init_from is not None and (not isinstance(init_from, str) or not init_from):
            raise ValueError(f"[model].init_from must be a directory path (a string), got {init_from!r}; e.g. "
                             f'init_from = "models/qwen3-0.6b" (written by transformers\' save_pretrained)')
        table.setdefault("vocab_size", vocab_size or self.tokenizer.vocab_size)
        return ModelConfig.from_dict(table), AttentionConfig.from_dict(dict(self.attention))

    def validate(self, world_size: int | None = None) -> None:
        """Cross-section checks of the values alone (no file is read); with
        ``world_size`` also the parallel layout. Reloading a checkpoint's
        resolved config runs only these (its data may live elsewhere now)."""
        sp = self.parallel.sp_size
        check_sp_divisible(self.data.seq_len, sp)
        if self.run.device == "cpu" and self.deepspeed.precision == "bf16":
            raise ValueError(
                '[deepspeed].precision = "bf16" needs a GPU but [run].device = "cpu"; '
                'set precision = "fp32" (or "auto": bf16 on GPU, fp32 on CPU), or device = "cuda"'
            )
        if world_size is not None:
            check_world_size(world_size, sp)
        self.model_configs()  # builds and checks the model's own dataclasses

    def check_tokenizer_vocab(self, vocab_size: int) -> None:
        """ValueError naming the fields when the tokenizer's ``vocab_size`` does not
        fit the resolved [model].vocab_size (train() calls it once the tokenizer
        is ready, before the model is built: a tokenizer file that appeared or
        changed after ``load_config`` resolved the vocabulary is caught here)."""
        model_vocab = self.model_configs()[0].vocab_size
        if vocab_size > model_vocab:
            raise ValueError(
                f"[model].vocab_size = {model_vocab} is smaller than the tokenizer's vocabulary of {vocab_size} "
                f"pieces ({self.tokenizer.model_path}): ids up to {vocab_size - 1} would index past the embedding. "
                f"[model].vocab_size was resolved when the config was loaded (if unset: the vocabulary of the "
                f"file at [tokenizer].model_path, else [tokenizer].vocab_size) and the tokenizer has changed "
                f"since; set [model].vocab_size >= {vocab_size} (or [tokenizer].vocab_size = {vocab_size}) "
                f"and start again"
            )

    def check_inputs(self) -> int:
        """Checks that read the disk, run by ``load_config`` before any work starts:
        every data path matches a file, and an existing tokenizer file is a
        SentencePiece model. Returns the tokenizer's vocabulary: the existing
        file's, else [tokenizer].vocab_size (what a tokenizer still to be
        trained will have)."""
        from plsh_dist.data.sources import resolve_files

        for name in ("train_files", "val_files"):
            patterns = getattr(self.data, name)
            if patterns:
                try:
                    resolve_files(patterns)
                except ValueError as exc:
                    raise ValueError(f"[data].{name}: {exc}") from exc
        path = Path(self.tokenizer.model_path)
        if path.is_file():
            from plsh_dist.data.tokenizer import Tokenizer

            try:
                vocab = Tokenizer.load(path).vocab_size
            except RuntimeError as exc:  # SentencePiece's error for a file that is not a model
                raise ValueError(
                    f"[tokenizer].model_path = {str(path)!r} is not a SentencePiece model ({exc}); "
                    "delete it to train a new one, or point model_path at a valid .model file"
                ) from exc
        else:
            vocab = self.tokenizer.vocab_size
        return vocab


def check_vocab_covers_tokenizer(model_vocab: Any, tokenizer_vocab: int, tokenizer_path: str) -> None:
    """ValueError when an explicit [model].vocab_size is smaller than the tokenizer's vocabulary.

    ``model_vocab``: [model].vocab_size as written (None = not set: the model
    then takes the tokenizer's size, which always fits).
    """
    if isinstance(model_vocab, int) and not isinstance(model_vocab, bool) and model_vocab < tokenizer_vocab:
        raise ValueError(
            f"[model].vocab_size = {model_vocab} is smaller than the tokenizer's vocabulary of {tokenizer_vocab} "
            f"pieces ({tokenizer_path}): ids up to {tokenizer_vocab - 1} would index past the embedding; "
            f"remove [model].vocab_size (it defaults to the tokenizer's) or set it >= {tokenizer_vocab}"
        )


def check_world_size(world_size: int, sp_size: int) -> None:
    """ValueError, printing every factor, unless ``sp_size`` divides ``world_size``."""
    if world_size % sp_size:
        divisors = [d for d in range(1, world_size + 1) if world_size % d == 0]
        raise ValueError(
            f"[parallel].sp_size={sp_size} does not divide world_size={world_size} "
            f"(world_size = dp_size x sp_size must hold exactly); set sp_size to one of {divisors}, "
            f"or launch a multiple of {sp_size} processes"
        )
    from plsh_dist.distributed import ParallelDims

    ParallelDims(world_size, sp_size)  # its own checks (positive sizes)


def _build_section(name: str, cls: type, table: dict):
    if not isinstance(table, dict):
        raise ValueError(f"[{name}] must be a TOML table, got {type(table).__name__}")
    valid = [f.name for f in dataclasses.fields(cls) if f.init]
    unknown = sorted(set(table) - set(valid))
    if unknown:
        raise ValueError(f"unknown key(s) {unknown} in [{name}]; valid keys are {valid}{did_you_mean(unknown, valid)}")
    try:
        return cls(**table)
    except (TypeError, ValueError) as exc:
        if str(exc).startswith(f"[{name}]"):
            raise ValueError(str(exc)) from exc  # already names the section and field
        raise ValueError(f"[{name}]: {exc}") from exc


def parse_overrides(args: list[str]) -> dict[str, dict[str, Any]]:
    """``["--optim.lr=1e-3", "--run.out_dir", "x"]`` -> ``{"optim": {"lr": 0.001}, ...}``.

    Values are parsed as TOML literals (numbers, booleans, arrays, quoted strings);
    anything that does not parse is kept as a bare string.
    """
    out: dict[str, dict[str, Any]] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--") or "." not in arg.split("=", 1)[0]:
            raise ValueError(f"override {arg!r} must look like --section.key=value (e.g. --optim.lr=1e-3)")
        if "=" in arg:
            key, raw = arg[2:].split("=", 1)
        else:
            if i + 1 >= len(args):
                raise ValueError(f"override {arg!r} has no value; write {arg}=VALUE")
            key, raw = arg[2:], args[i + 1]
            i += 1
        section, name = key.split(".", 1)
        try:
            value = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            value = raw
        out.setdefault(section, {})[name] = value
        i += 1
    return out


def apply_overrides(table: dict, overrides: dict[str, dict[str, Any]]) -> dict:
    """Merge overrides into a raw TOML table (section by section, key by key)."""
    merged = {k: dict(v) if isinstance(v, dict) else v for k, v in table.items()}
    for section, values in overrides.items():
        merged.setdefault(section, {}).update(values)
    return merged


def config_from_table(table: dict, *, tokenizer_vocab: int | None = None) -> RunConfig:
    """Build, check and resolve a ``RunConfig`` from a raw (already merged) table.

    No file is read. [model] and [attention] come back as full tables;
    [model].vocab_size, unless the table sets it, is ``tokenizer_vocab``
    (default [tokenizer].vocab_size). Resolving a resolved table changes nothing.
    """
    valid = list(_SECTIONS) + ["data", "tokenizer"] + list(_MODEL_SECTIONS)
    unknown = sorted(set(table) - set(valid))
    if unknown:
        raise ValueError(f"unknown section(s) {unknown}; valid sections are {valid}{did_you_mean(unknown, valid)}")
    sections = {**_SECTIONS, "data": DataConfig, "tokenizer": TokenizerConfig}
    kwargs: dict[str, Any] = {name: _build_section(name, cls, table.get(name, {})) for name, cls in sections.items()}
    for name in _MODEL_SECTIONS:
        if name in table:
            if not isinstance(table[name], dict):
                raise ValueError(f"[{name}] must be a TOML table")
            kwargs[name] = dict(table[name])
    cfg = RunConfig(**kwargs)
    cfg.validate()
    model_cfg, attn_cfg = cfg.model_configs(tokenizer_vocab)
    model = model_cfg.to_dict()
    if cfg.init_from is not None:
        model["init_from"] = cfg.init_from
    return dataclasses.replace(cfg, model=model, attention=attn_cfg.to_dict())


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> RunConfig:
    """Read a TOML run config, apply ``--section.key=value`` overrides, check it all.

    Raises ValueError (naming the field and the fix) before any work starts:
    the values (``RunConfig.validate``) and the inputs on disk (``check_inputs``),
    including an explicit [model].vocab_size smaller than the tokenizer's. The
    returned config is resolved (module doc) and is not changed afterwards.
    """
    table: dict = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ValueError(f"config file {str(path)!r} does not exist; pass --config configs/<run>.toml")
        with path.open("rb") as fh:
            try:
                table = tomllib.load(fh)
            except tomllib.TOMLDecodeError as exc:
                raise ValueError(f"{path}: invalid TOML: {exc}") from exc
    table = apply_overrides(table, parse_overrides(overrides or []))
    cfg = config_from_table(table)  # the values alone, before any file is read
    tokenizer_vocab = cfg.check_inputs()
    explicit_vocab = table.get("model", {}).get("vocab_size")
    check_vocab_covers_tokenizer(explicit_vocab, tokenizer_vocab, str(Path(cfg.tokenizer.model_path)))
    if explicit_vocab is None and cfg.model["vocab_size"] != tokenizer_vocab:
        cfg = config_from_table(table, tokenizer_vocab=tokenizer_vocab)  # an existing tokenizer file's vocabulary
    if cfg.init_from is not None:
        from plsh_dist.train.init_from import check_init_from

        check_init_from(cfg.init_from, *cfg.model_configs(), cfg.tokenizer.model_path)
    return cfg


# --- writing the resolved config ------------------------------------------------


def to_toml(cfg: RunConfig | dict) -> str:
    """Serialise the resolved config as TOML (None values are left out: TOML has no null)."""
    table = cfg.to_dict() if isinstance(cfg, RunConfig) else cfg
    lines = []
    for section, values in table.items():
        lines.append(f"[{section}]")
        lines += [f"{k} = {toml_literal(v, strict=True)}" for k, v in values.items() if v is not None]
        lines.append("")
    return "\n".join(lines)


def write_resolved(cfg: RunConfig, directory: str | Path) -> Path:
    """Write ``config.resolved.toml`` and ``config.resolved.json`` into ``directory``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.resolved.toml").write_text(to_toml(cfg))
    (directory / "config.resolved.json").write_text(json.dumps(cfg.to_dict(), indent=2, sort_keys=False) + "\n")
    return directory / "config.resolved.toml"
