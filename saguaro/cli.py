"""Command line: ``saguaro generate | chat | serve | bench | draft-worker | train-pair``."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from saguaro.errors import SaguaroError


def _engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="target model directory (default: the bundled code model)")
    p.add_argument("--draft", help="draft model directory (default: the bundled draft)")
    p.add_argument("--mode", choices=["ar", "sd", "ssd"], default="ar")
    p.add_argument("--k", type=int, default=4, help="speculation length K")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--device", default="auto", help="auto | cpu | cuda")
    p.add_argument("--max-model-len", type=int)
    p.add_argument("--threads", type=int, help="torch threads for this process")
    p.add_argument(
        "--sampling",
        choices=["auto", "rejection", "coupled"],
        help="how T > 0 is sampled exactly: rejection sampling, or coupled (a seed gives the "
        "same text in every mode); auto: coupled for ssd, rejection otherwise (the default)",
    )
    p.add_argument(
        "--draft-top-m",
        type=int,
        help="sd/ssd: the draft samples from its top-M tokens; exact for any M "
        "(default: EngineConfig.draft_top_m)",
    )
    ssd = p.add_argument_group("SSD (--mode ssd)")
    ssd.add_argument(
        "--fanout",
        default="auto",
        help="auto | geometric | empirical | F_0,...,F_K (per-outcome branch counts)",
    )
    ssd.add_argument("--cache-budget", type=int, help="branches per sequence (default: online)")
    ssd.add_argument("--saguaro-c", type=float, default=1.0, help="Saguaro sampling C in (0, 1]")
    ssd.add_argument("--backup", choices=["auto", "neural", "fast"], default="auto")
    ssd.add_argument("--draft-cpus", type=_cpus, help="cores for the draft worker, e.g. 1 or 2-3")
    ssd.add_argument("--target-cpus", type=_cpus, help="cores for the target, e.g. 0")
    ssd.add_argument("--no-pin", action="store_true", help="do not pin processes to cores")
    ssd.add_argument("--draft-port", type=int, default=0, help="rendezvous port (0: free port)")
    ssd.add_argument("--draft-addr", default="127.0.0.1", help="rendezvous address")
    ssd.add_argument(
        "--external-draft",
        action="store_true",
        help="wait for a draft worker started with `saguaro draft-worker` (e.g. on another host)",
    )


def _cpus(spec: str) -> list[int]:
    out: list[int] = []
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def _sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--seed", type=int)
    p.add_argument("--stop", action="append", help="stop string (repeatable)")
    p.add_argument("--ignore-eos", action="store_true")


def build_llm(args: argparse.Namespace) -> Any:
    from saguaro import LLM

    return LLM(
        model=args.model,
        draft=args.draft,
        mode=args.mode,
        num_speculative_tokens=args.k,
        dtype=args.dtype,
        device=args.device,
        max_model_len=args.max_model_len,
        num_threads=args.threads,
        **{k: v for k in ("draft_top_m", "sampling") if (v := getattr(args, k)) is not None},
        fanout=args.fanout,
        cache_budget=args.cache_budget,
        saguaro_c=args.saguaro_c,
        backup=args.backup,
        draft_cpus=args.draft_cpus,
        target_cpus=args.target_cpus,
        pin_cpus=not args.no_pin,
        draft_port=args.draft_port,
        draft_addr=args.draft_addr,
        draft_worker="external" if args.external_draft else "spawn",
    )


def sampling_params(args: argparse.Namespace) -> Any:
    from saguaro import SamplingParams

    return SamplingParams(
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        max_tokens=args.max_tokens,
        seed=args.seed,
        stop=args.stop,
        ignore_eos=args.ignore_eos,
    )


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
    llm = build_llm(args)
    try:
        start = time.perf_counter()
        if args.stream:
            sys.stdout.write(args.prompt)
            for delta in llm.stream(args.prompt, params):
                sys.stdout.write(delta)
                sys.stdout.flush()
            out = llm.last_output
        else:
            out = llm.generate(args.prompt, params)[0]
            sys.stdout.write(args.prompt + out.text)
        elapsed = time.perf_counter() - start
        sys.stdout.write("\n")
        print(f"[{args.mode}] " + format_summary(out.metrics, elapsed), file=sys.stderr)
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
    if argv[:1] == ["serve"]:
        from saguaro.server.app import serve_main

        return serve_main(argv[1:])
    if argv[:1] == ["chat"]:
        from saguaro.server.chat import chat_main

        return chat_main(argv[1:])
    if argv[:1] == ["bench"]:
        from saguaro.bench import bench_main

        return bench_main(argv[1:])
    if argv[:1] == ["draft-worker"]:
        from saguaro.speculation.worker import main as worker_main

        return worker_main(argv[1:])
    parser = argparse.ArgumentParser(prog="saguaro", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="complete one prompt")
    gen.add_argument("prompt")
    gen.add_argument("--stream", action="store_true")
    _engine_args(gen)
    _sampling_args(gen)
    gen.set_defaults(func=cmd_generate)
    sub.add_parser("train-pair", help="train the bundled draft/target pair (see --help)")
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
