"""What ``--help`` shows: the user commands at the top level, each command's common options in
their groups (every one under ``--help-all``), and no reST or Markdown markup anywhere."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from saguaro.cli import COMMANDS, main
from saguaro.generate import generate_parser
from saguaro.options import GROUPS, HELP_ALL

INTERNAL = ("train-pair", "draft-worker")
# generate --help must fit a terminal screen or two, not pages
MAX_HELP_LINES = 80


def _help(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 0
    return capsys.readouterr().out


def test_python_m_saguaro_runs_the_cli():
    done = subprocess.run(
        [sys.executable, "-m", "saguaro", "--help"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and "generate" in done.stdout


def test_the_top_level_lists_user_commands_only(capsys):
    out = _help(["--help"], capsys)
    listed = [name for name in COMMANDS if name not in INTERNAL]
    assert all(name in out for name in listed)
    assert not any(name in out for name in INTERNAL)
    for name in INTERNAL:  # still runnable
        assert "usage: saguaro " + name in _help([name, "--help"], capsys)


@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_no_help_text_shows_markup(command, capsys):
    argv = [] if command is None else [command]
    texts = [_help([*argv, "--help"], capsys)]
    if command in ("generate", "chat", "serve", "bench", "train-draft"):
        texts.append(_help([*argv, HELP_ALL], capsys))
    for text in texts:
        assert "``" not in text and "`" not in text


def test_generate_help_is_short_and_grouped_and_help_all_lists_every_option(capsys):
    short = _help(["generate", "--help"], capsys)
    assert len(short.splitlines()) < MAX_HELP_LINES
    for group in ("basic", "sampling", "speculation", "placement"):
        assert f"\n{group}:\n" in short
    assert short.rstrip().endswith(f"saguaro generate {HELP_ALL}")
    assert "--kv-cache-gb" not in short and "--min-p" not in short  # advanced

    full = _help(["generate", HELP_ALL], capsys)
    flags = [a.option_strings[0] for a in generate_parser()._actions if a.option_strings]
    assert all(f in full for f in flags) and len(flags) > len(GROUPS) * 5
    assert "more options" not in full


def _some_value(action: argparse.Action) -> list[str]:
    """Arguments that give ``action`` a value it parses."""
    if action.nargs == 0:
        return [action.option_strings[0]]
    return [action.option_strings[0], str(action.choices[0]) if action.choices else "1"]


def test_every_option_parses_listed_or_not():
    parser = generate_parser()
    assert parser.hidden  # some are advanced
    for action in parser._actions:
        if action.option_strings and action.default != argparse.SUPPRESS:  # not the helps
            args = parser.parse_args(["prompt", *_some_value(action)])
            assert getattr(args, action.dest) is not None, action.dest
