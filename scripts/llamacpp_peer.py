"""llama.cpp's own throughput on saguaro's models, outside the bench: write the target (and draft)
as GGUF, then run llama.cpp's ``llama-bench`` (AR decode speed, tg N) on them, printing every
command it runs so that it can be repeated by hand. ``saguaro bench --modes ar,llama.cpp`` is
the side-by-side measurement on the same prompts; this is llama.cpp measuring itself.

    python scripts/llamacpp_peer.py --bin /work/llamacpp/build/bin [--tokens 128] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
from pathlib import Path

from saguaro import bundled
from saguaro.bench.backends import cached_gguf


def run(cmd: list[str]) -> str:
    print("$", shlex.join(cmd), flush=True)
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bin", required=True, help="directory of llama.cpp's binaries")
    p.add_argument("--model", default=str(bundled.TARGET_DIR))
    p.add_argument("--draft", default=str(bundled.DRAFT_DIR))
    p.add_argument("--cache", default="~/.cache/saguaro/gguf")
    p.add_argument("--dtype", default="f32", choices=("f32", "f16"))
    p.add_argument("--tokens", type=int, default=128, help="tokens generated per repetition")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--repetitions", type=int, default=5)
    a = p.parse_args()

    rows = []
    for name, model_dir in (("target", a.model), ("draft", a.draft)):
        gguf = cached_gguf(Path(model_dir), a.cache, a.dtype)
        out = run(
            [
                str(Path(a.bin) / "llama-bench"),
                "-m", str(gguf), "-p", "0", "-n", str(a.tokens), "-t", str(a.threads),
                "-r", str(a.repetitions), "-o", "json",
            ]
        )  # fmt: skip
        for r in json.loads(out):
            rows.append((name, r["n_threads"], r["n_gen"], r["avg_ts"], r["stddev_ts"]))
    print("| model | threads | tokens | tok/s | sd |")
    print("|---|---:|---:|---:|---:|")
    for name, threads, n, ts, sd in rows:
        print(f"| {name} | {threads} | {n} | {ts:.1f} | {sd:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
