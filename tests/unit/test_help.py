"""The engine's ``--help`` names no task: a fork with a task of its own inherits every word of it. Only
the list of config groups, read from the fork's configs/, names the fork's options."""

from __future__ import annotations

import re
import sys

import pytest

from litlab.cli import evaluate, predict, train
from tests.conftest import REPO, option_names

GROUPS_LISTED = "(* marks what this command line picks):\n"


def task_words() -> set[str]:
    """What names the example tasks: their packages in src/project/ and the options of the groups
    that describe a task (data, model, experiment), e.g. digits, cnn, char_lm."""
    packages = {p.name for p in (REPO / "src" / "project").iterdir() if (p / "__init__.py").is_file()}
    return packages | {option for group in ("data", "model", "experiment") for option in option_names(group)}


def help_text(main, program: str, monkeypatch, capsys) -> str:
    monkeypatch.setattr(sys, "argv", [program, "--help"])
    with pytest.raises(SystemExit) as exited:
        main()
    assert exited.value.code == 0
    return capsys.readouterr().out


def without_the_group_list(text: str) -> str:
    if GROUPS_LISTED not in text:
        return text
    before, listed = text.split(GROUPS_LISTED, 1)
    return before + listed.split("\n\n", 1)[1]


@pytest.mark.parametrize(
    "main,program",
    [(train.main, "litlab-train"), (evaluate.main, "litlab-eval"), (predict.main, "litlab-predict")],
)
def test_the_engines_help_names_no_task(main, program, monkeypatch, capsys):
    words = task_words()
    assert {"digits", "cnn", "char_lm"} <= words  # the examples' words are found, not an empty set
    text = without_the_group_list(help_text(main, program, monkeypatch, capsys))
    assert text.startswith(f"{program}: ") and "Flags:" in text
    named = sorted(w for w in words if re.search(rf"\b{re.escape(w)}\b", text, re.I))
    assert named == [], f"{program} --help names the example tasks: {named}"
