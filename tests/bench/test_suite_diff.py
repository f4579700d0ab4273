"""bench.suite_diff: two `sim suite` folders side by side, each delay with how many runs made it."""

from __future__ import annotations

import json
from pathlib import Path

from bench.suite_diff import main


def _suite(folder: Path, quarantines: list[float | None], false_cuts: float, dq: dict | None) -> Path:
    folder.mkdir()
    runs = [{"faults": [{"node": 4, "kind": "resource", "first_degrade_s": 1.2, "quarantine_s": q,
                         "detector_s": 0.9}]} for q in quarantines]
    report = {"policies": {"default": {"runs": runs, "false_degrades_per_1000h": false_cuts,
                                       "false_quarantines_per_1000h": 0.0}}}
    (folder / "prefill-fault-16.json").write_text(json.dumps(report))
    summary = {"prefill-fault-16": {}, "_detection_quality": {"policies": {"default": dq}} if dq else {}}
    (folder / "summary.json").write_text(json.dumps(summary))
    return folder


def test_a_median_over_the_runs_that_detected_says_how_many_did(tmp_path, capsys):
    before = _suite(tmp_path / "before", [1.8, None, None], 937.5, None)
    rate = {"events": 0, "node_hours": 1.0, "per_1000h": 0.0, "ci95": [0.0, 3688.9]}
    after = _suite(tmp_path / "after", [4.1, 2.0, 3.0], 0.0, {
        "true_positives": 3, "faults": 3, "false_positives": 1, "f1": 0.857,
        "precision": {"value": 0.75, "ci95": [0.3, 0.95]}, "recall": {"value": 1.0, "ci95": [0.44, 1.0]},
        "false_cut_nodes": rate, "false_cuts": rate, "false_quarantines": rate,
        "below_base_node_s_per_1000h": 0.0, "weight_s_taken_per_1000h": 0.0, "healthy_node_hours": 1.0})
    assert main([str(before), str(after), "--out", str(tmp_path / "diff.json")]) == 0
    out = capsys.readouterr().out
    # One run in three quarantined at 1.8 s: the table says so, instead of "1.8".
    assert "| prefill-fault-16 | n4 (resource) | 1.2 → 1.2 | 1.8 (1/3 runs) → 3.0 | 0.9 → 0.9 | 937.5 → 0.0 |" in out
    assert "| precision [95 %] | – | 0.75 [0.3–0.95] |" in out and "| faults detected | – | 3/3 |" in out
    figures = json.loads((tmp_path / "diff.json").read_text())
    assert figures["after"]["scenarios"]["prefill-fault-16"]["faults"]["n4 (resource)"]["quarantine"] == {
        "median": 3.0, "runs": 3}


def test_a_folder_that_is_no_suite_is_refused(tmp_path, capsys):
    assert main([str(tmp_path), str(tmp_path)]) == 2
    assert "no summary.json" in capsys.readouterr().err
