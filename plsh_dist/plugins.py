"""Modules of the user's own that register something when imported (samplers, model families).

A run config names such a module (``[attention].sampler_module``, ``[model].family_module``); the
package imports it before it reads the names the module registers. One import and one set of
errors for every kind: a setting that is no dotted module name, or names a module that is not
importable here, is a ValueError naming the setting and the fix; an error raised inside the module
(it is there but broken) propagates unchanged.
"""

from __future__ import annotations

import importlib


def import_plugin_module(module: str, setting: str, *, registers: str, register: str, example: str,
                         own: str) -> None:
    """Import ``module``, which registers its ``registers`` (e.g. "samplers") with ``register`` (the
    registering function's dotted name) when imported. ``setting``: the config key or option that named
    it; ``example``: a module name for the message; ``own``: what leaving the setting out gives."""
    if (not isinstance(module, str) or not module or module != module.strip()
            or any(not part.isidentifier() for part in module.split("."))):
        raise ValueError(f"{setting} must be a dotted module name, got {module!r}; e.g. \"{example}\", "
                         f"or leave it out for {own}")
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name is None or not (module == exc.name or module.startswith(exc.name + ".")):
            raise  # the module is there; something it imports is not
        raise ValueError(
            f"{setting} = {module!r} cannot be imported: no module named {exc.name!r}. Name a module that "
            f"registers {registers} when imported ({register}) and is importable here (its folder on "
            f"sys.path: the working directory or PYTHONPATH); or leave {setting} out for {own}"
        ) from None
