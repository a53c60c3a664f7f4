"""``/metrics``: request, token and latency counts in the Prometheus text format, written by
prometheus_client from a registry of each server's own."""

from __future__ import annotations

import math

import httpx
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from saguaro import LLM
from saguaro.server.routes import build_app
from tests.server.conftest import AUTH, GREEDY, MODEL


def test_metrics_count_requests_tokens_and_latency(server, client):
    before = server.metrics()
    client.completions.create(model=MODEL, prompt="x", max_tokens=5, **GREEDY)
    after = server.metrics()

    def delta(key: str) -> float:
        return after[key] - before.get(key, 0.0)

    assert delta('saguaro_requests_total{finish_reason="length"}') == 1
    assert delta("saguaro_generation_tokens_total") == 5
    assert delta("saguaro_prompt_tokens_total") == 1
    assert delta("saguaro_request_latency_seconds_count") == 1
    assert delta("saguaro_time_to_first_token_seconds_count") == 1
    assert delta('saguaro_accepted_length_bucket{le="1"}') == 5  # AR: one token per round
    assert delta('saguaro_http_requests_total{route="/v1/completions",status="200"}') == 1
    # one step prefills the prompt and commits the first token, then one step a token
    assert delta("saguaro_engine_steps_total") == 5
    parts = [
        delta(f"saguaro_engine_{part}_seconds_total") for part in ("step", "forward", "propose")
    ]
    assert 0 < parts[1] and parts[1] + parts[2] < parts[0]  # AR proposes nothing: ~0 s
    assert after['saguaro_draft_worker_state{state="none"}'] == 1
    assert after["saguaro_engine_up"] == 1 and after["saguaro_mean_accepted_length"] == 1
    assert math.isnan(after["saguaro_ssd_cache_hit_rate"])
    assert after["saguaro_kv_blocks_free"] == after["saguaro_kv_blocks_total"]
    r = httpx.get(f"{server.url}/metrics", headers=AUTH)
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")


def test_metrics_parse_as_prometheus_families(server, client):
    """The exposition parses with prometheus_client's own parser: each family with its type, the
    histograms with cumulative buckets ending at +Inf whose last one is their count."""
    client.completions.create(model=MODEL, prompt="x", max_tokens=3, **GREEDY)
    text = httpx.get(f"{server.url}/metrics", headers=AUTH).text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    kinds = {name: f.type for name, f in families.items()}
    assert kinds["saguaro_requests"] == "counter"  # the parser names a counter without _total
    assert kinds["saguaro_kv_blocks_free"] == "gauge"
    assert kinds["saguaro_request_latency_seconds"] == "histogram"
    info = families["saguaro_info"].samples[0]
    assert info.labels == {"model": MODEL, "mode": "ar", "k": "0"} and info.value == 1
    samples = families["saguaro_accepted_length"].samples
    buckets = [s for s in samples if s.name.endswith("_bucket")]
    counts = [s.value for s in buckets]
    assert counts == sorted(counts) and buckets[-1].labels["le"] == "+Inf"
    (count,) = [s.value for s in samples if s.name.endswith("_count")]
    assert count == counts[-1] >= 3


def test_each_app_has_a_registry_of_its_own(tiny_llama):
    """Two apps in one process keep their metrics apart, and neither touches the default
    registry."""
    before = {m.name for m in REGISTRY.collect()}
    with LLM(model=str(tiny_llama), max_model_len=128) as llm:
        one, two = build_app(llm, served_model_name="one"), build_app(llm, served_model_name="two")
        registries = [app.state.served.registry for app in (one, two)]
        assert registries[0] is not registries[1] and REGISTRY not in registries
        for registry, name in zip(registries, ("one", "two"), strict=True):
            assert (
                registry.get_sample_value("saguaro_info", {"model": name, "mode": "ar", "k": "0"})
                == 1
            )
    assert {m.name for m in REGISTRY.collect()} == before
