"""Microseconds per copy lookup: the chains' rule reading the whole context
(``Lookup.next_token(committed + tail)``) against the sequence's index
(``CopyIndex.next_token(committed, tail)``), on text-like token streams of growing length with
tails of 1-8 tokens (a branch's or a chain's own tokens). Checks that both answer alike.

    python docs/bench/draft/copy_lookups.py [--contexts 256,1024,4096,8192] [--repeats 5]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from saguaro.speculation.ngram import Lookup

VOCAB = 2000  # distinct tokens in the stream, Zipf-weighted as words are
TAILS = 200  # lookups timed per repeat
MAX_TAIL = 8


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--contexts", default="256,1024,4096,8192")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    lookup, rng = Lookup.of(2), random.Random(0)
    weights = [1 / (i + 1) for i in range(VOCAB)]
    print("| committed tokens | rule, µs a lookup | index, µs a lookup | index built, ms (once) |")
    print("|---:|---:|---:|---:|")
    for n in (int(c) for c in args.contexts.split(",")):
        tokens = rng.choices(range(VOCAB), weights, k=n)
        tails = [
            rng.choices(range(VOCAB), weights, k=rng.randrange(1, MAX_TAIL + 1))
            for _ in range(TAILS)
        ]
        rule, index_s, build_s = [], [], []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            want = [lookup.next_token(tokens + t) for t in tails]
            rule.append((time.perf_counter() - t0) / len(tails))
            index = lookup.index()
            t0 = time.perf_counter()
            index.next_token(tokens)
            build_s.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            got = [index.next_token(tokens, t) for t in tails]
            index_s.append((time.perf_counter() - t0) / len(tails))
            assert got == want
        med = statistics.median
        rule_us, index_us = med(rule) * 1e6, med(index_s) * 1e6
        print(f"| {n} | {rule_us:.1f} | {index_us:.1f} | {med(build_s) * 1e3:.1f} |")


if __name__ == "__main__":
    main()
