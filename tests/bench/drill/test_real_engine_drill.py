"""Issue 24's drill in small, as the target the detector fix must reach: real llama.cpp servers behind a
real nginx (round robin, the user's ``combined`` + timing log read by ``tail_logs --format auto``),
the real control plane (Celery worker+beat, ``scrape_metrics``, the agent), an open-loop Poisson load,
and one server put at 20 % of a core through a cgroup after a short healthy phase.

Asserted: the throttled server is cut and then quarantined within the run, no healthy server is ever
quarantined, and the fault took (the throttled server is slower than its peers: else the test would
pass or fail for nothing; when no request sent after the onset reached it, the cgroup's count of
throttled periods). Figures are printed (and the whole result written when
``OUTLIER_DRILL_FIGURES`` names a file).

Before issue 24's fix (live ``/slots`` rows, censored in-flight samples, confirmation probes) the
throttled server was cut after 89-105 s and never quarantined; it is now cut within seconds (the
figures of the full drill are in docs/drill-table.md). The product's default thresholds, all of them:
``warmup_samples`` (the slow start's 50 samples) applies to a node that joins a group already
running, and the drill's nodes are registered before the control plane's first tick, which starts
them in service (``outlier_admin.control.tick._sync_nodes``), as it does for a new deployment. Four
servers, not three: the safeguard (``max_quarantine_fraction`` 0.30) never quarantines one node of three.

Skips (with the reason) where the drill cannot run: no ``xllamacpp`` / model package (the ``drill``
extra), no nginx, no cgroup CPU controller we may write (not root, read-only mount).
"""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path

import pytest

from bench.drill.run import DrillConfig, row, run_drill, unavailable_reason

# 2 requests/s, 20 s healthy, 25 s throttled. The healthy phase must give the group the 60 healthy
# progress rows its decode curve is fitted on (detector.signals.BATCH_CURVE_MIN_ROWS; until then decode
# is not judged): at 1.2 requests/s that took about 28 s, and a 20 s phase measured the fit, not the
# detector (cut +19 s). The full drill's cut came 1.4-2.7 s after the throttled server was next given
# work and its quarantine 2-5 s after the cut (README, "Real engines").
CFG = DrillConfig(gateway="nginx-rr", weights=True, fault="quota:0.2", servers=4, rate=2.0, onset_s=20.0,
                  after_s=25.0, seed=3)
REASON = unavailable_reason(CFG)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.services, pytest.mark.slow, pytest.mark.serial,
              pytest.mark.timeout(300),
              pytest.mark.skipif(REASON is not None, reason=f"the real-engine drill cannot run here: {REASON}")]


def test_throttled_llama_server_is_cut_and_quarantined_and_no_healthy_one_is(redis_client):
    result = run_drill(CFG)
    f = result["figures"]
    print(json.dumps(row(result)))
    print("faulty:", f["faulty_transitions_after_onset"], "false:", f["false_cut_detail"])
    if os.environ.get("OUTLIER_DRILL_FIGURES"):
        Path(os.environ["OUTLIER_DRILL_FIGURES"]).write_text(json.dumps(result, indent=1, default=str))

    # The drill ran as meant: every request was sent and answered, the log was read, the fault took.
    after = f["latency_after_onset"]
    assert after["n"] >= 20 and after["dropped"] == 0 and after["errors"] == 0, after
    assert result["ingest"]["log_accepted"] >= 0.9 * len(result["requests"]), result["ingest"]
    faulty = result["faulty"]["address"]
    healthy = [a for a in result["servers"].values() if a != faulty]
    slow = [r["latency_s"] for r in result["requests"]
            if r["served_by"] == faulty and r["sent_at"] >= result["fault"]["onset"] and r["outcome"] == "ok"]
    peers = [r["latency_s"] for r in result["requests"]
             if r["served_by"] in healthy and r["sent_at"] >= result["fault"]["onset"] and r["outcome"] == "ok"]
    assert peers, result["figures"]
    # The kernel's own count says whether the fault took: the periods the server wanted more CPU than
    # its quota gave. (The weights may move the traffic off it before it answers any request sent
    # after the onset: CI once saw a cut at +0.8 s, from a request in flight at the onset.)
    throttling = result["fault"]["throttling"]
    assert throttling and throttling["throttled_periods"] > 0, result["fault"]
    if slow:
        # Slower than its peers, by how much depends on the host: on a machine where four servers
        # already queue at 2 requests/s (healthy requests 9-13 s, one CI run) a 5x server's one request
        # read 20 s, under the 2x this asserted on a quieter host.
        assert statistics.median(slow) > statistics.median(peers), (slow, peers)

    # The target.
    assert f["onset_to_first_cut_s"] is not None, f"the throttled server was never cut: {f}"
    assert f["onset_to_quarantine_s"] is not None, f"the throttled server was never quarantined: {f}"
    assert f["false_quarantines"] == 0, f["false_cut_detail"]
    # At the product's defaults every node was in service from the start: no slow start to leave.
    assert not [t for t in result["transitions"] if t["from"] == "warming"], result["transitions"][:10]
