"""Latency-only records (a gateway's default log: no token counts, no TTFT) through ingest and a real
tick: they reach the detector as samples and a node 3x slower than its peers is cut."""

from __future__ import annotations

import time

import numpy as np
import pytest

from harness.records import make_records
from outlier_admin.control.tick import run_tick
from outlier_admin.ingest.pipeline import submit

pytestmark = [pytest.mark.django_db, pytest.mark.services]
SLOW = "127.0.0.1:9003"


def test_latency_only_records_reach_the_detector(redis_client, make_group):
    make_group("g1")
    rng = np.random.default_rng(11)
    t0 = time.time()
    states, samples = [], 0
    for k in range(10):
        recs = make_records(t0 + k, rng=rng, slow={3: 3.0} if k >= 3 else {})
        for r in recs:  # what nginx combined + $request_time $upstream_addr $upstream_response_time gives
            del r["prompt_tokens"], r["completion_tokens"]
            r["ttft_ms"] = None
        out = submit([(i + 1, r, None) for i, r in enumerate(recs)], source="test")
        assert (out.accepted, out.latency_only) == (len(recs), len(recs))
        res = run_tick("g1", now=t0 + k + 0.5)
        samples += res.samples
        states.append((res.states[SLOW], res.weights[SLOW]))
    assert samples == 10 * 8 * 40  # every latency-only record applied, none refused by the detector
    assert states[:3] == [("healthy", 100)] * 3
    assert all(weight < 100 for _, weight in states[4:])  # cut within two ticks of the onset, and kept cut
    assert all(w == 100 for node, w in res.weights.items() if node != SLOW)  # its peers untouched
