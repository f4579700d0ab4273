"""False cuts of a finished (or running) demo: the detector's degrade and quarantine transitions of
nodes that had no fault injected at that moment, read from the demo's database.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/DEMO_DB DJANGO_DEBUG=1 \\
        .venv/bin/python scripts/demo_false_cuts.py --out reports/demo-false-cuts.json

The fault schedule is the demo's (``outlier_admin.demo.config.DemoConfig`` from the same ``DEMO_*``
environment the demo ran with): the thermal throttle on node 5 of the large group from
``DEMO_FAULT_AT_S``, the PCIe downgrade on node 2 of the small group from ``DEMO_PCIE_AT_S``, both
until ``DEMO_HEAL_AT_S``. The demo's start is its first audit event (it seeds the groups within a
second of starting its fleet). A cut is a transition into ``degraded``, ``pending_approval`` or
``quarantined``. Prints the figures and writes them as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from pathlib import Path

CUT_STATES = ("degraded", "pending_approval", "quarantined")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("reports/demo-false-cuts.json"))
    ap.add_argument("--minutes", type=float, default=None, help="count only the first N minutes (default: all)")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "outlier_admin.settings")
    import django

    django.setup()
    from outlier_admin.control.models import AuditEvent, Transition
    from outlier_admin.demo.config import DemoConfig
    from outlier_admin.demo.fleet import LARGE, PCIE_NODE, SMALL, THERMAL_NODE, node_name
    from outlier_admin.fleet.models import Node

    cfg = DemoConfig.from_env()
    t0 = AuditEvent.objects.order_by("at").values_list("at", flat=True).first()
    if t0 is None:
        print("no audit event: not a demo database", file=sys.stderr)
        return 2
    faults = {(LARGE, node_name(0, THERMAL_NODE)): (cfg.fault_at_s, cfg.heal_at_s),
              (SMALL, node_name(1, PCIE_NODE)): (cfg.pcie_at_s, cfg.heal_at_s)}
    fault_free = Node.objects.filter(group__name__in=(LARGE, SMALL)).values("pk").count() - len(faults)
    # Named columns only: the database may be a demo's of an older schema than this checkout's.
    cuts = (Transition.objects.filter(to_state__in=CUT_STATES).order_by("at")
            .values_list("at", "group__name", "node__name", "from_state", "to_state", "reason", "signal", "z"))
    false, true = [], 0
    for at, group, node, src, dst, reason, signal, z in cuts:
        rel = (at - t0).total_seconds()
        if args.minutes is not None and rel > args.minutes * 60:
            continue
        window = faults.get((group, node))
        if window and window[0] <= rel < window[1]:
            true += 1
            continue
        false.append({"t_s": round(rel, 1), "group": group, "node": node, "from": src, "to": dst,
                      "reason": reason, "signal": signal, "z": z})
    last = Transition.objects.order_by("-at").values_list("at", flat=True).first()
    nodes = Counter(f"{c['group']}/{c['node']}" for c in false)
    out = {
        "demo_started": t0.isoformat(), "last_transition_s": round((last - t0).total_seconds(), 1) if last else None,
        "window_minutes": args.minutes, "faults": {f"{g}/{n}": list(w) for (g, n), w in faults.items()},
        "false_cuts": len(false), "false_degrades": sum(c["to"] == "degraded" for c in false),
        "false_quarantines": sum(c["to"] != "degraded" for c in false),
        "fault_free_nodes_cut": len(nodes), "fault_free_nodes": fault_free,
        "by_signal": dict(Counter(c["signal"] or "-" for c in false)), "cuts_of_faulty_nodes": true,
        "by_node": dict(nodes.most_common()), "cuts": false,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    print(f"false cuts: {out['false_cuts']} ({out['false_degrades']} degrades, {out['false_quarantines']} "
          f"quarantines or proposals) of {out['fault_free_nodes_cut']} of {fault_free} fault-free nodes; "
          f"by signal {out['by_signal']}; cuts of faulty nodes in their fault: {true}; -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
