"""The drill's figures, from what the client saw, what PostgreSQL recorded and what was published.

Definitions (the ones the user's report used, so a fix is judged against them):

- **cut**: a node entering a state that takes traffic off it: ``degraded`` (weight below base) or a
  state whose traffic rule (:data:`detector.states.TRAFFIC`) is ``floor`` or ``drain``. **Quarantine**:
  entering a ``drain`` state (:data:`detector.states.OUT_OF_SERVICE_LABELS`). Both are read from the
  group's :class:`~outlier_admin.control.models.Transition` rows (the control plane's record);
  ``first_cut_published_s`` is the same event in the published document (:class:`WeightsWatcher`),
  what a gateway could act on.
- **onset -> first cut / quarantine** of the faulty node: seconds from the fault's onset to its first
  such transition after the onset (``None``: never within the run).
- **false cuts / false quarantines**: such transitions of any other node, over the whole run (a cut
  before the onset is as false as one after).
- **latency after the onset**: requests *sent* in ``[onset, end)``; a timeout counts at the client's
  timeout (it is what the user waited), a dropped or failed request is counted apart. P50/P99 by
  linear interpolation (numpy's default).
- **busy from**: seconds from the onset until the faulty node had work, ``0`` when a request was in
  flight on it at the onset, else when the first request it was given after the onset was sent. No
  detector sees a node that serves nothing: an idle node's slowness shows only once it is given a
  request, so ``busy_to_first_cut_s`` (the cut less that wait) is the detector's own part of the delay,
  and the wait is the arrival process's (at 1.2 requests/s over 5 servers, a node's next request comes
  4.2 s apart on average).
- **share**: the faulty node's fraction of the answered requests sent before the onset, after it, and
  after the first cut, where the gateway names the server in a header (``share_*``: not every router
  does). **Token share** (``faulty_token_share_after``): the faulty server's fraction of the tokens
  the whole fleet generated from the onset to the end, from every server's own llama.cpp counters
  (``llamacpp:tokens_predicted_total``, read at the onset, every 5 s and at the end: the figure
  every router's cell is compared on). The counter moves when a request ends, so a request sent
  before the onset and finished after it counts after it. It counts the control plane's canary
  probes too (a quarantined node is probed to see whether it healed): ``faulty_client_token_share_after``
  takes the probes' recorded tokens out of every server's count, the clients' share alone. ``faulty_last_tokens_s``: seconds from
  the onset to the last 5 s sample in which the faulty server's counter still moved.
- **harmed**: requests sent after the onset that took longer than :data:`HARM_FACTOR` times the same
  run's median before the onset, or timed out, or failed (a user notices each), as a fraction of
  the requests sent after the onset. Relative to the run's own healthy median, so a host that is
  slower in one run than another does not move it.
- **healthy servers cut / quarantined**: how many distinct healthy servers were ever cut /
  quarantined (the transitions give how many times).
- P50 / P90 / P95 / P99 by linear interpolation: with fewer than ~300 requests P99 is the second or
  third largest latency, so P95 stands beside it.
"""

from __future__ import annotations

import os
from collections import Counter
from itertools import pairwise
from typing import Any

import numpy as np

from detector.states import OUT_OF_SERVICE_LABELS, Traffic, traffic_of


def is_cut(state: str) -> bool:
    """A state that takes traffic off a node (module docstring)."""
    return state == "degraded" or traffic_of(state) in (Traffic.FLOOR, Traffic.DRAIN)


def is_quarantine(state: str) -> bool:
    return state in OUT_OF_SERVICE_LABELS


#: A request slower than this many times its run's healthy median is one a user notices.
HARM_FACTOR = 3.0


def _pct(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)), 3) if values else None


def latency_summary(reqs: list[dict[str, Any]]) -> dict[str, Any]:
    """P50/P99/max (s) over answered and timed-out requests, and the counts by outcome."""
    outcomes = Counter(r["outcome"] for r in reqs)
    lat = [r["latency_s"] for r in reqs if r["outcome"] in ("ok", "timeout", "http_error") and r["latency_s"] is not None]
    return {"n": len(reqs), "p50_s": _pct(lat, 50), "p90_s": _pct(lat, 90), "p95_s": _pct(lat, 95),
            "p99_s": _pct(lat, 99), "max_s": round(max(lat), 3) if lat else None,
            "timeouts": outcomes.get("timeout", 0), "errors": outcomes.get("error", 0) + outcomes.get("http_error", 0),
            "dropped": outcomes.get("dropped", 0)}


def share(reqs: list[dict[str, Any]], address: str) -> float | None:
    served = [r for r in reqs if r["served_by"]]
    return round(sum(r["served_by"] == address for r in served) / len(served), 3) if served else None


def per_node(reqs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Requests and median latency per engine address (answered requests only)."""
    out: dict[str, dict[str, Any]] = {}
    for addr in sorted({r["served_by"] for r in reqs if r["served_by"]}):
        lat = [r["latency_s"] for r in reqs if r["served_by"] == addr and r["latency_s"] is not None]
        out[addr] = {"n": len(lat), "p50_s": _pct(lat, 50)}
    return out


def harmed(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> dict[str, Any]:
    """Harmed requests after the onset (module docstring): count, fraction and the line they crossed."""
    ok = [r["latency_s"] for r in before if r["outcome"] == "ok" and r["latency_s"] is not None]
    if not ok or not after:
        return {"harmed": None, "harmed_fraction": None, "harm_line_s": None}
    line = HARM_FACTOR * float(np.median(ok))
    n = sum(1 for r in after if r["outcome"] in ("timeout", "error", "http_error", "dropped")
            or (r["latency_s"] is not None and r["latency_s"] > line))
    return {"harmed": n, "harmed_fraction": round(n / len(after), 4), "harm_line_s": round(line, 3)}


def token_share(samples: list[dict[str, Any]], faulty: str, t0: float, t1: float | None = None) -> float | None:
    """The faulty server's fraction of the generated tokens between the first sample at or after
    ``t0`` and the last at or before ``t1`` (every server's own counters; module docstring)."""
    rows = [s for s in samples if s["at"] >= t0 and (t1 is None or s["at"] <= t1)]
    if len(rows) < 2:
        return None
    first, last = rows[0], rows[-1]
    names = [k for k in first if k not in ("at", "label")]
    delta = {}
    for name in names:
        a, b = first.get(name), last.get(name)
        if not a or not b:
            return None  # a server that did not answer: no share rather than a wrong one
        delta[name] = b["gen"] - a["gen"]
    total = sum(delta.values())
    return round(delta.get(faulty, 0.0) / total, 4) if total > 0 else None


def fleet_busy(samples: list[dict[str, Any]], t0: float, t1: float, cores: int) -> float | None:
    """The fleet's CPU seconds per wall second over ``[t0, t1]`` as a fraction of the host's ``cores``
    (every server's own ``/proc`` counters): how close to saturation the load kept the fleet."""
    rows = [s for s in samples if t0 <= s["at"] <= t1]
    if len(rows) < 2 or rows[-1]["at"] - rows[0]["at"] < 1:
        return None
    first, last = rows[0], rows[-1]
    used = 0.0
    for name in (k for k in first if k not in ("at", "label")):
        a, b = first.get(name), last.get(name)
        if not a or not b or a.get("cpu") is None or b.get("cpu") is None:
            return None
        used += b["cpu"] - a["cpu"]
    return round(used / (last["at"] - first["at"]) / cores, 3)


def client_token_share(samples: list[dict[str, Any]], faulty: str, t0: float, probes: list[dict[str, Any]],
                       names: dict[str, str]) -> float | None:
    """:func:`token_share` less the control plane's own canary probes (``probes``: their recorded
    completion tokens, by engine address; ``names``: engine name -> address): the share of the
    *clients'* tokens the faulty server generated from ``t0`` on."""
    rows = [s for s in samples if s["at"] >= t0]
    if len(rows) < 2:
        return None
    first, last = rows[0], rows[-1]
    probed: dict[str, float] = {}
    for pr in probes:
        if first["at"] <= pr["at"] <= last["at"]:
            probed[pr["address"]] = probed.get(pr["address"], 0.0) + (pr["completion_tokens"] or 0)
    delta = {}
    for name, address in names.items():
        a, b = first.get(name), last.get(name)
        if not a or not b:
            return None
        delta[name] = max(0.0, b["gen"] - a["gen"] - probed.get(address, 0.0))
    total = sum(delta.values())
    return round(delta.get(faulty, 0.0) / total, 4) if total > 0 else None


def last_tokens_s(samples: list[dict[str, Any]], faulty: str, onset: float) -> float | None:
    """Seconds from ``onset`` to the last sample in which ``faulty``'s counter moved (``None``: never after the onset)."""
    rows = [s for s in samples if s["at"] >= onset and s.get(faulty)]
    moved = [b["at"] for a, b in pairwise(rows) if b[faulty]["gen"] > a[faulty]["gen"]]
    return round(moved[-1] - onset, 1) if moved else None


def faulty_tokens_split(requests: list[dict[str, Any]], faulty: str, onset: float, cut: float | None,
                        samples: list[dict[str, Any]], faulty_name: str | None) -> dict[str, Any] | None:
    """Where the faulty server's tokens after the onset came from, where the gateway names the server
    (``served_by``): client requests that ended after the onset, split by whether they were *sent*
    before the cut (work it had accepted: nothing a weight can take back) or after it; the rest of
    its counter's increase is the control plane's own canary probes. ``None`` without a header."""
    if not any(r["served_by"] for r in requests) or not faulty_name:
        return None
    rows = [s for s in samples if s["at"] >= onset and s.get(faulty_name)]
    if len(rows) < 2:
        return None
    counted = rows[-1][faulty_name]["gen"] - rows[0][faulty_name]["gen"]
    mine = [r for r in requests if r["served_by"] == faulty and r["completion_tokens"]
            and r["sent_at"] + (r["latency_s"] or 0) >= onset]
    before_cut = sum(r["completion_tokens"] for r in mine if cut is None or r["sent_at"] < cut)
    after_cut = sum(r["completion_tokens"] for r in mine if cut is not None and r["sent_at"] >= cut)
    return {"counter": counted, "sent_before_cut": before_cut, "sent_after_cut": after_cut,
            "probes_and_other": max(0.0, counted - before_cut - after_cut)}


def max_weight_after_cut(weights_changes: list[dict[str, Any]], faulty: str, cut_at: float | None,
                         quarantine_at: float | None) -> float | None:
    """The largest weight, as a fraction of its weight before the fault, that the published documents
    gave the faulty server after its first cut and before its quarantine (or the end): over 0.5 is a
    node that flapped back over half its traffic (issue 33's ``quota:0.5`` target). ``None`` uncut."""
    if cut_at is None:
        return None
    base = next((c["nodes"][faulty][0] for c in weights_changes if faulty in c["nodes"]), None)
    seen = [c["nodes"][faulty][0] for c in weights_changes
            if faulty in c["nodes"] and c["seen_at"] >= cut_at and (quarantine_at is None or c["seen_at"] < quarantine_at)]
    if not base or not seen:
        return None
    return round(max(seen) / base, 3)


def faulty_busy_from(requests: list[dict[str, Any]], faulty: str, onset: float) -> float | None:
    """Seconds from ``onset`` until ``faulty`` had work (module docstring); ``None``: never."""
    mine = [r for r in requests if r["served_by"] == faulty and r["latency_s"] is not None]
    if any(r["sent_at"] < onset < r["sent_at"] + r["latency_s"] for r in mine):
        return 0.0
    later = [r["sent_at"] for r in mine if r["sent_at"] >= onset]
    return min(later) - onset if later else None


def summarise(*, requests: list[dict[str, Any]], transitions: list[dict[str, Any]],
              weights_changes: list[dict[str, Any]], onset: float, end: float, faulty: str,
              addresses: list[str], token_samples: list[dict[str, Any]] | None = None,
              faulty_name: str | None = None, probes: list[dict[str, Any]] | None = None,
              names: dict[str, str] | None = None) -> dict[str, Any]:
    """The figures of one run (module docstring). ``faulty`` and ``addresses`` are engine addresses;
    ``token_samples`` (:class:`bench.drill.engines.TokenMeter`) are keyed by engine name (``faulty_name``)."""
    before = [r for r in requests if r["sent_at"] < onset]
    after = [r for r in requests if onset <= r["sent_at"] < end]
    faulty_tr = [t for t in transitions if t["address"] == faulty and t["at"] >= onset]
    first_cut = next((t for t in faulty_tr if is_cut(t["to"])), None)
    first_q = next((t for t in faulty_tr if is_quarantine(t["to"])), None)
    published = next((c for c in weights_changes if c["seen_at"] >= onset
                      and is_cut(str((c["nodes"].get(faulty) or [None, ""])[1]))), None)
    others = [t for t in transitions if t["address"] != faulty]
    false_cuts = [t for t in others if is_cut(t["to"])]
    false_q = [t for t in others if is_quarantine(t["to"])]
    after_cut = [r for r in after if first_cut and r["sent_at"] >= first_cut["at"]]
    states_at_onset = {}
    for c in weights_changes:
        if c["seen_at"] > onset:
            break
        states_at_onset = {addr: ws[1] for addr, ws in c["nodes"].items()}

    def rel(t: dict[str, Any] | None, key: str = "at") -> float | None:
        return round(t[key] - onset, 1) if t else None

    busy_from = faulty_busy_from(requests, faulty, onset)
    samples = token_samples or []

    return {
        "onset_to_first_cut_s": rel(first_cut),
        "first_cut_state": first_cut["to"] if first_cut else None,
        "first_cut_published_s": rel(published, "seen_at"),
        "onset_to_quarantine_s": rel(first_q),
        "faulty_busy_from_s": None if busy_from is None else round(busy_from, 1),
        "busy_to_first_cut_s": (round(first_cut["at"] - onset - busy_from, 1)
                                if first_cut is not None and busy_from is not None else None),
        "faulty_transitions_after_onset": [f"+{t['at'] - onset:.1f}s {t['from']}->{t['to']} ({t['reason']})"
                                           for t in faulty_tr][:40],
        "false_cuts": len(false_cuts),
        "false_quarantines": len(false_q),
        "healthy_cut_nodes": len({t["address"] for t in false_cuts}),
        "healthy_quarantined_nodes": len({t["address"] for t in false_q}),
        "false_cut_detail": [f"{t['address']} {t['at'] - onset:+.1f}s {t['from']}->{t['to']} ({t['reason']})"
                             for t in false_cuts][:40],
        "latency_before_onset": latency_summary(before),
        "latency_after_onset": latency_summary(after),
        **harmed(before, after),
        "faulty_token_share_before": token_share(samples, faulty_name, 0.0, onset) if faulty_name else None,
        "faulty_token_share_after": token_share(samples, faulty_name, onset) if faulty_name else None,
        "faulty_client_token_share_after": (client_token_share(samples, faulty_name, onset, probes or [], names)
                                            if faulty_name and names else None),
        "probe_tokens_faulty_after": (sum(p["completion_tokens"] or 0 for p in probes or []
                                          if p["address"] == faulty and p["at"] >= onset)),
        "faulty_token_share_after_cut": (token_share(samples, faulty_name, first_cut["at"])
                                         if faulty_name and first_cut else None),
        "faulty_last_tokens_s": last_tokens_s(samples, faulty_name, onset) if faulty_name else None,
        "faulty_tokens_after_onset": faulty_tokens_split(requests, faulty, onset, first_cut["at"] if first_cut else None,
                                                         samples, faulty_name),
        "fleet_busy_before": fleet_busy(samples, 0.0, onset, os.cpu_count() or 1),
        "fleet_busy_after": fleet_busy(samples, onset, end + 120, os.cpu_count() or 1),
        "faulty_share_before": share(before, faulty),
        "faulty_share_after": share(after, faulty),
        "faulty_share_after_cut": share(after_cut, faulty) if first_cut else None,
        "fair_share": round(1 / len(addresses), 3) if addresses else None,
        "per_node_before": per_node(before),
        "per_node_after": per_node(after),
        "states_at_onset": states_at_onset,
        "weights_changes_seen": len(weights_changes),
        "faulty_max_weight_after_cut": max_weight_after_cut(weights_changes, faulty, first_cut["at"] if first_cut else None,
                                                            first_q["at"] if first_q else None),
    }
