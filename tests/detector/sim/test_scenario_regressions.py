"""Regression: names given as lists/dicts are refused with the field, not a TypeError."""

import json
from pathlib import Path

import pytest

from detector.sim.scenario import ScenarioError, parse_scenario

DRILL = Path(__file__).resolve().parents[3] / "scenarios" / "seed-drill-32.json"


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        (("workload", 0, "group"), ["llama3-70b/h800"], "workload[0].group"),
        (("workload", 0, "trace"), {"a": 1}, "workload[0].trace"),
        (("faults", 0, "group"), ["x"], "faults[0].group"),
        (("faults", 0, "kind"), ["thermal_throttle"], "faults[0].kind"),
    ],
)
def test_unhashable_names_are_refused_with_the_field(path, value, field):
    data = json.loads(DRILL.read_text())
    target = data
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(ScenarioError) as err:
        parse_scenario(data)
    assert field in str(err.value)
