from __future__ import annotations

import json
import logging

import pytest

from outlier_admin.observability.logconfig import JsonFormatter, logging_config


def test_a_record_with_an_event_becomes_one_json_line():
    rec = logging.LogRecord("outlier_admin.events", logging.INFO, __file__, 1, "transition %s", ("n1",), None)
    rec.event = {"kind": "transition", "z": 4.2, "at": object()}
    line = JsonFormatter().format(rec)
    assert "\n" not in line
    doc = json.loads(line)
    assert doc["message"] == "transition n1"
    assert doc["level"] == "INFO" and doc["logger"] == "outlier_admin.events"
    assert doc["event"]["z"] == 4.2 and doc["event"]["kind"] == "transition"
    assert doc["ts"].endswith("Z")


def test_config_switches_formatter_and_rejects_a_bad_level():
    assert logging_config(json_logs=True)["handlers"]["stderr"]["formatter"] == "json"
    assert logging_config(json_logs=False, level="debug")["loggers"]["outlier_admin"]["level"] == "DEBUG"
    with pytest.raises(ValueError, match="LOG_LEVEL"):
        logging_config(level="LOUD")
