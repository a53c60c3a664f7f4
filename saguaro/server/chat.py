"""Chat prompts (shared with the HTTP server) and ``saguaro chat``, a streaming terminal chat.

Conversations are rendered with the tokenizer's chat template; a base model without one gets
``DEFAULT_CHAT_TEMPLATE`` (``role: content`` lines, then ``assistant:``).
"""

from __future__ import annotations

import sys
import time
from typing import Any

from saguaro.errors import RequestError
from saguaro.launch import build_llm, engine_options, sampling_options, sampling_params
from saguaro.options import BASIC, OptionParser


def turn_summary(metrics: dict[str, Any], elapsed: float) -> str:
    tokens = metrics.get("output_tokens", 0)
    rate = tokens / elapsed if elapsed > 0 else 0.0
    hit = metrics.get("cache_hit_rate")
    return " | ".join(
        [
            f"{tokens} tokens, {rate:.1f} tok/s",
            f"accepted length {metrics.get('mean_accepted_length', 1.0):.2f}",
            f"cache hit rate {hit:.0%}" if hit is not None else "cache hit rate n/a",
            f"prefix-cached prompt {metrics.get('cached_prompt_tokens', 0)}"
            f"/{metrics.get('prompt_tokens', 0)} tokens",
        ]
    )


def run_chat(llm: Any, params: Any, system: str | None = None) -> None:
    """Read user turns from stdin until EOF or ``/exit``; ``/reset`` starts a new conversation.
    Ctrl-C during a reply drops that turn; at the prompt it quits."""
    start_history = [{"role": "system", "content": system}] if system else []
    history = list(start_history)
    print(
        f"saguaro chat [{llm.config.mode}] {llm.engine.target_dir.name}: "
        "/reset clears the conversation, /exit or Ctrl-D quits",
        file=sys.stderr,
    )
    while True:
        try:
            line = input("you> ").strip()
        except (EOFError, KeyboardInterrupt):
            print()
            return
        if not line:
            continue
        if line in ("/exit", "/quit"):
            return
        if line == "/reset":
            history = list(start_history)
            print("(conversation cleared)", file=sys.stderr)
            continue
        history.append({"role": "user", "content": line})
        ids = llm.tokenizer.encode_chat(history)
        start = time.perf_counter()
        try:
            sys.stdout.write("assistant> ")
            for delta in llm.stream(ids, params):
                sys.stdout.write(delta)
                sys.stdout.flush()
        except RequestError as e:  # the conversation outgrew the context: say so, keep going
            print(f"\nerror: {e} (/reset starts over)", file=sys.stderr)
            history.pop()
            continue
        except KeyboardInterrupt:
            print(" [interrupted]")
            history.pop()
            continue
        out = llm.last_output
        history.append({"role": "assistant", "content": out.text})
        print()
        print(f"[{turn_summary(out.metrics, time.perf_counter() - start)}]", file=sys.stderr)


def chat_main(argv: list[str] | None = None) -> int:
    """``saguaro chat [--model DIR] [--draft DIR] [--mode M] [--k K] [sampling flags]``."""
    parser = OptionParser(
        prog="saguaro chat", description="Chat with a model in the terminal, streaming replies."
    )
    parser.group(BASIC).add_argument("--system", help="system prompt for every conversation")
    engine_options(parser, exclude=("seed",))  # --seed is the request's
    sampling_options(parser)
    args = parser.parse_args(argv)
    params = sampling_params(args)
    with build_llm(args, exclude=("seed",)) as llm:
        run_chat(llm, params, args.system)
    return 0
