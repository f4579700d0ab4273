"""contract.logformats.haproxy on the real samples of HAProxy's configuration manual."""

from __future__ import annotations

from datetime import datetime

import pytest

from contract.logformats import ParseError
from contract.logformats.haproxy import parse_line
from tests.conftest import FIXTURES

LINES = (FIXTURES / "haproxy" / "configuration-txt-http-log-samples.log").read_text().splitlines()


def test_fixture_has_the_twelve_manual_samples():
    assert len(LINES) == 12


def test_section_8_2_3_example():
    rec = parse_line(LINES[0])
    assert rec["node"] == "srv1"
    assert rec["status"] == 200
    assert rec["ttft_ms"] == 69.0  # Tr
    assert rec["total_ms"] == 109.0 - 10 - 0  # Ta - TR - Tw
    assert rec["prompt_tokens"] is None and rec["completion_tokens"] is None
    # Stamped with its end: accepted at 12:14:14.655, Ta 109 ms.
    assert datetime.fromisoformat(rec["ts"]) == datetime.fromisoformat("2009-02-06T12:14:14.764+00:00")
    assert rec["request_id"].startswith("haproxy-") and len(rec["request_id"]) == 24


def test_node_map_by_backend_server_then_server():
    assert parse_line(LINES[0], node_map={"static/srv1": "127.0.0.7:8000"})["node"] == "127.0.0.7:8000"
    assert parse_line(LINES[0], node_map={"srv1": "gpu-7"})["node"] == "gpu-7"


def test_client_typing_slowly_is_not_blamed_on_the_server():
    # "6559/0/7/147/6723": 6.5 s of telnet typing (TR); the server's part is Tc + Tr + transfer.
    rec = parse_line(LINES[4])
    assert rec["total_ms"] == 6723 - 6559 == 164
    assert rec["ttft_ms"] == 147


def test_inconsistent_hand_made_sample_falls_back_to_measured_timers():
    # 6559/1230/7/147/6870: the manual's (hand-made) line has Ta < TR + Tw; connect + response remain.
    rec = parse_line(LINES[5])
    assert rec["total_ms"] == 7 + 147


def test_proxy_blocked_502_is_kept_as_an_error_sample():
    rec = parse_line(LINES[7])
    assert (rec["status"], rec["ttft_ms"], rec["total_ms"]) == (502, 14.0, 21.0)


def test_connection_failure_503_is_kept_without_ttft():
    rec = parse_line(LINES[11])  # 3183/-1/-1/-1/11215 503 ... SC--
    assert rec["status"] == 503 and rec["ttft_ms"] is None
    assert rec["total_ms"] == 11215 - 3183


@pytest.mark.parametrize(
    ("index", "reason"),
    [(1, "logasap"), (2, "logasap"), (3, "logasap"), (6, "logasap"),
     (8, "no_upstream"), (9, "no_upstream"), (10, "tcp_log")],
)
def test_rejected_samples_carry_a_reason(index, reason):
    with pytest.raises(ParseError) as err:
        parse_line(LINES[index])
    assert err.value.reason == reason


@pytest.mark.parametrize(("line", "reason"), [("", "empty_line"), ("hello world", "bad_format"),
                                              ('GET / HTTP/1.1" 200', "bad_format")])
def test_garbage(line, reason):
    with pytest.raises(ParseError) as err:
        parse_line(line)
    assert err.value.reason == reason


def test_token_and_ttft_captures_in_last_header_block():
    line = ('<134>Dec  3 07:05:42 haproxy[13145]: 127.0.0.1:43746 [03/Dec/2026:07:05:42.078] llm_in llm/s0 '
            '0/0/1/2/30 200 435 - - ---- 1/1/0/0/0 0/0 {host.example} {12|16|7.5} "POST /v1/completions HTTP/1.1"')
    rec = parse_line(line)
    assert (rec["prompt_tokens"], rec["completion_tokens"], rec["ttft_ms"], rec["total_ms"]) == (12, 16, 7.5, 30.0)


def test_request_id_is_stable_and_distinct():
    assert parse_line(LINES[0])["request_id"] == parse_line("  " + LINES[0])["request_id"]
    assert parse_line(LINES[4])["request_id"] != parse_line(LINES[5])["request_id"]


def test_haproxy_notices_are_not_requests():
    for line in ("<129>Dec  3 07:05:42 haproxy[13145]: Server llm/s3 is going DOWN for maintenance.",
                 "<133>Dec  3 07:05:42 haproxy[13145]: Proxy llm_in started."):
        with pytest.raises(ParseError) as err:
            parse_line(line)
        assert err.value.reason == "not_a_request"
