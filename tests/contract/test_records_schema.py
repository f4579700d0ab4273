"""The ingest API's schema of a record is generated from the records contract's table: its bounds
cannot drift from what ingest and the detector enforce (they drifted while written by hand:
``total_ms`` said ``exclusiveMinimum 0`` against the 1 µs floor, ``ttft_ms`` ``minimum 0``)."""

from __future__ import annotations

from contract.records import FIELDS, MIN_LATENCY_MS, Limits, bound_in_words, json_schema
from outlier_admin.api.schema import _RECORD_NUMBERS, _record_numbers


def test_every_numeric_field_of_the_table_is_in_the_schema_with_its_bounds():
    limits = Limits()
    schema = json_schema(limits)
    assert set(schema) == set(FIELDS) == set(_RECORD_NUMBERS)
    assert schema["total_ms"] == {"type": "number", "minimum": MIN_LATENCY_MS, "maximum": limits.max_latency_ms}
    # 0 or at least the floor; bounded by total_ms, itself by max_latency_ms
    assert schema["ttft_ms"] == {"type": "number", "oneOf": [
        {"enum": [0]}, {"minimum": MIN_LATENCY_MS, "maximum": limits.max_latency_ms}]}
    assert schema["queue_ms"] == schema["ttft_ms"]
    assert schema["cached_tokens"] == {"type": "integer", "minimum": 0, "maximum": limits.max_prompt_tokens}
    assert schema["status"] == {"type": "integer", "oneOf": [{"enum": [0]}, {"minimum": 100, "maximum": 599}]}
    assert bound_in_words("ttft_ms") == "at most `total_ms`" and bound_in_words("total_ms") == ""


def test_the_api_schema_takes_the_tables_bounds_and_the_operators_limits():
    bounds = {**Limits().as_kwargs(), "max_latency_ms": 60_000}
    props = _record_numbers(bounds)
    assert props["total_ms"]["maximum"] == 60_000 and props["total_ms"]["minimum"] == MIN_LATENCY_MS
    assert props["ttft_ms"]["nullable"] is True and "at most `total_ms`" in props["ttft_ms"]["description"]
    assert "nullable" not in props["total_ms"] and props["status"]["default"] == 200
