"""Canary probes: one synthetic completion request to a quarantined/probing node, to a degraded
node at quarantine strength that has no samples to confirm it with (a confirmation probe: its answer
is a sample of the node, not a verdict), or to a degraded node held cut for the exit dwell with no
detector accusing it (a release probe: a pass gives the cut back step by step;
``detector.ejection.probes_due``).

``POST <address>/v1/completions`` with a fixed prompt and ``max_tokens`` (``CANARY_MAX_TOKENS``),
timeout ``CANARY_TIMEOUT_S``. The probe is stored as :class:`CanaryProbe`; the next tick feeds it to
the state machine (``GroupDetector.record_probe``), which judges its normalised latency against the
peer baseline. Connection errors, timeouts and non-2xx answers are failed probes, stored with the
status and a reason code (:class:`ProbeError`).

Where the answer carries the engine's own timings of the request, they are used rather than the wall
time alone (:func:`engine_timings`): llama.cpp's ``timings`` (``prompt_ms``, ``predicted_ms``,
``prompt_n``, ``predicted_n``; also on its OpenAI-compatible answers) and Ollama's
``prompt_eval_duration`` / ``eval_duration`` (ns) with ``prompt_eval_count`` / ``eval_count``. They
are queue-free: ``ttft_ms`` is the prompt's time (the first token is sampled at its end) and
``total_ms`` the prompt's plus the generation's, so a probe that waited behind a request still
being served, or in a slow network, is not judged slow for it. They come from the node, so they are
bounded like any untrusted number: finite, not negative, and together no longer than the wall time
the request took (plus :data:`TIMING_SLACK_MS` for the two clocks' rounding); otherwise the wall
time stands.

Which probes are due is decided by the tick (``Evaluation.probes_due``, written to
the hash :func:`contract.keys.probes`); an ``NX`` guard per node keeps one probe in flight per node.
"""

from __future__ import annotations

import logging
import math
import secrets
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
from django.conf import settings

from contract import keys
from contract.names import NameError_
from outlier_admin.control.models import CanaryProbe
from outlier_admin.control.probe_load import ProbeLoad, load_of, median_answer, prompt_of
from outlier_admin.control.redis_conn import get_redis, mark_inputs_pending
from outlier_admin.fleet.models import ModelGroup, Node
from outlier_admin.fleet.netguard import guarded_transport

log = logging.getLogger(__name__)

PROMPT = "Count from one to twenty, separated by commas:"
# Used only when the server does not report usage: the prompt above is ~10 tokens.
PROMPT_TOKENS_GUESS = 10
#: How much longer than our wall time an engine's own timings may add up to: its clock and ours
#: round differently, by well under a millisecond; more than this is not a measurement of this request.
TIMING_SLACK_MS = 5.0


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


def probe_node(node: Node, *, client: httpx.Client | None = None, load: ProbeLoad | None = None) -> CanaryProbe:
    """Send one probe to ``node`` and store the result (not yet judged: ``passed`` is NULL).

    A probe is ``load.concurrency`` requests sent at once (:mod:`outlier_admin.control.probe_load`:
    the healthy peers' running batch, each request of their median size; default one short request),
    stored as its median answer (by total time, with its tokens); a probe with any request failed
    is failed, with that request's status and reason code.

    The URL is ``<scheme>://<host>:<port>/v1/completions`` rebuilt from the node's validated
    address (:func:`contract.names.parse_address`); redirects are not followed."""
    load = load or ProbeLoad()
    probe = CanaryProbe(node=node, ok=False)
    try:
        url = node.base_url + "/v1/completions"
    except NameError_ as exc:
        log.warning("canary: node %s has an invalid address, not probed: %s", node, exc.detail)
        probe.error = ProbeError.BAD_ADDRESS
        probe.save()
        mark_inputs_pending(node.group.name)
        return probe
    nonce = secrets.token_hex(4)
    completion = load.completion_tokens or settings.CANARY_MAX_TOKENS
    bodies: list[dict[str, Any]] = [
        {"prompt": prompt_of(PROMPT, load.prompt_tokens, k, nonce), "max_tokens": completion, "temperature": 0,
         **({"model": settings.CANARY_MODEL} if settings.CANARY_MODEL else {})}
        for k in range(load.concurrency)]
    own = client is None
    # Only to addresses the resolver's answer allows (fleet.netguard), never through an env proxy.
    client = client or httpx.Client(timeout=settings.CANARY_TIMEOUT_S, follow_redirects=False, trust_env=False,
                                    transport=guarded_transport())
    try:
        if len(bodies) == 1:
            answers = [_send(client, url, bodies[0], load)]
        else:
            with ThreadPoolExecutor(max_workers=len(bodies), thread_name_prefix="canary") as pool:
                answers = list(pool.map(lambda body: _send(client, url, body, load), bodies))
    finally:
        if own:
            client.close()
    failed = [a for a in answers if not a.ok]
    chosen = failed[0] if failed else median_answer(answers, lambda a: a.total_ms)
    for f in ("ok", "status", "error", "ttft_ms", "total_ms", "prompt_tokens", "completion_tokens"):
        setattr(probe, f, getattr(chosen, f))
    # ``normalised_latency`` is filled in by the tick that judges the probe, on the detector's scale.
    probe.save()
    mark_inputs_pending(node.group.name)  # the tick looks for probe results only when told
    return probe


def _send(client: httpx.Client, url: str, body: dict[str, Any], load: ProbeLoad) -> CanaryProbe:
    """One request of a probe, as an unsaved :class:`CanaryProbe` (its answer or its failure)."""
    one = CanaryProbe(ok=False, status=0)
    started = time.perf_counter()
    try:
        resp = client.post(url, json=body)
        one.total_ms = (time.perf_counter() - started) * 1000.0
        one.status = resp.status_code
        if 200 <= resp.status_code < 300:
            data = resp.json()
            usage = data.get("usage") or {}
            timed = engine_timings(data, one.total_ms)
            prompt_n, predicted_n = (timed[2], timed[3]) if timed else (None, None)
            one.prompt_tokens = _tokens(usage.get("prompt_tokens"),
                                        _tokens(prompt_n, load.prompt_tokens or PROMPT_TOKENS_GUESS))
            one.completion_tokens = _tokens(usage.get("completion_tokens"), _tokens(predicted_n, body["max_tokens"]))
            if timed is not None:
                one.ttft_ms, one.total_ms = timed[0], timed[1]
            one.ok = True
        else:
            one.error = ProbeError.HTTP_STATUS
    except httpx.TimeoutException:
        one.error = ProbeError.TIMEOUT
    except httpx.ConnectError:
        one.error = ProbeError.CONNECT
    except httpx.HTTPError:
        one.error = ProbeError.PROTOCOL
    except (ValueError, TypeError, AttributeError):
        one.error = ProbeError.BAD_RESPONSE
    finally:
        if one.total_ms is None:
            one.total_ms = (time.perf_counter() - started) * 1000.0
    return one


def _ms(value: Any, scale: float = 1.0) -> float | None:
    """A duration from the answer in ms (``scale``: its unit in ms), or ``None`` if not a finite
    number >= 0."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    ms = float(value) * scale
    return ms if math.isfinite(ms) and ms >= 0 else None


def engine_timings(data: Any, wall_ms: float) -> tuple[float, float, Any, Any] | None:
    """``(ttft_ms, total_ms, prompt_n, predicted_n)`` from the engine's own timings in a probe's
    answer (see the module docstring), or ``None`` when it has none, they are not numbers, or they
    add up to more than ``wall_ms`` (+ TIMING_SLACK_MS) or to nothing. The counts are as sent
    (:func:`_tokens` bounds them)."""
    if not isinstance(data, dict):
        return None
    timings = data.get("timings")
    if isinstance(timings, dict):  # llama.cpp server
        prompt_ms, gen_ms = _ms(timings.get("prompt_ms")), _ms(timings.get("predicted_ms"))
        counts = timings.get("prompt_n"), timings.get("predicted_n")
    elif "eval_duration" in data:  # Ollama, in nanoseconds
        prompt_ms, gen_ms = _ms(data.get("prompt_eval_duration", 0), 1e-6), _ms(data.get("eval_duration"), 1e-6)
        counts = data.get("prompt_eval_count"), data.get("eval_count")
    else:
        return None
    if prompt_ms is None or gen_ms is None:
        return None
    total = prompt_ms + gen_ms
    if not 0 < total <= wall_ms + TIMING_SLACK_MS:
        return None
    return prompt_ms, total, counts[0], counts[1]


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
        due = r.hkeys(keys.probes(group.name))
        if not due:
            continue
        names = [d.decode() for d in due]
        interval = group.thresholds().canary_interval_s
        # The peers' load, read once per group from the detector the tick keeps (probe_load).
        load = load_of(r.hget(keys.state(group.name), "detector"))
        for node in Node.objects.filter(group=group, name__in=names, retired=False).select_related("group"):
            guard = keys.probe_inflight(group.name, node.name)
            # One probe in flight per node, whichever worker gets here first.
            if not r.set(guard, b"1", nx=True, px=int((settings.CANARY_TIMEOUT_S + 1) * 1000)):
                continue
            r.hdel(keys.probes(group.name), node.name)  # taken (the tick lists a probe once, when due)
            started = time.monotonic()
            try:
                probe_node(node, load=load)
            finally:
                # A quarantined node's next probe waits the canary interval (a later tick may list it
                # again before its answer is applied); a degraded node's confirmation probes are
                # paced by the detector itself (detector.ejection.probes_due).
                rest = 0.0 if node.state == "degraded" else interval - (time.monotonic() - started)
                if rest > 0.001:
                    r.pexpire(guard, int(rest * 1000))
                else:
                    r.delete(guard)
            sent += 1
    return sent
