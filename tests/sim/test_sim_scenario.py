from pathlib import Path

import pytest
from sim_helpers import tiny

from sim.scenario import ScenarioError, load_scenario, parse_scenario

SCENARIOS = sorted((Path(__file__).resolve().parents[2] / "scenarios").glob("*.json"))


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_every_shipped_scenario_loads(path):
    scn = load_scenario(path)
    assert scn.duration_s > 0 and scn.groups
    for g, n in scn.faulty:
        assert 0 <= n < scn.group(g).nodes


def test_at_least_the_shared_scenarios_are_shipped():
    names = {p.stem for p in SCENARIOS}
    assert {"seed-drill-32", "small-group-8", "surge-16", "warmup-scaleout-12", "healthy-64-long",
            "hetero-two-pools"} <= names


@pytest.mark.parametrize(("mutate", "field"), [
    (lambda d: d["groups"][0].update(nodes=0), "groups[0].nodes"),
    (lambda d: d["groups"][0].pop("decode_ms_per_token"), "groups[0].decode_ms_per_token"),
    (lambda d: d["workload"][0].update(group="nope"), "workload[0].group"),
    (lambda d: d["workload"][0].update(rate_rps="fast"), "workload[0].rate_rps"),
    (lambda d: d["workload"][0].update(trace="bogus"), "workload[0].trace"),
    (lambda d: d["workload"][0].update(rate_profile=[[0, 1], [0, 2]]), "workload[0].rate_profile[1]"),
    (lambda d: d.update(faults=[{"group": "g", "node": 0, "kind": "meltdown"}]), "faults[0].kind"),
    (lambda d: d.update(faults=[{"group": "g", "node": 5, "kind": "crash"}]), "faults[0].node"),
    (lambda d: d.update(faults=[{"group": "g", "node": 0, "kind": "thermal_throttle"}]), "faults[0].slowdown"),
    (lambda d: d.update(faults=[{"group": "g", "node": 0, "kind": "ecc_replay", "stall_prob": 2,
                                 "stall_ms": 1}]), "faults[0].stall_prob"),
    (lambda d: d.update(faults=[{"group": "g", "node": "all", "kind": "crash"}]), "faults[0].node"),
    (lambda d: d.update(faults=[{"group": "g", "node": 0, "kind": "surge", "slowdown": 2, "slowdwn": 3}]),
     "faults[0].slowdwn"),
    (lambda d: d.update(faults=[{"group": "g", "node": 0, "kind": "surge", "slowdown": 2, "start_s": 10,
                                 "end_s": 5}]), "faults[0].end_s"),
    (lambda d: d.update(duration_s=-1), "duration_s"),
    (lambda d: d.update(gateway={"logs_ttft": "no"}), "gateway.logs_ttft"),
])
def test_bad_scenario_names_the_field(mutate, field):
    d = tiny()
    mutate(d)
    with pytest.raises(ScenarioError) as exc:
        parse_scenario(d)
    assert exc.value.field == field
    assert str(exc.value).startswith(field + ":")


def test_invalid_json_names_the_position(tmp_path):
    p = tmp_path / "s.json"
    p.write_text('{"name": "x",\n "seed": }')
    with pytest.raises(ScenarioError, match="line 2"):
        load_scenario(p)
