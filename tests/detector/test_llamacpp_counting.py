"""llama.cpp's rows count every decoded token once: live from /slots while a request runs, the rest
from the finished-request counters when it ends (``detector.engines.llamacpp.slots_row``)."""

from __future__ import annotations

from dataclasses import fields, replace

import orjson
import pytest

from detector.engine_metrics import EngineCounters, advance


def counters(gen_tokens: float, gen_s: float, slots) -> EngineCounters:
    return EngineCounters(engine="llamacpp", prompt_total=0.0, prompt_s=0.0, gen_tokens=gen_tokens, gen_s=gen_s,
                          running=float(len(slots)), slots=tuple((*s, 0, 0.0) for s in slots))


def test_a_request_seen_decoding_and_one_never_seen_are_each_counted_once():
    # Task 7 decodes 40 tokens at 10 ms from t=0.1 to 0.5 and is seen at 0.25 (16 decoded) and 0.5 (40);
    # task 8 runs 20 tokens between 0.55 and 0.70, between two scrapes. The counters add each request's
    # tokens and time when it ends.
    scrapes = [
        (0.00, counters(0, 0.0, [])),
        (0.25, counters(0, 0.0, [(0, 7, 16, 10)])),
        (0.50, counters(0, 0.0, [(0, 7, 39, 10)])),
        (0.75, counters(60, 0.39 + 0.19, [])),  # both ended: 40 + 20 tokens in 0.39 + 0.19 s
    ]
    prev, rows = None, []
    for ts, cur in scrapes:
        row, keep = advance("127.0.0.1:8080", prev, ts, cur)
        prev = (ts, keep)
        rows.append(row)
    tokens = sum(r[3] for r in rows if r)
    token_ms = sum(r[4] for r in rows if r)
    assert tokens == 60  # not 60 + the 23 /slots already counted
    assert token_ms == pytest.approx(580.0)
    assert rows[2][3:5] == [23.0, 250.0]  # live: task 7 between its two snapshots
    assert rows[3][3] == 37 and rows[3][4] == pytest.approx(330.0)  # the rest, once


def test_a_snapshot_stored_in_the_older_layout_reads_with_nothing_counted():
    c = counters(5, 0.1, [(0, 7, 16, 10)])
    stored = c.to_list()
    stored = stored[: [f.name for f in fields(EngineCounters)].index("slots") + 1]
    stored[-1] = [list(s[:4]) for s in c.slots]  # as an older scraper kept it: no balance, 4-field slots
    assert EngineCounters.from_list(stored) == replace(c)


def test_a_request_that_ends_between_the_metrics_and_the_slots_read_is_counted_once():
    # The scraper reads /metrics, then /slots. Two requests of 48 tokens; task 7 ends between the two
    # reads of the scrape at 0.75: gone from /slots, not yet in the counters (which show it at 1.00).
    # Clipping that interval's negative rest counted task 7's live tokens twice (127 for 96 on a real
    # server); the balance carries it to the scrape where the counters catch up.
    scrapes = [
        (0.00, counters(0, 0.0, [])),
        (0.25, counters(0, 0.0, [(0, 7, 5, 10), (1, 8, 4, 10)])),
        (0.50, counters(0, 0.0, [(0, 7, 36, 10), (1, 8, 30, 10)])),
        (0.75, counters(0, 0.0, [(1, 8, 47, 10)])),  # task 7 gone, its end not counted yet
        (1.00, counters(96, 0.70 + 0.72, [])),  # both ends counted
    ]
    prev, rows = None, []
    for ts, cur in scrapes:
        row, keep = advance("127.0.0.1:8080", prev, ts, cur)
        prev = (ts, keep)
        rows.append(row)
    assert sum(r[3] for r in rows if r) == 96
    assert sum(r[4] for r in rows if r) == pytest.approx(1420.0)
    assert rows[3][3] == 17  # task 8 live only: task 7's rest waits for the counters
    assert prev[1].slots_carry == (0.0, 0.0)


def test_a_stored_balance_that_is_not_a_bounded_pair_is_refused():
    c = replace(counters(5, 0.1, []), slots_carry=(3.0, 40.0))
    assert EngineCounters.from_list(orjson.loads(orjson.dumps(c.to_list()))) == c
    for bad in ([1.0], [float("nan"), 0.0], [1e30, 0.0], ["1", 0.0], [True, 0.0]):
        stored = c.to_list()
        stored[-1] = bad
        with pytest.raises((ValueError, TypeError)):
            EngineCounters.from_list(stored)
