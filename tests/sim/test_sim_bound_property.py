"""The oracle bound is a lower bound (issue 25 item 1): on every shipped scenario with a faulty node,
at one seed, no policy's first cut comes sooner than the bound's stated lower end, i.e.
``delay / bound >= 1 - bound_error`` (``sim.report.oracle_bound``: the bound at the upper 95 %
confidence bound of the policy's false-cut rate, one sample earlier, and the 5th percentile over
resampled post-onset streams)."""

from pathlib import Path

import pytest

from sim.runner import run_scenario
from sim.scenario import load_scenario

pytestmark = pytest.mark.slow  # one short run of three detecting policies per scenario

SCENARIOS = sorted(p for p in (Path(__file__).resolve().parents[2] / "scenarios").glob("*.json")
                   if load_scenario(p).faulty)
POLICIES = ("seed_zscore", "default_logs", "default")
AFTER_ONSET_S = 30.0


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_no_policy_cuts_a_faulty_node_sooner_than_its_oracle_bound(path):
    scn = load_scenario(path)
    scn = scn.with_duration(min(scn.duration_s, max(f.start_s for f in scn.faults) + AFTER_ONSET_S))
    report = run_scenario(scn, POLICIES)
    checked = 0
    for name in POLICIES:
        for f in report["policies"][name]["faults"]:
            if (f["group"], f["node"]) not in scn.faulty:
                continue
            assert f.get("bound_s") is not None or f.get("bound_note"), (name, f)
            delay, bound = f["first_degrade_s"], f.get("bound_s")
            if delay is None or bound is None:
                continue
            checked += 1
            assert not f["bound_violated"], (name, f["node"], delay, bound, f["bound_basis"])
            # delay / bound >= 1 - bound_error, on the unrounded figures: delay >= the lower end
            assert delay >= f["bound_low_s"] - 1e-3, (name, f["node"], delay, bound, f["bound_low_s"])
    assert checked  # every shipped faulty scenario is detected by at least one of them
