"""Measure the forward costs that decide whether SSD can pay off on this machine (one thread).

    python scripts/cost_regime.py [--target DIR] [--draft DIR] [--k 4] [--context 200]

The same measurement `python -m saguaro.train eval` writes into the cards of the pairs it trains.
"""

from __future__ import annotations

import argparse

from saguaro.models.catalog import DEFAULT_DRAFT, DEFAULT_MODEL, resolve_model
from saguaro.train.costs import cost_regime


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default=str(resolve_model(DEFAULT_MODEL)))
    p.add_argument("--draft", default=str(resolve_model(DEFAULT_DRAFT)))
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--context", type=int, default=200)
    args = p.parse_args()
    r = cost_regime(args.target, args.draft, args.k, args.context)
    t, d, k = r["target"], r["draft"], args.k
    print(f"target: T(1) {t['t1']:.2f} ms, T_verify({k + 1}) {t['t_k1']:.2f} ms")
    print(
        f"draft:  T(1) {d['t1']:.2f} ms, T_glue({k + 1}) {d['t_k1']:.2f} ms, "
        f"T(8 branches) {d['branch8']:.2f} ms"
    )
    print(
        f"K*T_draft(1) = {r['drafting_ms']:.2f} ms vs 0.5*T_verify = {0.5 * t['t_k1']:.2f} ms: "
        f"{'OK' if r['drafting_is_real'] else 'drafting too cheap'}"
    )
    print(
        f"T_glue + K*T_draft(8) = {r['build8_ms']:.2f} ms vs T_verify = {t['t_k1']:.2f} ms: "
        f"{'fits' if r['cache8_fits'] else 'does not fit'}"
    )


if __name__ == "__main__":
    main()
