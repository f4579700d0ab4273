"""Where a detection's delay goes (issue 34 item 1, :mod:`sim.evidence`): onset -> the node has work ->
the first sample that could show the slowdown -> cut -> quarantine. The oracle "lower bound" this
replaced was beaten by the detector in some runs; these parts are ordered by construction of time
itself, and the property test checks that every run of every shipped faulty scenario keeps them so:
no cut before the first sample that could show the fault, every run counted."""

from pathlib import Path

import pytest

from sim.evidence import decompose
from sim.scenario import load_scenario


def test_the_parts_of_a_delay_from_plain_times():
    # Idle at the onset (10 s): the next request starts at 10.4 s; a row at 10.25 s carries tokens of
    # a request that ended before the onset, so the first row that can show the fault is at 10.5 s.
    parts = decompose(10.0, busy=[(8.0, 9.9), (10.4, 13.0)], rows=[9.75, 10.25, 10.5, 10.75, 11.0, 11.25],
                      lines=[9.9, 13.0], cut=11.1, quarantine=12.0)
    assert parts == {"to_work_s": 0.4, "to_evidence_s": 0.5, "evidence": "row", "to_cut_s": 1.1,
                     "detector_s": 0.6, "detector_samples": 3, "to_quarantine_s": 2.0, "cut_to_quarantine_s": 0.9}
    # Reading completed requests only: the first answer logged after the onset.
    logs = decompose(10.0, busy=[(9.0, 10.3), (10.4, 13.0)], lines=[9.5, 10.3, 13.0], cut=13.2)
    assert (logs["to_work_s"], logs["to_evidence_s"], logs["evidence"]) == (0.0, 0.3, "line")
    assert (logs["detector_s"], logs["detector_samples"]) == (pytest.approx(2.9), 2)
    # Never cut, never busy.
    none = decompose(10.0)
    assert none["to_work_s"] is None and none["to_evidence_s"] is None and none["detector_s"] is None


SCENARIOS = sorted(p for p in (Path(__file__).resolve().parents[2] / "scenarios").glob("*.json")
                   if load_scenario(p).faulty)
#: Each policy and its seeds: the product on two, the access-log-only reading on one.
POLICIES = {"default": 2, "default_logs": 1}
AFTER_ONSET_S = 30.0
#: Faulty nodes no run cuts within AFTER_ONSET_S, and why (the ordering is still checked on them).
KNOWN_MISSES = {
    "periodic-stall-16": "a 0.4 s stall every 5 s is 8 % of the node's time, under the 1.15x cut line on the "
                         "mean; the per-token P99 would show it, and the detector reads the inter-token "
                         "histogram's sum and count, not its buckets",
}


@pytest.mark.slow  # three short runs per shipped faulty scenario, in two draws
@pytest.mark.timeout(900)  # a hang guard: seed-drill-short-32 serves 1,200 req/s (a minute of CPU idle)
@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_no_run_cuts_a_faulty_node_before_the_first_sample_that_could_show_its_fault(path):
    from sim.__main__ import PRODUCTION_CADENCE
    from sim.runner import run_scenario

    scn = load_scenario(path).with_cadence(*PRODUCTION_CADENCE)
    scn = scn.with_duration(min(scn.duration_s, max(f.start_s for f in scn.faults) + AFTER_ONSET_S))
    runs = cut = 0
    # Seed by seed, the policies of that seed in one report: they share its draw of requests, and no
    # fault-free baseline is run (nothing here reads it; each policy's block is the same without it).
    reports = [run_scenario(scn.with_seed(scn.seed + i), [p for p, n in POLICIES.items() if n > i], baseline=False)
               for i in range(max(POLICIES.values()))]
    for report in reports:
        for name, run in report["policies"].items():
            for f in run["faults"]:
                if (f["group"], f["node"]) not in scn.faulty:
                    continue
                runs += 1
                where = (name, f["node"], f)
                assert f["to_work_s"] is not None and f["to_evidence_s"] is not None, where
                assert 0 <= f["to_work_s"] <= f["to_evidence_s"], where
                if f["to_cut_s"] is None:
                    continue
                cut += 1
                assert f["detector_s"] >= 0 and f["detector_samples"] >= 1, where
                assert f["to_evidence_s"] + f["detector_s"] == pytest.approx(f["to_cut_s"], abs=2e-3), where
                if f["to_quarantine_s"] is not None:
                    assert f["to_quarantine_s"] >= f["to_cut_s"], where
    assert runs == sum(POLICIES.values()) * sum(1 for f in scn.faults if (f.group, f.node) in scn.faulty)
    if path.stem not in KNOWN_MISSES:
        assert cut  # every other shipped faulty scenario is cut by one of them in some run
