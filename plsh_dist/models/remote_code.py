"""transformers' remote-code convention for exports: ``from_pretrained(dir, trust_remote_code=True)``
with no import of plsh_dist.

An export's ``config.json`` names plsh_dist's model types (``qwen3_plsh`` ...),
which transformers knows only once ``plsh_dist.models`` is imported
(:mod:`plsh_dist.models.hf_config` registers them). So that a plain
transformers session loads the directory too, each export also carries three
small modules and an ``auto_map`` pointing at them (in ``config.json`` and
``tokenizer_config.json``)::

    configuration_plsh.py   Qwen3PlshConfig, LlamaPlshConfig, MistralPlshConfig
    modeling_plsh.py        Qwen3PlshForCausalLM, LlamaPlshForCausalLM, MistralPlshForCausalLM
    tokenization_plsh.py    PlshTokenizer

They hold no model code: each class subclasses the installed package's own,
adding nothing, so the loaded model is exactly the one ``import plsh_dist.models``
gives (transformers marks the classes it loads this way for re-saving; marking
subclasses keeps plsh_dist's own classes unmarked). The package must be
installed where the export is loaded (nothing is downloaded); without it,
transformers names the missing package. Without ``trust_remote_code=True``
and without the import, transformers asks for ``trust_remote_code=True``.

The classes' own ``save_pretrained`` writes them (``Qwen3PlshForCausalLM`` and the
others: ``auto_map`` and the first two modules; ``PlshTokenizer``: its ``auto_map``
and the third), so a directory re-saved from a loaded export, however it was
loaded, is as loadable as the export; the export itself is written that way.
"""

from __future__ import annotations

import json
from pathlib import Path

_HEADER = '''"""plsh_dist export: lets transformers load this directory with trust_remote_code=True.

Needs the plsh_dist package installed (pip install -e <plsh_dist clone>); the classes
below are plsh_dist's own, unchanged. Alternatively: import plsh_dist.models, then
from_pretrained(this directory) without trust_remote_code.
"""
'''

MODULES = {
    "configuration_plsh.py": _HEADER + '''
from plsh_dist.models import hf_config


class Qwen3PlshConfig(hf_config.Qwen3PlshConfig):
    pass


class LlamaPlshConfig(hf_config.LlamaPlshConfig):
    pass


class MistralPlshConfig(hf_config.MistralPlshConfig):
    pass
''',
    "modeling_plsh.py": _HEADER + '''
from plsh_dist.models import hf_config


class Qwen3PlshForCausalLM(hf_config.Qwen3PlshForCausalLM):
    pass


class LlamaPlshForCausalLM(hf_config.LlamaPlshForCausalLM):
    pass


class MistralPlshForCausalLM(hf_config.MistralPlshForCausalLM):
    pass
''',
    "tokenization_plsh.py": _HEADER + '''
from plsh_dist.models import hf_tokenizer


class PlshTokenizer(hf_tokenizer.PlshTokenizer):
    pass
''',
}
"""File name -> source of the modules an export carries."""


#: The modules a saved model needs (its config and model classes); a saved tokenizer needs the third.
MODEL_MODULES = ("configuration_plsh.py", "modeling_plsh.py")
TOKENIZER_MODULES = ("tokenization_plsh.py",)


def auto_map(family_class_prefix: str) -> dict[str, str]:
    """``config.json``'s ``auto_map`` for ``"Qwen3"`` / ``"Llama"`` / ``"Mistral"``."""
    return {"AutoConfig": f"configuration_plsh.{family_class_prefix}PlshConfig",
            "AutoModelForCausalLM": f"modeling_plsh.{family_class_prefix}PlshForCausalLM"}


def write_remote_code(directory: str | Path, names=tuple(MODULES)) -> None:
    """Write the modules ``names`` (default all three) into a saved directory."""
    for name in names:
        (Path(directory) / name).write_text(MODULES[name])


def add_tokenizer_auto_map(directory: str | Path) -> None:
    """Point ``tokenizer_config.json``'s ``auto_map`` at ``tokenization_plsh.PlshTokenizer``."""
    path = Path(directory) / "tokenizer_config.json"
    table = json.loads(path.read_text())
    table["auto_map"] = {"AutoTokenizer": ["tokenization_plsh.PlshTokenizer", None]}
    path.write_text(json.dumps(table, indent=2, ensure_ascii=False) + "\n")
