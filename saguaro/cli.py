"""saguaro: generate, chat, serve and benchmark with exact speculative decoding (AR, SD, SSD or
auto), a target model verifying a draft's proposals."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable
from dataclasses import dataclass

from saguaro.errors import run_command


def lazy(target: str) -> Callable[[list[str]], int]:
    """The command ``module:function``, its module imported when the command runs: serve needs
    the serve extra, bench and training transformers, and one command need not pay for
    another's imports."""
    module, name = target.split(":")

    def run(argv: list[str]) -> int:
        return getattr(importlib.import_module(module), name)(argv)

    return run


@dataclass(frozen=True)
class Command:
    run: Callable[[list[str]], int]  # the command's own arguments -> exit code
    help: str | None = None  # None: internal (runs, but saguaro --help does not list it)


COMMANDS: dict[str, Command] = {
    "generate": Command(lazy("saguaro.generate:cmd_generate"), "complete one prompt"),
    "chat": Command(
        lazy("saguaro.server.chat:chat_main"), "chat in the terminal, with live speculation metrics"
    ),
    "serve": Command(lazy("saguaro.server.main:serve_main"), "serve an OpenAI-compatible HTTP API"),
    "bench": Command(
        lazy("saguaro.bench:bench_main"), "benchmark AR, SD, SSD, auto and peers side by side"
    ),
    "bench-serve": Command(
        lazy("saguaro.bench.serve:main"),
        "benchmark servers (saguaro's modes, llama-server) under concurrent load",
    ),
    "soak": Command(
        lazy("saguaro.bench.soak:main"),
        "soak a server with mixed requests, worker kills and disconnects; check nothing was lost",
    ),
    "fetch-pair": Command(
        lazy("saguaro.models.fetch:main"), "download the Qwen2.5-Coder pair's GGUF files"
    ),
    "import-gguf": Command(
        lazy("saguaro.models.gguf_cli:main"), "write a GGUF file as a model directory"
    ),
    "train-draft": Command(lazy("saguaro.train.draft_cli:main"), "distil a draft for a target"),
    # the project's own small code pair, trained from scratch
    "train-pair": Command(lazy("saguaro.train:main")),
    # SSD's draft worker, which an engine spawns (or, --draft-worker external, waits for)
    "draft-worker": Command(lazy("saguaro.speculation.worker:main")),
}


def top_parser() -> argparse.ArgumentParser:
    """``saguaro --help``, and the usage error for a name that is no command: the commands a
    user runs. It parses no command (each parses its own arguments), so the internal ones, left
    out, still run."""
    listed = {name: c.help for name, c in COMMANDS.items() if c.help}
    parser = argparse.ArgumentParser(
        prog="saguaro",
        description=__doc__,
        epilog="saguaro COMMAND --help describes a command's options.",
    )
    sub = parser.add_subparsers(dest="command", required=True, title="commands", metavar="COMMAND")
    for name, text in listed.items():
        sub.add_parser(name, help=text, add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    """``saguaro COMMAND ...``: the command's exit code. Every error a user can cause is one
    line on stderr and exit code 2 (saguaro.errors.run_command), whatever the command."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        top_parser().parse_args(argv)  # --help, or a usage error: either exits
    name = argv[0]
    return run_command(f"saguaro {name}", COMMANDS[name].run, argv[1:])


if __name__ == "__main__":  # python -m saguaro.cli, as scripts and older notes run it
    raise SystemExit(main())
