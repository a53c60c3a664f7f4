"""``saguaro generate``: complete one prompt (as a user's turn in the model's chat template, or
as plain text with ``--raw``) and print it with a one-line summary of the run."""

from __future__ import annotations

import sys
import time
from typing import Any

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
