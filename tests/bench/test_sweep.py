"""bench.sweep resumes: the rows already measured on the same settings are kept, other settings refused."""

from __future__ import annotations

import json

import pytest

from bench.sweep import SETTINGS, earlier, main

META = {"scenarios": ["surge-16"], "healthy": "healthy-64-long", "healthy_node_hours": 0.0, "healthy_s_per_seed": 1.0,
        "seeds": 1, "cadence": "production", "quick": True}
ROWS = [{"constant": "(all at their values)", "factor": 1.0, "value": 1, "refused": "kept"},
        {"constant": "degrade_z", "factor": 0.5, "value": 1.0, "refused": "kept"},
        {"constant": "degrade_z", "factor": 2.0, "value": 4.0, "refused": "kept"}]


def test_earlier_keeps_the_rows_of_the_same_settings_and_refuses_others(tmp_path):
    path = tmp_path / "sweep.json"
    assert earlier(path, META) == ([], 0.0)
    path.write_text(json.dumps({"meta": {**META, "cpu_s": 12.5}, "rows": ROWS}))
    assert earlier(path, META) == (ROWS, 12.5)
    assert set(SETTINGS) <= set(META)
    with pytest.raises(ValueError, match="other healthy_node_hours, seeds"):
        earlier(path, {**META, "seeds": 2, "healthy_node_hours": 37.0})


def test_a_finished_sweep_started_again_runs_nothing_and_keeps_its_cpu_seconds(tmp_path, capsys):
    (tmp_path / "sweep.json").write_text(json.dumps({"meta": {**META, "cpu_s": 12.5}, "rows": ROWS}))
    argv = ["--out", str(tmp_path), "--seeds", "1", "--scenarios", "surge-16", "--healthy-node-hours", "0",
            "--constants", "degrade_z"]
    assert main(argv) == 0
    doc = json.loads((tmp_path / "sweep.json").read_text())
    assert doc["rows"] == ROWS and doc["meta"]["cpu_s"] == 12.5 and doc["meta"]["runs_planned"] == 3
    assert "resuming" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main([*argv[:2], "--seeds", "2", *argv[4:]])
