"""Backends: the SSD backend keeps measuring once its draft worker has failed."""

from __future__ import annotations

from saguaro.bench.backends import SaguaroBackend
from saguaro.bench.config import BenchConfig
from saguaro.bench.plan import Variant
from saguaro.sampling import SamplingParams


def test_ssd_backend_after_its_worker_failed(tiny_llama, close_draft):
    """Once the draft worker is gone the engine runs AR; the bench keeps measuring and says so."""
    cfg = BenchConfig(model=str(tiny_llama), draft=str(close_draft), device="cpu")
    backend = SaguaroBackend(Variant("ssd", 2, "auto", "ssd"), cfg, 128, 2)
    params = [SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)]
    try:
        assert backend.generate([[1, 2, 3]], params).ssd_totals["rounds"] > 0
        backend.llm.engine._drop_proposer(RuntimeError("worker gone"))
        gen = backend.generate([[1, 2, 3]], params)
    finally:
        backend.close()
    assert len(gen.requests[0].token_ids) == 8
    assert gen.ssd_totals is None and "worker gone" in gen.draft_failure
