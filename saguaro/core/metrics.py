"""Speculation metrics from round records, with the field's definitions (docs/design.md §11).

- mean accepted length = 1 + accepted / rounds (counts the recovery / bonus token);
- acceptance rate = accepted / drafted; per-position acceptance: of rounds that drafted at least
  j tokens, the fraction that accepted at least j;
- cache hit rate = rounds whose outcome was prepared / SSD rounds.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from saguaro.core.records import RoundRecord


def summarize(records: Iterable[RoundRecord]) -> dict[str, Any]:
    records = list(records)
    rounds = len(records)
    if rounds == 0:
        return {"rounds": 0}
    drafted = sum(r.num_drafted for r in records)
    accepted = sum(r.num_accepted for r in records)
    max_k = max(r.num_drafted for r in records)
    per_pos = []
    for j in range(1, max_k + 1):
        tried = [r for r in records if r.num_drafted >= j]
        per_pos.append(sum(r.num_accepted >= j for r in tried) / len(tried))
    out: dict[str, Any] = {
        "rounds": rounds,
        "drafted": drafted,
        "accepted": accepted,
        "mean_accepted_length": 1 + accepted / rounds,
        "acceptance_rate": accepted / drafted if drafted else None,
        "per_position_acceptance": per_pos,
        "accepted_histogram": dict(sorted(Counter(r.num_accepted for r in records).items())),
        "target_s": sum(r.target_s for r in records),
        "draft_s": sum(r.draft_s for r in records),
        # the strategy and proposals of each round (mode auto chooses them step by step)
        "choices": {
            f"{mode}:{k}": n / rounds
            for (mode, k), n in sorted(Counter((r.mode, r.num_drafted) for r in records).items())
        },
    }
    ssd = [r for r in records if r.hit is not None]
    if ssd:
        hits = [r for r in ssd if r.hit]
        misses = [r for r in ssd if not r.hit]
        out["cache_hit_rate"] = len(hits) / len(ssd)
        out["mean_accepted_length_hit"] = (
            1 + sum(r.num_accepted for r in hits) / len(hits) if hits else None
        )
        out["mean_accepted_length_miss"] = (
            1 + sum(r.num_accepted for r in misses) / len(misses) if misses else None
        )
        out["backups"] = dict(Counter(r.backup for r in misses if r.backup))
        out["wait_s"] = sum(r.wait_s for r in ssd)
    return out
