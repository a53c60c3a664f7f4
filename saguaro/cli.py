"""Command line: ``saguaro generate | chat | serve | bench | draft-worker | train-pair |
train-draft | import-gguf | fetch-pair``."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from saguaro.errors import SaguaroError
from saguaro.launch import build_llm, engine_options, sampling_options, sampling_params


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


def cmd_generate(args: argparse.Namespace) -> int:
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


def cmd_train_pair(argv: list[str]) -> int:
    from saguaro.train import main as train_main

    return train_main(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["train-pair"]:
        return cmd_train_pair(argv[1:])
    if argv[:1] == ["train-draft"]:
        from saguaro.train.draft_cli import main as train_draft_main

        return train_draft_main(argv[1:])
    if argv[:1] == ["serve"]:
        from saguaro.server.main import serve_main

        return serve_main(argv[1:])
    if argv[:1] == ["chat"]:
        from saguaro.server.chat import chat_main

        return chat_main(argv[1:])
    if argv[:1] == ["bench"]:
        from saguaro.bench import bench_main

        return bench_main(argv[1:])
    if argv[:1] == ["import-gguf"]:
        from saguaro.models.gguf_cli import main as import_main

        return import_main(argv[1:])
    if argv[:1] == ["fetch-pair"]:
        from saguaro.models.fetch import main as fetch_main

        return fetch_main(argv[1:])
    if argv[:1] == ["draft-worker"]:
        from saguaro.speculation.worker import main as worker_main

        return worker_main(argv[1:])
    parser = argparse.ArgumentParser(prog="saguaro", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="complete one prompt")
    gen.add_argument("prompt")
    gen.add_argument("--stream", action="store_true")
    gen.add_argument(
        "--raw",
        action="store_true",
        help="continue the prompt as plain text instead of answering it as a user's turn in the "
        "model's chat template",
    )
    engine_options(gen, exclude=("seed",))  # --seed is the request's
    sampling_options(gen)
    gen.set_defaults(func=cmd_generate)
    sub.add_parser("train-pair", help="train a small code target and its draft (see --help)")
    sub.add_parser("train-draft", help="distil a draft for a target (see --help)")
    sub.add_parser("import-gguf", help="write a GGUF file as a model directory (see --help)")
    sub.add_parser("fetch-pair", help="download the Qwen2.5-Coder pair's GGUF files (see --help)")
    sub.add_parser("draft-worker", help="run an SSD draft worker that joins a target (see --help)")
    sub.add_parser("bench", help="benchmark AR / SD / SSD / HF assisted generation (see --help)")
    sub.add_parser("serve", help="OpenAI-compatible HTTP server (see --help)")
    sub.add_parser("chat", help="terminal chat with live speculation metrics (see --help)")
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (SaguaroError, ValueError, NotImplementedError) as e:
        print(f"saguaro: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
