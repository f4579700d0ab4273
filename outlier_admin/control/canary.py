"""Canary probes: one synthetic completion request to a quarantined/probing node.

``POST <address>/v1/completions`` with a fixed prompt and ``max_tokens`` (``CANARY_MAX_TOKENS``),
timeout ``CANARY_TIMEOUT_S``. The probe is stored as :class:`CanaryProbe`; the next tick feeds it to
the state machine (``GroupDetector.record_probe``), which judges its normalised latency against the
peer baseline. Connection errors, timeouts and non-2xx answers are failed probes, stored with the
status and a reason code (:class:`ProbeError`).

Which probes are due is decided by the tick (``Evaluation.probes_due``, written to
``outlier:probes:<group>``); an ``NX`` guard per node keeps one probe in flight per node.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import httpx
from django.conf import settings

from outlier_admin.control.models import CanaryProbe
from outlier_admin.control.redis_conn import get_redis, mark_inputs_pending, probes_key
from outlier_admin.fleet.models import ModelGroup, Node
from outlier_admin.fleet.names import NameError_

log = logging.getLogger(__name__)

PROMPT = "Count from one to twenty, separated by commas:"
# Used only when the server does not report usage: the prompt above is ~10 tokens.
PROMPT_TOKENS_GUESS = 10


class ProbeError:
    """Reason codes a failed probe stores in ``CanaryProbe.error`` (with ``status``). Never the
    response body or an exception's text: the reply of whatever a node's address points at is not
    ours to show to every viewer of the API."""

    BAD_ADDRESS = "bad_address"  # the registered address does not validate: nothing was sent
    HTTP_STATUS = "http_status"  # a non-2xx answer; its code is in ``status``
    TIMEOUT = "timeout"
    CONNECT = "connect_error"
    PROTOCOL = "protocol_error"
    BAD_RESPONSE = "bad_response"  # 2xx, but not an OpenAI completion


def probe_node(node: Node, *, client: httpx.Client | None = None) -> CanaryProbe:
    """Send one probe to ``node`` and store the result (not yet judged: ``passed`` is NULL).

    The URL is ``<scheme>://<host>:<port>/v1/completions`` rebuilt from the node's validated
    address (:func:`outlier_admin.fleet.names.parse_address`); redirects are not followed."""
    probe = CanaryProbe(node=node, ok=False)
    try:
        url = node.base_url + "/v1/completions"
    except NameError_ as exc:
        log.warning("canary: node %s has an invalid address, not probed: %s", node, exc.detail)
        probe.error = ProbeError.BAD_ADDRESS
        probe.save()
        mark_inputs_pending(node.group.name)
        return probe
    body: dict[str, Any] = {"prompt": PROMPT, "max_tokens": settings.CANARY_MAX_TOKENS, "temperature": 0}
    if settings.CANARY_MODEL:
        body["model"] = settings.CANARY_MODEL
    own = client is None
    client = client or httpx.Client(timeout=settings.CANARY_TIMEOUT_S, follow_redirects=False)
    started = time.perf_counter()
    try:
        resp = client.post(url, json=body)
        probe.total_ms = (time.perf_counter() - started) * 1000.0
        probe.status = resp.status_code
        if 200 <= resp.status_code < 300:
            data = resp.json()
            usage = data.get("usage") or {}
            probe.prompt_tokens = _tokens(usage.get("prompt_tokens"), PROMPT_TOKENS_GUESS)
            probe.completion_tokens = _tokens(usage.get("completion_tokens"), settings.CANARY_MAX_TOKENS)
            probe.ok = True
        else:
            probe.error = ProbeError.HTTP_STATUS
    except httpx.TimeoutException:
        probe.error = ProbeError.TIMEOUT
    except httpx.ConnectError:
        probe.error = ProbeError.CONNECT
    except httpx.HTTPError:
        probe.error = ProbeError.PROTOCOL
    except (ValueError, TypeError, AttributeError):
        probe.error = ProbeError.BAD_RESPONSE
    finally:
        if probe.total_ms is None:
            probe.total_ms = (time.perf_counter() - started) * 1000.0
        if own:
            client.close()
    # ``normalised_latency`` is filled in by the tick that judges the probe, on the detector's scale.
    probe.save()
    mark_inputs_pending(node.group.name)  # the tick looks for probe results only when told
    return probe


def _tokens(value: Any, default: int) -> int:
    """A token count from the server's ``usage``, within what a probe can produce."""
    try:
        count = int(value)
    except (TypeError, ValueError, OverflowError):
        return default
    return count if 0 < count <= 100_000 else default


def run_due_probes() -> int:
    """Probe every node the last ticks marked as due; returns the number of probes sent."""
    r = get_redis()
    sent = 0
    for group in ModelGroup.objects.filter(retired=False):
        due = r.hkeys(probes_key(group.name))
        if not due:
            continue
        names = [d.decode() for d in due]
        for node in Node.objects.filter(group=group, name__in=names, retired=False).select_related("group"):
            guard = f"outlier:probe-inflight:{group.name}:{node.name}"
            interval = group.thresholds().canary_interval_s
            # One probe per node per canary interval, whichever worker gets here first.
            if not r.set(guard, b"1", nx=True, px=int(interval * 1000)):
                continue
            probe_node(node)
            sent += 1
    return sent
