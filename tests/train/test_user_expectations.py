"""What users of a pretraining launcher expect (issue 40, item 6), through the launcher and the run's outputs."""

from __future__ import annotations

import pytest

from tests.launchers import load_launcher


def test_help_says_both_override_spellings_work(capsys):
    with pytest.raises(SystemExit) as done:
        load_launcher("pretrain").main(["--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--section.key=value or --section.key value" in text, text[-600:]
