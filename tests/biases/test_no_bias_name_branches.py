"""Outside the bias files and their registry (plsh_dist/biases/), no code branches on a bias name.

A branch is a comparison with a bias or spec name (``cfg.bias == "window"``, ``bias in ("plsh",
"fixed_blocks")``), a ``match`` case on one, or a dict keyed by two or more of them (a dispatch
table). Found by reading the code's syntax tree, so comments, docstrings and messages do not count.
"""

from __future__ import annotations

import ast
from pathlib import Path

from plsh_dist.biases import BIASES

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("plsh_dist", "launchers")
BIAS_FILES = ROOT / "plsh_dist" / "biases"


def _names() -> set[str]:
    return {name for cls in BIASES.values() for name in (cls.name, cls.spec, *cls.aliases)}


def _strings(node: ast.AST) -> set[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return set().union(*(_strings(e) for e in node.elts)) if node.elts else set()
    return set()


def branches(source: str, names: set[str]) -> list[tuple[int, str]]:
    """(line, what) of every branch on one of ``names`` in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            hit = set().union(*(_strings(n) for n in (node.left, *node.comparators))) & names
            if hit:
                found.append((node.lineno, f"comparison with {sorted(hit)}"))
        elif isinstance(node, ast.MatchValue) and _strings(node.value) & names:
            found.append((node.lineno, f"match case {sorted(_strings(node.value) & names)}"))
        elif isinstance(node, ast.Dict):
            keys = set().union(*(_strings(k) for k in node.keys if k is not None)) if node.keys else set()
            if len(keys & names) >= 2:
                found.append((node.lineno, f"table keyed by {sorted(keys & names)}"))
    return found


def test_no_code_outside_the_bias_files_branches_on_a_bias_name():
    names, found = _names(), []
    for folder in SCANNED:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if BIAS_FILES in path.parents:
                continue
            found += [f"{path.relative_to(ROOT)}:{line}: {what}" for line, what in branches(path.read_text(), names)]
    assert not found, "branches on bias names outside plsh_dist/biases/ (ask the bias object instead):\n" + \
        "\n".join(found)


def test_the_scan_finds_the_branches_it_forbids():
    old = '''
if cfg.bias == "window":
    pass
samples = cfg.num_samples if cfg.bias == "plsh" else 1
hashed = setup.bias in ("plsh", "fixed_blocks")
TABLE = {"alibi": 1, "truncated": 2}
match mode:
    case "none":
        pass
print("plsh", {"plsh": 1})  # a message and a one-name dict are not branches
'''
    assert sorted(line for line, _ in branches(old, _names())) == [2, 4, 5, 6, 8]
