"""Latency metrics of one request and their percentiles over many."""

import math

import numpy as np
import pytest

from minillm.metrics import RequestMetrics, percentile, summarize


def test_ttft_tpot_and_itls_from_timestamps():
    m = RequestMetrics(arrival_time=10.0, token_times=[10.2, 10.3, 10.45, 10.5], finish_time=10.5)
    assert m.ttft == pytest.approx(0.2)
    assert m.itls == pytest.approx([0.1, 0.15, 0.05])
    assert m.tpot == pytest.approx(0.1)  # (10.5 - 10.2) / 3
    assert m.latency == pytest.approx(0.5)


def test_single_token_request_has_no_tpot():
    m = RequestMetrics(arrival_time=0.0, token_times=[0.1], finish_time=0.1)
    assert m.tpot is None and m.itls == []


@pytest.mark.parametrize("q", [0, 13, 50, 90, 99, 100])
def test_percentile_matches_numpy(q):
    values = list(np.random.default_rng(q).exponential(size=37))
    assert percentile(values, q) == pytest.approx(np.percentile(values, q))


def test_summarize_aggregates_requests():
    reqs = [RequestMetrics(0.0, [0.1, 0.2, 0.3], 0.3), RequestMetrics(0.1, [0.5, 0.6], 0.6)]
    s = summarize(reqs)
    assert s["output_tokens"] == 5
    assert s["wall_time_s"] == pytest.approx(0.6)
    assert s["output_tokens_per_s"] == pytest.approx(5 / 0.6)
    assert s["ttft_s"]["p50"] == pytest.approx(0.25)
    assert s["itl_s"]["mean"] == pytest.approx(0.1)
    assert math.isnan(summarize([])["ttft_s"]["p50"])
