"""Attention modes of an evaluation, parsed from a command-line spec.

    "plsh:s=8,plsh:s=32,alibi,fixed,window:512,truncated:s=8,none"

One comma-separated item per mode; options follow the mode name after colons:

    plsh[:s=N][:sigma=X][:sampler=iid|stratified]   positional LSH with s samples
    alibi[:sigma=X]                                  exact ALiBi (chunked)
    fixed[:sigma=X]                                  fixed blocks (also "fixed_blocks")
    window:W  or  window:w=W                         exact ALiBi on a W-token window
    truncated[:s=N | :c=X][:sigma=X]                 exact ALiBi on ceil(c sigma_h) tokens per head,
                                                     c = X, or ln N + 0.58 (PLSH's cost at s = N)
    none                                             no bias
    any mode may add  :rope=true|false

Options that are not given keep the checkpoint's trained attention config
(sigma, rope, chunk size...), so "alibi" on a PLSH checkpoint is exactly the
kernel that checkpoint's PLSH estimated.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from plsh_dist.biases import BIASES, bias_class
from plsh_dist.models import AttentionConfig

_INT_FIELDS = ("num_samples", "window", "chunk_size")
#: What a usage line shows for a field's value.
_FIELD_VALUE = {"num_samples": "N", "sigma": "X", "sampler": "NAME", "window": "W", "rope": "true|false",
                "chunk_size": "N", "truncate_c": "X"}


def _bias_of(name: str) -> str | None:
    """A spec's mode name -> ``AttentionConfig.bias`` (the registry's ``spec`` and ``aliases``)."""
    return next((cls.name for cls in BIASES.values() if name in (cls.spec, *cls.aliases)), None)


def spec_usage() -> str:
    """Every mode's spec form, generated from the registry (:data:`plsh_dist.biases.BIASES`), for
    ``--help`` texts: ``"none, alibi[:sigma=X][:chunk=N], ..., window:W[:sigma=X][:chunk=N], ...; any
    with :rope=true|false"``. Each option is shown once, under its first name (``s``, not ``num_samples``)."""
    forms = []
    for cls in BIASES.values():
        form, shown = cls.spec, {"rope"}
        if cls.positional:  # a bare value, required: "window:512"
            form, shown = f"{form}:{_FIELD_VALUE.get(cls.positional, 'V')}", shown | {cls.positional}
        for option, name in cls.options.items():
            if option not in shown and name not in shown:
                form += f"[:{option}={_FIELD_VALUE.get(name, 'V')}]"
                shown.add(name)
        forms.append(form)
    return ", ".join(forms) + "; any with :rope=true|false"


@dataclass(frozen=True)
class EvalMode:
    """One attention mode to evaluate the same weights under."""

    name: str
    """The spec item as given (``"plsh:s=8"``), used as its label in tables and plots."""
    bias: str
    """``AttentionConfig.bias`` of the mode."""
    overrides: dict[str, Any] = field(default_factory=dict)
    """AttentionConfig fields the spec sets (the rest come from the checkpoint)."""

    @property
    def stochastic(self) -> bool:
        """True when the attention depends on the hash seed (several seeds are evaluated)."""
        return bias_class(self.bias).seeded


def _parse_value(field_name: str, raw: str, item: str) -> Any:
    try:
        if field_name in _INT_FIELDS:
            return int(raw)
        if field_name in ("sigma", "truncate_c"):
            return float(raw)
        if field_name == "rope":
            if raw.lower() not in ("true", "false", "1", "0"):
                raise ValueError
            return raw.lower() in ("true", "1")
    except ValueError:
        raise ValueError(f"mode {item!r}: option value {raw!r} for {field_name} is not valid") from None
    return raw


def parse_modes(spec: str) -> list[EvalMode]:
    """``"plsh:s=8,alibi,window:512"`` -> list of ``EvalMode`` (checked, no duplicates).

    Raises ValueError naming the bad item and the accepted forms.
    """
    items = [item.strip() for item in spec.split(",") if item.strip()]
    if not items:
        raise ValueError(f"--modes is empty ({spec!r}); e.g. --modes plsh:s=8,alibi,fixed,window:512,none")
    modes, seen = [], set()
    for item in items:
        head, *opts = item.split(":")
        bias = _bias_of(head.strip().lower())
        if bias is None:
            names = sorted(name for cls in BIASES.values() for name in (cls.spec, *cls.aliases))
            raise ValueError(f"mode {item!r}: unknown mode {head!r}; use one of {names}")
        cls = bias_class(bias)
        overrides: dict[str, Any] = {}
        for opt in opts:
            if "=" not in opt:
                if cls.positional is None or cls.positional in overrides:
                    raise ValueError(f"mode {item!r}: option {opt!r} must look like key=value (e.g. s=8)")
                overrides[cls.positional] = _parse_value(cls.positional, opt.strip(), item)  # "window:512"
                continue
            key, raw = (x.strip() for x in opt.split("=", 1))
            if key not in cls.options:
                raise ValueError(f"mode {item!r}: option {key!r} is not valid for {head}; "
                                 f"valid options: {list(cls.options)}")
            name = cls.options[key]
            overrides[name] = _parse_value(name, raw, item)
        overrides = cls.check_spec(overrides, item)
        # Build once to run AttentionConfig's own checks on the values.
        attention_for(EvalMode(item, bias, overrides), AttentionConfig())
        if item in seen:
            raise ValueError(f"mode {item!r} is listed twice in --modes")
        seen.add(item)
        modes.append(EvalMode(item, bias, overrides))
    return modes


def attention_for(mode: EvalMode, trained: AttentionConfig) -> AttentionConfig:
    """The trained attention config with ``mode``'s bias and options applied.

    ``fixed_masks`` is turned off: evaluation chooses its masks by seed and
    window index (see ``extrapolation.py``).
    """
    try:
        return dataclasses.replace(trained, bias=mode.bias, fixed_masks=False, **mode.overrides)
    except ValueError as exc:
        raise ValueError(f"mode {mode.name!r}: {exc}") from None
