"""The routers' matrix runner (bench.drill.matrix) without running a drill: cells, plans, resuming,
and where a run's full result is written."""

from __future__ import annotations

import argparse

import pytest

from bench.drill.matrix import done_runs, parse_cell, plan_cells, raw_name


def test_a_raw_file_is_one_file_whatever_the_fault_says(tmp_path):
    # stall:2/10 made the name a path into a missing folder: the first stall run's result was lost.
    name = raw_name(1796587528.0 + 2400, "nginx-rr:off:stall:2/10", 1)
    assert name == "20261206T204528-nginx-rr_off_stall_2-10-1.json" and "/" not in name
    (tmp_path / name).write_text("{}")
    assert [p.name for p in tmp_path.iterdir()] == [name]


def test_cells_parse_and_a_plan_runs_both_arms_then_each_floor():
    assert parse_cell("envoy:on:stall:2/10") == ("envoy", True, "stall:2/10")
    with pytest.raises(argparse.ArgumentTypeError):
        parse_cell("envoy:maybe:quota:0.2")
    assert plan_cells(["quota:0.5", "none"], ("nginx-rr", "haproxy")) == [
        ("nginx-rr", False, "quota:0.5"), ("nginx-rr", True, "quota:0.5"),
        ("haproxy", False, "quota:0.5"), ("haproxy", True, "quota:0.5"),
        ("nginx-rr", False, "none"), ("haproxy", False, "none")]


def test_a_failed_run_counts_as_tried_and_a_probed_alone_run_does_not():
    runs = [{"cell": "caddy:off:quota:0.5", "error": "tail_logs died"},
            {"cell": "caddy:off:quota:0.5", "figures": {}, "config": {"weights": False, "canaries": True}},
            {"cell": "caddy:on:quota:0.5", "figures": {}, "config": {"weights": True}}]
    assert done_runs({"runs": runs}, "caddy:off:quota:0.5") == 1
    assert done_runs({"runs": runs}, "caddy:on:quota:0.5") == 1


def test_until_takes_a_full_utc_time_or_an_hour_today_and_refuses_anything_else():
    from datetime import UTC, datetime

    from bench.drill.matrix import _until

    assert _until("2026-12-07T01:05") == datetime(2026, 12, 7, 1, 5, tzinfo=UTC)
    today = _until("01:05")
    assert (today.date(), today.hour, today.minute) == (datetime.now(UTC).date(), 1, 5)
    for bad in ("1:05", "25:00", "2026-12-07 01:05", "tomorrow"):
        with pytest.raises(argparse.ArgumentTypeError):
            _until(bad)
