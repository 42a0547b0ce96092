"""The mode lists of evaluate's and generate's --help come from the one registry of biases
(plsh_dist.biases.BIASES), so a new mode cannot be left out; every form they show parses."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from plsh_dist.eval.mode_specs import parse_modes, spec_usage
from plsh_dist.biases import BIASES

ROOT = Path(__file__).resolve().parents[2]
_VALUES = {"N": "4", "X": "2.0", "W": "16", "NAME": "stratified", "true|false": "false"}


@pytest.mark.parametrize("launcher", ["evaluate", "generate"])
def test_help_lists_every_mode(launcher):
    done = subprocess.run([sys.executable, str(ROOT / "launchers" / f"{launcher}.py"), "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())  # argparse wraps long help lines
    assert spec_usage() in text
    for mode in BIASES.values():
        assert re.search(rf"[ ,]{mode.spec}[:\[,;]", text), mode.spec
    assert "truncated[:s=N][:c=X][:sigma=X][:chunk=N]" in text


def test_every_form_shown_parses():
    forms, rope = spec_usage().split("; any with ")
    for form in forms.split(", "):
        base = re.sub(r"\[.*", "", form)
        for item in [base, *(base + opt for opt in re.findall(r"\[(:[^\]]+)\]", form)), base + rope]:
            item = re.sub(r"=(N|X|W|NAME|true\|false)\b", lambda m: "=" + _VALUES[m.group(1)], item)
            item = item.replace(":W", ":" + _VALUES["W"])
            parse_modes(item)  # raises for a form the parser does not accept
