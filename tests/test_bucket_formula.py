"""The bucket formula lives in ``plsh_dist/hashing.py`` alone.

``floor((p - shift) / pitch)`` and the block start derived from it (``ceil(shift + b pitch)``,
corrected) are written once, in :func:`plsh_dist.hashing.bucket` and
:func:`plsh_dist.hashing.bucket_start`; every torch caller calls them. Triton kernels cannot
call torch: their ``@triton.jit`` copies are left out of the search, but each must name the
function it mirrors (``tests/ops/triton_kernel/test_device_tables.py`` holds them bit-equal).

The search reads code only (comments and strings are dropped, so a docstring may quote the
formula), one logical line at a time, with a pitch spelled ``pitch`` or ``delta``: a tripwire
for the formula copied, not a proof that nothing computes it under another name.
"""

import ast
import io
import re
import tokenize
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "plsh_dist"
HOME = PACKAGE / "hashing.py"

_NAME = r"(?:[\w\[\]]+ \. )*\w*(?:pitch|delta)\b"  # pitch, self . pitch, lsh . pitch, delta ...
#: The formula's forms, on code tokens joined by single spaces.
PATTERNS = {
    "floor((p - shift) / pitch)": re.compile(r"\bfloor \(.*/ " + _NAME),
    "(p - shift) // pitch": re.compile(r"// " + _NAME),
    "div(p - shift, pitch, rounding_mode=...)": re.compile(r"\bdiv \(.*, " + _NAME),
    "ceil(shift + b * pitch)": re.compile(r"\bceil \(.*\* " + _NAME),
}


def _jit_lines(tree: ast.AST) -> set[int]:
    """Lines of the functions decorated with ``triton.jit`` (or ``jit``)."""
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            for dec in node.decorator_list:
                target = dec.func if isinstance(dec, ast.Call) else dec
                name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
                if name == "jit":
                    lines.update(range(dec.lineno, node.end_lineno + 1))
    return lines


def code_lines(source: str) -> list[tuple[int, str]]:
    """(first line, code) of each logical line outside ``@triton.jit`` functions: tokens joined
    by one space, without comments and strings."""
    skip = _jit_lines(ast.parse(source))
    out, line, first = [], [], None
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type in (tokenize.NEWLINE, tokenize.ENDMARKER):
            if line:
                out.append((first, " ".join(line)))
            line, first = [], None
        elif tok.type in (tokenize.COMMENT, tokenize.STRING, tokenize.NL, tokenize.INDENT, tokenize.DEDENT):
            continue
        elif tok.start[0] not in skip:
            first = first or tok.start[0]
            line.append(tok.string)
    return out


def copies(source: str) -> list[tuple[int, str, str]]:
    """(line, form, code) of every copy of the formula in ``source``."""
    return [(n, form, code) for n, code in code_lines(source) for form, pattern in PATTERNS.items()
            if pattern.search(code)]


def test_the_bucket_formula_is_written_in_hashing_py_alone():
    found = [f"{path.relative_to(PACKAGE.parent)}:{n}: {form}: {code}"
             for path in sorted(PACKAGE.rglob("*.py")) if path != HOME
             for n, form, code in copies(path.read_text())]
    assert not found, ("the bucket formula is written outside plsh_dist/hashing.py; call "
                       "hashing.bucket / hashing.bucket_start instead:\n" + "\n".join(found))


def test_hashing_py_holds_the_formula():
    forms = {form for _, form, _ in copies(HOME.read_text())}
    assert {"floor((p - shift) / pitch)", "ceil(shift + b * pitch)"} <= forms


def test_the_search_finds_the_copies_it_replaced():
    """The lines the package held before the formula moved to hashing.py (ops/tile_bands.py's
    block_start and bounds, ops/flex.py across lines, plan/attention_cost.py), the other spellings
    (``//``, ``div``) and a Triton body outside a ``@triton.jit`` function: each one caught."""
    old = '''
def block_start(b, pitch, shift):
    c = torch.ceil(shift + b * pitch)
    return cand[0] + (torch.floor((cand - shift) / pitch) < b).sum(0)

def bounds(self, layout, tokens):
    pitch, shift = self.pitch.T[:, :, None], self.shift.T[:, :, None]  # (Hh, s, 1)
    b = torch.floor((layout.positions[tokens].to(torch.float64) - shift) / pitch)

def score_mod(score, b, h, q_idx, kv_idx):
    same = torch.floor((p[q_idx] - u) / delta) == torch.floor(
        (p[kv_idx] - u) / delta)  # across lines

def sizes(T, pitch):
    return torch.bincount(torch.floor(torch.arange(T, dtype=torch.float64) / pitch).long())

def others(p, lsh):
    return (p - lsh.shift) // lsh.pitch, torch.div(p - lsh.shift, lsh.pitch, rounding_mode="floor")

def not_a_kernel(p, pitch, shift):
    return tl.math.floor((p - shift) / pitch)
'''
    lines = sorted({n for n, _, _ in copies(old)})
    assert lines == [3, 4, 8, 11, 15, 18, 21], lines
    assert len([1 for n, _, _ in copies(old) if n == 18]) == 2  # // and div


def test_the_search_leaves_out_kernels_comments_and_strings():
    source = '''
@triton.jit
def _bucket(p, pitch, shift):
    return tl.math.floor((p - shift) / pitch)

def documented(p, pitch, shift):
    """floor((p - shift) / pitch)"""
    return bucket(p, pitch, shift)  # not floor((p - shift) / pitch)
'''
    assert copies(source) == []


def test_the_triton_copies_name_the_rule_they_mirror():
    tree = ast.parse((PACKAGE / "ops" / "triton" / "table_kernels.py").read_text())
    docs = {node.name: ast.get_docstring(node) or "" for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}
    assert "plsh_dist.hashing.bucket" in docs["_bucket"]
    assert "plsh_dist.hashing.bucket_start" in docs["_block_start"]
