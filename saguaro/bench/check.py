"""The greedy check: at temperature 0 every mode must reproduce AR's tokens exactly."""

from __future__ import annotations

from typing import Any

from saguaro.bench.measure import Run
from saguaro.bench.plan import Variant

# Tokens shown from the first difference on, AR's and the mode's, for each mismatch.
MISMATCH_TOKENS_SHOWN = 8


def first_difference(want: list[int], got: list[int]) -> int:
    """The first position where the two token lists differ (the shorter length if one is a
    prefix of the other)."""
    pairs = zip(want, got, strict=False)
    return next((i for i, (a, b) in enumerate(pairs) if a != b), min(len(want), len(got)))


def check_greedy(runs: list[Run], variants: list[Variant]) -> dict[str, Any]:
    """At temperature 0 every variant must produce AR's tokens for every request (AR under the
    first sampling method is the reference; temperature 0 is the same under every method).
    ``ok`` is None where there is nothing to compare (no AR, or no temperature-0 run)."""
    reference = next((v.label for v in variants if v.mode == "ar"), None)
    if reference is None:
        return {"ok": None, "checked": 0, "mismatches": [], "note": "ar not run: not checked"}
    if not any(r.temperature == 0 for r in runs):
        return {"ok": None, "checked": 0, "mismatches": [], "note": "no temperature-0 run"}
    ar = {
        (r.dataset, r.batch_size, r.repeat, r.batch_index): r
        for r in runs
        if r.variant == reference and r.temperature == 0
    }
    checked, mismatches = 0, []
    for run in runs:
        if run.temperature != 0 or run.variant == reference:
            continue
        ref = ar[(run.dataset, run.batch_size, run.repeat, run.batch_index)]
        for want, got in zip(ref.gen.requests, run.gen.requests, strict=True):
            checked += 1
            if want.token_ids != got.token_ids:
                pos = first_difference(want.token_ids, got.token_ids)
                shown = slice(pos, pos + MISMATCH_TOKENS_SHOWN)
                mismatches.append(
                    {
                        "variant": run.variant,
                        "dataset": run.dataset,
                        "batch_size": run.batch_size,
                        "repeat": run.repeat,
                        "prompt_id": got.prompt_id,
                        "first_difference": pos,
                        "ar_tokens": want.token_ids[shown],
                        "tokens": got.token_ids[shown],
                    }
                )
    return {"ok": not mismatches, "checked": checked, "mismatches": mismatches}
