"""The cost-regime measurement that goes into the model cards `saguaro train-pair` writes."""

from __future__ import annotations

from saguaro.train.costs import cost_regime
from saguaro.train.export import _cost_lines


def test_cost_regime_on_tiny_models(tiny_llama, tiny_draft):
    r = cost_regime(tiny_llama, tiny_draft, k=2, context=20)
    for model in ("target", "draft"):
        assert all(r[model][key] > 0 for key in ("t1", "t_k1", "branch8"))
    assert r["drafting_ms"] == 2 * r["draft"]["t1"]
    assert r["build8_ms"] == r["draft"]["t_k1"] + 2 * r["draft"]["branch8"]
    card = "\n".join(_cost_lines(r))
    assert "## Cost regime" in card and f"{r['target']['t1']:.2f} ms" in card
