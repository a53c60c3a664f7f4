"""The greedy check: at temperature 0 every mode must reproduce AR's tokens exactly. The llama.cpp
peers are compared too but cannot fail the check: their own float arithmetic may take the other
branch of a near-tie, after which the sequences part. For them the check reports how long a
prefix of AR's tokens each request reproduces."""

from __future__ import annotations

from typing import Any

from saguaro.bench.backends import RequestResult
from saguaro.bench.config import PEER_MODES
from saguaro.bench.measure import Run
from saguaro.bench.plan import Variant

# Tokens shown from the first difference on, AR's and the mode's, for each mismatch.
MISMATCH_TOKENS_SHOWN = 8


def first_difference(want: list[int], got: list[int]) -> int:
    """The first position where the two token lists differ (the shorter length if one is a
    prefix of the other)."""
    pairs = zip(want, got, strict=False)
    return next((i for i, (a, b) in enumerate(pairs) if a != b), min(len(want), len(got)))


def not_checked(note: str) -> dict[str, Any]:
    """A greedy check's result where nothing was compared, and ``note`` saying why."""
    return {"ok": None, "checked": 0, "mismatches": [], "note": note}


def _ar_references(variants: list[Variant]) -> dict[str, str]:
    """AR's first variant per dtype, by dtype: the label a variant of that dtype is checked
    against."""
    references: dict[str, str] = {}
    for v in variants:
        if v.mode == "ar":
            references.setdefault(v.dtype, v.label)
    return references


def _batch_key(run: Run, label: str) -> tuple[str, str, int, int, int]:
    """The batch ``run`` measured, as run by variant ``label``."""
    return label, run.dataset, run.batch_size, run.repeat, run.batch_index


def _mismatch(run: Run, want: RequestResult, got: RequestResult) -> dict[str, Any]:
    """A request whose tokens differ from AR's: where it runs, the first difference, and the
    tokens from there on, AR's and the variant's."""
    pos = first_difference(want.token_ids, got.token_ids)
    shown = slice(pos, pos + MISMATCH_TOKENS_SHOWN)
    return {
        "variant": run.variant,
        "dataset": run.dataset,
        "batch_size": run.batch_size,
        "repeat": run.repeat,
        "prompt_id": got.prompt_id,
        "first_difference": pos,
        "ar_tokens": want.token_ids[shown],
        "tokens": got.token_ids[shown],
    }


def check_greedy(runs: list[Run], variants: list[Variant]) -> dict[str, Any]:
    """At temperature 0 every variant must produce AR's tokens for every request: AR's first
    variant of the same dtype (a bfloat16 target is another model than its float32 weights;
    AR's other variants of that dtype, e.g. compiled, are checked against it; temperature 0 is
    the same under every sampling method). ``ok`` is None where there is nothing to compare (no
    AR, or no temperature-0 run). Peer variants (llama.cpp) are left out of ``ok`` and
    summarised under ``peers`` instead (:func:`peer_agreement`), against AR's first variant."""
    references = _ar_references(variants)
    if not references:
        return not_checked("ar not run: not checked")
    if not any(r.temperature == 0 for r in runs):
        return not_checked("no temperature-0 run")
    first = next(iter(references.values()))
    by_label = {v.label: v for v in variants}
    ar = {
        _batch_key(r, r.variant): r
        for r in runs
        if r.variant in references.values() and r.temperature == 0
    }
    peers = {v.label for v in variants if v.mode in PEER_MODES}
    checked = 0
    mismatches: list[dict[str, Any]] = []
    prefixes: dict[str, list[tuple[int, int, str]]] = {label: [] for label in peers}
    for run in runs:
        variant = by_label[run.variant]
        reference = first if run.variant in peers else references.get(variant.dtype, first)
        if run.temperature != 0 or run.variant == reference:
            continue
        ref = ar[_batch_key(run, reference)]
        pairs = list(zip(ref.gen.requests, run.gen.requests, strict=True))
        if run.variant in peers:
            prefixes[run.variant] += [peer_prefix(want, got) for want, got in pairs]
            continue
        checked += len(pairs)
        mismatches += [_mismatch(run, w, g) for w, g in pairs if w.token_ids != g.token_ids]
    out: dict[str, Any] = {"ok": not mismatches, "checked": checked, "mismatches": mismatches}
    if peers:
        out["peers"] = {label: peer_agreement(p) for label, p in sorted(prefixes.items())}
    return out


def peer_prefix(want: RequestResult, got: RequestResult) -> tuple[int, int, str]:
    """(matching prefix, AR's length, unit) of a peer's request: in tokens, or in characters of
    text where the peer's ids are its text tokenised again (llama.cpp-sd)."""
    if got.text is not None and want.text is not None:
        n = first_difference(list(want.text), list(got.text))
        return n, len(want.text), "chars"
    return first_difference(want.token_ids, got.token_ids), len(want.token_ids), "tokens"


def peer_agreement(prefixes: list[tuple[int, int, str]]) -> dict[str, Any]:
    """How closely a peer followed AR at temperature 0, from (matching prefix, AR's length, unit)
    per request: requests compared, requests identical (AR's whole output reproduced), the
    matching prefixes and their unit, their mean fraction of AR's output."""
    identical = sum(n == length for n, length, _ in prefixes)
    fraction = sum(n / length for n, length, _ in prefixes if length) / max(len(prefixes), 1)
    return {
        "checked": len(prefixes),
        "identical": identical,
        "matching_prefix": [n for n, _, _ in prefixes],
        "unit": sorted({u for _, _, u in prefixes}),
        "mean_prefix_fraction": fraction,
    }
