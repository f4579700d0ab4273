"""bench.figures: the issue-34 section of docs/detector-sweep.md is rendered from the collected JSON, and
rendering again replaces it (nothing typed, nothing duplicated)."""

from __future__ import annotations

import json
from pathlib import Path

from bench.figures import BEGIN, DRILL_BEGIN, END, main


def _suite(folder: Path, scenario: str, faults: list[dict], duration: float) -> Path:
    folder.mkdir()
    runs = [{"faults": faults, "incidents": {"faulty": len(faults), "detected": len(faults), "false_nodes": 0,
                                             "healthy_nodes": 30}, "healthy_node_hours": 2.0}]
    (folder / f"{scenario}.json").write_text(json.dumps({"scenario": scenario, "duration_s": duration,
                                                          "policies": {"default": {"runs": runs}}}))
    return folder


def test_collect_and_render_write_the_section_once(tmp_path):
    parts = {"group": "llama3-70b/h800", "onset_s": 60.0, "to_work_s": 0.0, "evidence": "row",
             "detector_samples": 3, "cut_to_quarantine_s": None}
    faults = [{**parts, "node": 3, "kind": "pcie_downgrade", "first_degrade_s": 1.2, "quarantine_s": None,
               "to_evidence_s": 0.1, "detector_s": 1.1},
              {**parts, "node": 17, "kind": "thermal_throttle", "onset_s": 90.0, "first_degrade_s": 0.7,
               "quarantine_s": 1.4, "to_evidence_s": 0.2, "detector_s": 0.5, "cut_to_quarantine_s": 0.7}]
    tuned = _suite(tmp_path / "tuned", "seed-drill-32", faults, 240.0)
    unseen = _suite(tmp_path / "unseen", "unseen-00", [{**faults[0], "node": 0, "kind": "thermal_throttle"}], 223.6)
    figures = tmp_path / "figures.json"
    assert main(["collect", "--tuned", str(tuned), "--unseen", str(unseen), "--out", str(figures)]) == 0
    got = json.loads(figures.read_text())["tuned"]["scenarios"]["seed-drill-32"]["faults"]
    assert got["n17 (thermal_throttle)"]["detected"] == 1 and got["n3 (pcie_downgrade)"]["quarantine_runs"] == 0
    sweep_doc, detector_doc = tmp_path / "sweep.md", tmp_path / "detector.md"
    sweep_doc.write_text("# Sweep\n\nkept\n")
    detector_doc.write_text(f"before\n\n{DRILL_BEGIN}\n<!-- end of the generated seed drill -->\n\nafter\n")
    for _ in range(2):
        assert main(["render", str(figures), "--doc", str(sweep_doc), "--detector-doc", str(detector_doc)]) == 0
    page = sweep_doc.read_text()
    assert page.count(BEGIN) == 1 and page.count(END) == 1 and page.startswith("# Sweep\n\nkept\n")
    assert "| seed-drill-32 | n17 (thermal_throttle) | 1/1 | 0.7 | 1.4 (1/1) | 0 | 0.2 (row) | 0.5 / 3 | 0.7 |" in page
    # Wilson 95 %: 2 of 2 -> [0.342, 1]; 1 of 1 -> [0.207, 1]; no false cut in 2 node-hours -> [0, 1844.44]
    assert "| precision [95 % Wilson] | 1 [0.3424–1] | 1 [0.2065–1] |" in page
    assert "| false-cut nodes / 1,000 healthy node-h [95 % Garwood] | 0 [0–1844.44] | 0 [0–1844.44] |" in page
    text = detector_doc.read_text()
    assert text.count(DRILL_BEGIN) == 1 and "the PCIe-downgraded node is cut 1.2 s after its onset" in text
    assert text.endswith("after\n")


def test_a_partial_sweep_is_collected_alone_and_says_what_it_lacks(tmp_path):
    """``collect --sweep`` into an existing figures file keeps its suites; a sweep stopped early states
    how many of its planned runs are in and names the constants (or factors) it has not measured."""
    parts = {"group": "g", "onset_s": 60.0, "to_work_s": 0.0, "evidence": "row", "detector_samples": 3,
             "cut_to_quarantine_s": None, "quarantine_s": None, "to_evidence_s": 0.1, "detector_s": 1.1}
    faults = [{**parts, "node": 3, "kind": "pcie_downgrade", "first_degrade_s": 1.2}]
    tuned = _suite(tmp_path / "tuned", "surge-16", faults, 240.0)
    unseen = _suite(tmp_path / "unseen", "unseen-00", faults, 223.6)
    figures = tmp_path / "figures.json"
    assert main(["collect", "--tuned", str(tuned), "--unseen", str(unseen), "--out", str(figures)]) == 0
    row = {"detected": "1/1", "median_cut_s": 1.2, "median_quarantine_s": None, "quarantined": "0/1",
           "median_detector_s": 1.1, "false_cut_nodes": {"per_1000h": 0.0, "ci95": [0.0, 99.7], "events": 0},
           "below_base_node_s_per_1000h": 0.0, "false_quarantines": 0, "scenarios": {}}
    sweep = tmp_path / "sweep.json"
    sweep.write_text(json.dumps({
        "meta": {"scenarios": ["surge-16"], "healthy": "healthy-64-long", "healthy_node_hours": 37.0, "seeds": 2,
                 "constants": ["degrade_z", "ema_alpha", "ROWS_FRESH_S"], "runs_planned": 7, "cpu_s": 100.0},
        "rows": [{"constant": "(all at their values)", "factor": 1.0, "value": 1, **row},
                 {"constant": "degrade_z", "factor": 0.5, "value": 1.0, **row},
                 {"constant": "degrade_z", "factor": 2.0, "value": 4.0, "refused": "over quarantine_z"},
                 {"constant": "ema_alpha", "factor": 0.5, "value": 0.1, **row}]}))
    assert main(["collect", "--sweep", str(sweep), "--out", str(figures)]) == 0
    doc = json.loads(figures.read_text())
    assert "surge-16" in doc["tuned"]["scenarios"] and len(doc["sweep"]["rows"]) == 4
    assert "scenarios" not in doc["sweep"]["rows"][0]
    page = tmp_path / "sweep.md"
    page.write_text("# Sweep\n")
    assert main(["render", str(figures), "--doc", str(page), "--detector-doc", str(tmp_path / "none.md")]) == 0
    text = page.read_text()
    assert "**Not finished: 4 of the 7 planned runs are in" in text
    assert "Not yet measured: `ema_alpha` (2x), `ROWS_FRESH_S`." in text
    assert "| degrade_z | 2 | 4 | refused by the product: over quarantine_z |" in text


def test_collect_without_a_suite_and_no_earlier_file_is_refused(tmp_path, capsys):
    assert main(["collect", "--sweep", str(tmp_path / "sweep.json"), "--out", str(tmp_path / "f.json")]) == 2
    assert "no tuned and no unseen suite" in capsys.readouterr().err
