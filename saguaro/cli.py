"""saguaro: generate, chat, serve and benchmark with exact speculative decoding (AR, SD, SSD or
auto), a target model verifying a draft's proposals."""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from saguaro.errors import run_command
from saguaro.launch import build_llm, engine_options, sampling_options, sampling_params
from saguaro.options import BASIC, OptionParser


def format_summary(metrics: dict[str, Any], elapsed: float) -> str:
    tokens = metrics.get("output_tokens", 0)
    parts = [f"{tokens} tokens in {elapsed:.2f}s ({tokens / elapsed:.1f} tok/s)"]
    if metrics.get("drafted"):
        parts.append(f"mean accepted length {metrics['mean_accepted_length']:.2f}")
        parts.append(f"acceptance {metrics['acceptance_rate']:.1%}")
        parts.append(
            "per-position " + " ".join(f"{a:.2f}" for a in metrics["per_position_acceptance"])
        )
    if metrics.get("cache_hit_rate") is not None:
        parts.append(f"cache hit rate {metrics['cache_hit_rate']:.1%}")
    return " | ".join(parts)


def generate_parser() -> OptionParser:
    parser = OptionParser(
        prog="saguaro generate",
        usage="%(prog)s [options] prompt",
        description="Complete one prompt.",
    )
    basic = parser.group(BASIC)
    basic.add_argument("prompt")
    basic.add_argument("--stream", action="store_true", help="print the text as it is generated")
    basic.add_argument(
        "--raw",
        action="store_true",
        help="continue the prompt as plain text instead of answering it as a user's turn in the "
        "model's chat template",
    )
    engine_options(parser, exclude=("seed",))  # --seed is the request's
    sampling_options(parser)
    return parser


def cmd_generate(argv: list[str]) -> int:
    args = generate_parser().parse_args(argv)
    params = sampling_params(args)
    llm = build_llm(args, exclude=("seed",))
    try:
        # An instruct model answers the prompt as a user's turn in its chat template (as `chat`
        # and the server's chat route do); --raw, or a model without a template, continues the
        # text itself, which is then printed before the continuation.
        chat = llm.tokenizer.has_chat_template and not args.raw
        turn = [{"role": "user", "content": args.prompt}]
        prompt = llm.tokenizer.encode_chat(turn) if chat else args.prompt
        echo = "" if chat else args.prompt
        start = time.perf_counter()
        if args.stream:
            sys.stdout.write(echo)
            for delta in llm.stream(prompt, params):
                sys.stdout.write(delta)
                sys.stdout.flush()
            out = llm.last_output
        else:
            out = llm.generate(prompt, params)[0]
            for i, sample in enumerate(out.samples or [out]):
                if out.samples:
                    sys.stdout.write(f"--- sample {i}\n")
                sys.stdout.write(echo + sample.text + "\n")
                for lp in sample.logprobs or []:  # token, log-probability, alternatives
                    top = " ".join(f"{llm.tokenizer.decode([t])!r}:{v:.3f}" for t, v in lp.top)
                    text = llm.tokenizer.decode([lp.token])
                    print(f"  {text!r}\t{lp.logprob:.4f}\t{top}", file=sys.stderr)
        elapsed = time.perf_counter() - start
        if args.stream:
            sys.stdout.write("\n")
        print(f"[{llm.config.mode}] " + format_summary(out.metrics, elapsed), file=sys.stderr)
    finally:
        llm.close()
    return 0


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
    "generate": Command(cmd_generate, "complete one prompt"),
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
