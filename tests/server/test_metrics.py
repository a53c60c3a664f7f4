"""``/metrics``: request, token and latency counts in the Prometheus text format."""

from __future__ import annotations

import math

import httpx

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
    assert after['saguaro_draft_worker_state{state="none"}'] == 1
    assert after["saguaro_engine_up"] == 1 and after["saguaro_mean_accepted_length"] == 1
    assert math.isnan(after["saguaro_ssd_cache_hit_rate"])
    assert after["saguaro_kv_blocks_free"] == after["saguaro_kv_blocks_total"]
    r = httpx.get(f"{server.url}/metrics", headers=AUTH)
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
