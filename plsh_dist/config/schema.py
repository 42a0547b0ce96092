"""The run config: one documented dataclass per TOML section, and the table <-> config steps.

One TOML file describes a run; each component receives only its own section:

    [run] [model] [attention] [data] [tokenizer] [optim] [memory] [deepspeed] [parallel] [checkpoint] [logging]

Unknown sections or keys are errors that name the key and list the valid ones.
``[model]`` is the model package's ``ModelConfig`` (``preset`` picks a preset,
the other keys override it) plus ``init_from``, a transformers directory to
start from (``plsh_dist.models.pretrained``); ``[attention]`` is its
``AttentionConfig``; ``[data]`` and ``[tokenizer]`` are the data package's
``DataConfig`` and ``TokenizerConfig``. The DeepSpeed config is generated from
these sections (``plsh_dist.train.deepspeed_config``), never written by hand.

A table becomes a config once, in ``config_from_table`` (``load_config`` in
:mod:`plsh_dist.config.loading` reads the file, the overrides and the disk
first), and is not changed afterwards: every section is a typed dataclass,
the preset expanded and the defaults filled, and ``[model].vocab_size``,
unless set, is the tokenizer's. The resolved config written next to the
outputs and into every checkpoint is this object (``write_resolved``,
record.py; ``read_resolved`` reads it back).

Renamed keys (``RENAMED``): a config or checkpoint written before a key moved
still loads; the old key is accepted with a one-line notice naming the new one.
This module reads no file but the resolved config it is asked for.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomllib

from plsh_dist.config_check import check_field_types, did_you_mean
from plsh_dist.data.config import DataConfig, TokenizerConfig
from plsh_dist.distributed import ParallelDims
from plsh_dist.distributed.sp_chunks import check_sp_divisible
from plsh_dist.models.activation_checkpoint import AC_MODES
from plsh_dist.models.config import AttentionConfig, ModelConfig, presets
from plsh_dist.models.families import import_family_module


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


#: The values ``[run].compile`` accepts.
COMPILE_BACKENDS = ("off", "inductor", "aot_eager")


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
    compile: str = "off"
    """Compile each decoder layer on its own before DeepSpeed wraps the model, as torchtitan does
    (``layer.compile(fullgraph=True)``: one graph per layer, the attention one custom op in it,
    ``plsh_dist.ops.custom_ops``): ``"off"``, ``"inductor"`` (torch.compile's default backend,
    the speed-up) or ``"aot_eager"`` (traced through dynamo and AOTAutograd, run eagerly: no
    code generation, for checking a model compiles). The first step pays the compile. Refused with
    [deepspeed].zero_stage = 3 (its parameter-gathering hooks break each layer's graph)."""

    def __post_init__(self) -> None:
        check_field_types(self, "run")
        _choice("run", "compile", self.compile, COMPILE_BACKENDS)
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
    """Linear warmup from 0 to lr over this many optimizer steps. More than [run].max_steps is
    refused (the rate would never reach lr) unless decay_end is set past max_steps (the run
    is then the first steps of that longer schedule); more than a set decay_end is refused."""
    weight_decay: float = 0.1
    """AdamW decoupled weight decay (not applied to norms and biases)."""
    beta1: float = 0.9
    """AdamW's decay of the first moment (the gradient's running mean), in [0, 1)."""
    beta2: float = 0.95
    """AdamW's decay of the second moment (the squared gradient's running mean), in [0, 1)."""
    eps: float = 1e-8
    """AdamW's epsilon, added to the second moment's square root (> 0)."""
    grad_clip: float = 1.0
    """Max global gradient norm; 0 disables clipping."""
    grad_accum_steps: int = 1
    """Micro-batches accumulated per optimizer step."""
    decay_end: int = 0
    """Optimizer step at which the cosine decay reaches min_lr (flat at min_lr
    after it); 0 = [run].max_steps. A resume keeps the rate of every step
    already trained, so training a run on past its planned end needs this set
    to the run's own end: ``--run.max_steps=200 --optim.decay_end=40`` trains
    steps 41..200 at min_lr (docs/training.md, "Resume")."""

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
        _positive("optim", self, "warmup_steps", "decay_end", allow_zero=True)


@dataclass
class MemorySection:
    """How training trades compute for memory (the same numbers either way)."""

    activation_checkpointing: bool = False
    """Checkpoint each decoder layer (``plsh_dist.models.apply_activation_checkpointing``): backward
    recomputes what the layer did not keep, to save memory; the gradients are the same. Works with
    [run].compile (the checkpoint inside the compiled layer). How much is recomputed:
    activation_checkpointing_mode."""
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
    either)."""
    activation_checkpointing_mode: str = "full"
    """With activation_checkpointing: "full" (a layer keeps its input only and backward reruns its
    whole forward: the least memory, one extra forward) | "selective" (a layer keeps its matmuls' and
    the attention op's outputs and recomputes only the cheap ops between them: norms, rotary
    embedding, the MLP's activation; more memory than "full", no matmul or attention run twice)."""

    def __post_init__(self) -> None:
        check_field_types(self, "memory")
        _choice("memory", "activation_checkpointing_mode", self.activation_checkpointing_mode, AC_MODES)
        if self.activation_checkpointing_mode != "full" and not self.activation_checkpointing:
            raise ValueError(
                f'[memory].activation_checkpointing_mode = "{self.activation_checkpointing_mode}" needs '
                "activation_checkpointing = true; set it, or leave the mode out")
        if self.loss_chunk_tokens < 0:
            raise ValueError(
                f"[memory].loss_chunk_tokens must be an integer >= 0 (0 = plain loss over the full logits), "
                f"got {self.loss_chunk_tokens}; e.g. loss_chunk_tokens = 4096"
            )


@dataclass
class DeepSpeedSection:
    """Engine settings; the DeepSpeed JSON is generated from these."""

    zero_stage: int = 0
    """ZeRO stage 0 (plain DDP), 1 (optimizer states), 2 (+gradients), 3 (+parameters)."""
    precision: str = "auto"
    """auto (bf16 on GPU, fp32 on CPU) | bf16 | fp32. bf16 on CPU runs through DeepSpeed's
    CPU accelerator: slower than fp32 there, it is the GPU's arithmetic where CI can test it."""
    master_weights: str = "fp32"
    """With bf16: fp32 (weights kept and updated in fp32, bf16 copies for the model; gradients
    reduced in fp32 at ZeRO >= 1) | bf16 (the paper's precision: bf16 weights, gradients and AdamW
    moments, no fp32 copy; DeepSpeed's bf16_master_weights_and_grads, ZeRO 1-3 without
    offload_optimizer). Ignored in fp32."""
    offload_optimizer: bool = False
    """ZeRO >= 1: keep optimizer states in CPU memory (GPU runs)."""

    def __post_init__(self) -> None:
        check_field_types(self, "deepspeed")
        _choice("deepspeed", "zero_stage", self.zero_stage, (0, 1, 2, 3))
        _choice("deepspeed", "precision", self.precision, ("auto", "bf16", "fp32"))
        _choice("deepspeed", "master_weights", self.master_weights, ("fp32", "bf16"))
        if self.master_weights == "bf16":
            if self.precision == "fp32":
                raise ValueError('[deepspeed].master_weights = "bf16" needs bf16 weights, but precision = "fp32"; '
                                 'set precision = "bf16", or master_weights = "fp32"')
            if self.zero_stage == 0:
                raise ValueError('[deepspeed].master_weights = "bf16" needs ZeRO 1-3 (DeepSpeed keeps bf16 master '
                                 'weights only in its ZeRO optimizers), but zero_stage = 0; e.g. zero_stage = 1')
            if self.offload_optimizer:
                raise ValueError('[deepspeed].master_weights = "bf16" with offload_optimizer = true needs '
                                 "DeepSpeed's CPU Adam, which this trainer does not use; set offload_optimizer = "
                                 'false, or master_weights = "fp32"')


def resolve_precision(section: DeepSpeedSection, device_type: str) -> str:
    """``"bf16"`` or ``"fp32"`` for this device: ``auto`` is bf16 on CUDA only."""
    if section.precision == "auto":
        return "bf16" if device_type == "cuda" else "fp32"
    return section.precision


def resolve_master_weights(section: DeepSpeedSection, device_type: str) -> str:
    """``"bf16"`` or ``"fp32"``: the dtype the optimizer updates; fp32 whenever the run is fp32."""
    if resolve_precision(section, device_type) == "fp32":
        if section.master_weights == "bf16":  # precision = "auto" that resolved to fp32
            raise ValueError('[deepspeed].master_weights = "bf16" needs bf16 weights, but precision = "auto" is '
                             f'fp32 on {device_type}; set precision = "bf16", or master_weights = "fp32"')
        return "fp32"
    return section.master_weights


@dataclass
class ParallelSection:
    """Parallel layout; dp_size = world_size / sp_size is derived at launch."""

    sp_size: int = 1
    """Ranks sharing one sequence (sequence parallelism); must divide the world size."""
    timeout_s: int = 600
    """Seconds a collective may wait for a peer before this rank gives up and
    exits non-zero (a hung or dead rank must not hang the job forever)."""
    rendezvous_timeout_s: int = 15
    """Seconds a rank may take to reach the rendezvous address (MASTER_ADDR:MASTER_PORT) before
    it exits 1 naming the address and the cause (unknown host, network unreachable, connection
    refused): checked before joining the process group (plsh_dist/distributed/rendezvous.py). Raise
    it when the ranks of a multi-node launch start more than this far apart."""

    def __post_init__(self) -> None:
        check_field_types(self, "parallel")
        _positive("parallel", self, "sp_size", "timeout_s", "rendezvous_timeout_s")


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
    """Mirror the logged metrics to tensorboard (out_dir/tensorboard)."""
    progress: bool = True
    """Progress on rank 0's stderr: a bar on a terminal, else one line per logged step, each with
    the elapsed time and ETA (PLSH_PROGRESS=0 turns it off too)."""
    eval_every: int = 0
    """Validation loss every N steps (0 = only at the end)."""
    eval_batches: int = 8
    """Micro-batches per DP rank used for validation."""
    peak_tflops: float = 0.0
    """Peak TFLOP/s of one device, for the model FLOPs utilisation (mfu) in the progress
    line, metrics.jsonl and tensorboard. 0 = from the GPU's name (bf16 dense: H100 / H200
    989, A100 312; plsh_dist/train/metrics_log.py); on a CPU, an unlisted GPU or an fp32 run
    no peak is known and only the achieved TFLOP/s is logged."""

    def __post_init__(self) -> None:
        check_field_types(self, "logging")
        if self.peak_tflops < 0:  # finite: check_field_types
            raise ValueError(f"[logging].peak_tflops must be >= 0 (0 = from the device), got {self.peak_tflops!r}")
        _positive("logging", self, "every_steps")
        _positive("logging", self, "eval_every", "eval_batches", allow_zero=True)


def _default_model() -> ModelConfig:
    return dataclasses.replace(presets["tiny"], vocab_size=TokenizerConfig().vocab_size)


#: ``RunConfig`` fields written in the ``[model]`` table when set (in this order), not ``ModelConfig``'s.
_MODEL_EXTRAS = ("family_module", "init_from")


@dataclass
class RunConfig:
    """The whole run, one typed section per TOML table (module doc).

    ``model`` and ``attention`` are the model package's own dataclasses,
    handed as they are to ``build_model``; ``init_from`` and ``family_module``
    are written in the TOML's ``[model]`` table but are not architecture, so
    they are kept apart (``ModelConfig`` maps onto a transformers config).
    """

    run: RunSection = field(default_factory=RunSection)
    model: ModelConfig = field(default_factory=_default_model)
    """[model]: the decoder's architecture, preset expanded, vocab_size resolved."""
    attention: AttentionConfig = field(default_factory=AttentionConfig)
    """[attention]: how the decoder's attention is computed (the trained mode)."""
    data: DataConfig = field(default_factory=DataConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    optim: OptimSection = field(default_factory=OptimSection)
    memory: MemorySection = field(default_factory=MemorySection)
    deepspeed: DeepSpeedSection = field(default_factory=DeepSpeedSection)
    parallel: ParallelSection = field(default_factory=ParallelSection)
    checkpoint: CheckpointSection = field(default_factory=CheckpointSection)
    logging: LoggingSection = field(default_factory=LoggingSection)
    init_from: str | None = None
    """[model].init_from: a directory saved by transformers whose weights the run
    starts from (``plsh_dist.models.pretrained``); None = random init."""
    family_module: str | None = None
    """[model].family_module: a module to import before ``family`` is checked, which registers
    model families when imported (:func:`plsh_dist.models.families.register_family`), e.g.
    ``"mylab.families"`` (importable here: its folder on ``sys.path``). ``None``: plsh_dist's
    own families only. Written into checkpoints with ``family``, so whatever reads them imports
    the same module; a resume may change it (``family`` is compared)."""

    def __post_init__(self) -> None:
        if self.init_from is not None and (not isinstance(self.init_from, str) or not self.init_from):
            raise ValueError(f"[model].init_from must be a directory path (a string), got {self.init_from!r}; e.g. "
                             f'init_from = "models/qwen3-0.6b" (written by transformers\' save_pretrained)')
        if self.family_module is not None:
            import_family_module(self.family_module, "[model].family_module")

    def to_dict(self) -> dict:
        """The TOML tables, section by section (``[model]`` holds ``family_module`` and ``init_from``
        when set)."""
        out = {f.name: dataclasses.asdict(getattr(self, f.name)) for f in dataclasses.fields(self)
               if f.name not in _MODEL_EXTRAS}
        for name in _MODEL_EXTRAS:
            if getattr(self, name) is not None:
                out["model"][name] = getattr(self, name)
        return out

    def validate(self, world_size: int | None = None) -> None:
        """Cross-section checks of the values alone (no file is read); with
        ``world_size`` also the parallel layout. Reloading a checkpoint's
        resolved config runs only these (its data may live elsewhere now)."""
        sp = self.parallel.sp_size
        check_sp_divisible(self.data.seq_len, sp)
        if self.run.compile != "off" and self.deepspeed.zero_stage == 3:
            raise ValueError(
                f'[run].compile = "{self.run.compile}" with [deepspeed].zero_stage = 3 cannot run: ZeRO-3 gathers a '
                f"layer's parameters in module hooks that DeepSpeed keeps out of torch.compile "
                f"(torch.compiler.disable), a graph break inside each compiled layer that fullgraph refuses; "
                f'set zero_stage = 2 (or 1) to compile, or compile = "off" to keep ZeRO-3')
        if self.attention.backend == "flex":
            raise ValueError(
                '[attention].backend = "flex" computes the attention output only (PyTorch\'s FlexAttention has no '
                'CPU backward): training cannot use it; set backend = "auto" (flex is for evaluation and '
                'generation, where no gradient is taken)')
        if world_size is not None:
            check_world_size(world_size, sp)


def _model_section(table: Any, tok: TokenizerConfig, tokenizer_vocab: int | None) -> tuple[ModelConfig, Any, Any]:
    """[model] -> ``(ModelConfig, init_from, family_module)``: the one place the vocabulary is resolved.
    ``family_module`` is imported first, so that the family (and a preset of it) it registers is known.

    ``vocab_size`` unset: the tokenizer's, ``tokenizer_vocab`` (``load_config``: its
    file's, else [tokenizer].vocab_size, what a tokenizer still to be trained will
    have), default [tokenizer].vocab_size. Set: it must cover ``tokenizer_vocab``
    when given (a resolved config read back is not checked against a tokenizer).
    """
    if not isinstance(table, dict):
        raise ValueError("[model] must be a TOML table")
    table = dict(table)
    init_from = table.pop("init_from", None)
    family_module = table.pop("family_module", None)
    if family_module is not None:
        import_family_module(family_module, "[model].family_module")
    explicit = "vocab_size" in table
    table.setdefault("vocab_size", tokenizer_vocab or tok.vocab_size)
    model = ModelConfig.from_dict(table)
    if explicit and tokenizer_vocab is not None:
        model.check_vocab_covers(tokenizer_vocab, tok.model_path,
                                 fix=f"remove [model].vocab_size (it defaults to the tokenizer's) or set it >= "
                                     f"{tokenizer_vocab}")
    return model, init_from, family_module


def check_world_size(world_size: int, sp_size: int) -> None:
    """ValueError, printing every factor, unless ``sp_size`` divides ``world_size``."""
    if world_size % sp_size:
        divisors = [d for d in range(1, world_size + 1) if world_size % d == 0]
        raise ValueError(
            f"[parallel].sp_size={sp_size} does not divide world_size={world_size} "
            f"(world_size = dp_size x sp_size must hold exactly); set sp_size to one of {divisors}, "
            f"or launch a multiple of {sp_size} processes"
        )
    ParallelDims(world_size, sp_size)  # its own checks (positive sizes)


def build_section(name: str, cls: type, table: dict):
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


#: Keys that moved: ``(old section, key) -> (new section, key)``. A table that
#: still uses an old key loads with a one-line notice naming the new one.
RENAMED: dict[tuple[str, str], tuple[str, str]] = {
    ("deepspeed", "activation_checkpointing"): ("memory", "activation_checkpointing"),
    ("deepspeed", "loss_chunk_tokens"): ("memory", "loss_chunk_tokens"),
}


def _notice(text: str) -> None:
    """One line on stderr, from one process of a launch (rank 0, or a process outside a launch)."""
    if os.environ.get("RANK", "0") == "0":
        print(f"plsh_dist: {text}", file=sys.stderr, flush=True)


def upgrade_table(table: dict, source: str = "config") -> dict:
    """``table`` with every key of ``RENAMED`` under its new name (a copy; a notice per key).

    ValueError when both the old and the new key are set: which one is meant is not clear.
    """
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in table.items()}
    for (old_sec, key), (new_sec, new_key) in RENAMED.items():
        section = out.get(old_sec)
        if not isinstance(section, dict) or key not in section:
            continue
        value = section.pop(key)
        target = out.setdefault(new_sec, {})
        if not isinstance(target, dict):
            raise ValueError(f"[{new_sec}] must be a TOML table")
        if new_key in target:
            raise ValueError(f"{source}: both [{old_sec}].{key} and [{new_sec}].{new_key} are set; "
                             f"keep only [{new_sec}].{new_key}")
        target[new_key] = value
        _notice(f"{source}: [{old_sec}].{key} is now [{new_sec}].{new_key} (accepted; rename it)")
    return out


_SECTIONS: dict[str, type] = {
    "run": RunSection,
    "data": DataConfig,
    "tokenizer": TokenizerConfig,
    "optim": OptimSection,
    "memory": MemorySection,
    "deepspeed": DeepSpeedSection,
    "parallel": ParallelSection,
    "checkpoint": CheckpointSection,
    "logging": LoggingSection,
}


def config_from_table(table: dict, *, tokenizer_vocab: int | None = None, source: str = "config") -> RunConfig:
    """Build, check and resolve a ``RunConfig`` from a raw (already merged) table.

    No file is read. Renamed keys are accepted (``upgrade_table``).
    [model].vocab_size, unless the table sets it, is ``tokenizer_vocab`` (default
    [tokenizer].vocab_size); set, it must cover ``tokenizer_vocab`` when given.
    Resolving a resolved table changes nothing. ``source`` names the table in notices.
    """
    table = upgrade_table(table, source)
    valid = list(_SECTIONS) + ["model", "attention"]
    unknown = sorted(set(table) - set(valid))
    if unknown:
        raise ValueError(f"unknown section(s) {unknown}; valid sections are {valid}{did_you_mean(unknown, valid)}")
    kwargs: dict[str, Any] = {name: build_section(name, cls, table.get(name, {})) for name, cls in _SECTIONS.items()}
    attention = table.get("attention", {})
    if not isinstance(attention, dict):
        raise ValueError("[attention] must be a TOML table")
    kwargs["attention"] = AttentionConfig.from_dict(attention)
    kwargs["model"], kwargs["init_from"], kwargs["family_module"] = _model_section(
        table.get("model", {"preset": "tiny"}), kwargs["tokenizer"], tokenizer_vocab)
    cfg = RunConfig(**kwargs)
    cfg.validate()
    return cfg


def read_resolved(directory: str | Path) -> RunConfig:
    """The resolved run config saved with weights (``config.resolved.json`` in ``directory``),
    written by this version or an older one (renamed keys are accepted)."""
    cfg_file = Path(directory) / "config.resolved.json"
    if not cfg_file.is_file():
        raise ValueError(f"checkpoint {directory} has no config.resolved.json (written by launchers/pretrain.py); "
                         "cannot rebuild the model without it")
    try:
        table = json.loads(cfg_file.read_text())
    except ValueError as exc:
        raise ValueError(f"{cfg_file} is not valid JSON ({exc})") from None
    return config_from_table(table, source=str(cfg_file))
