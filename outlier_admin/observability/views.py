"""``/metrics``, ``/healthz``, ``/readyz`` (thin: logic in :mod:`.metrics` and :mod:`.health`).

``/healthz`` answers 200 whenever the process serves requests (liveness: restart me if not).
``/readyz`` answers 200 when the database and Redis both answer, else 503 with which one failed
(readiness: send me no traffic until then). Neither needs authentication: expose them on the
internal network only. ``/metrics`` names every group and node, so it can also require a bearer token
(``METRICS_TOKEN``; Prometheus sends it with ``authorization: {credentials: ...}``; the check is
:func:`.metrics.scrape_allowed`, shared with the Celery workers' server). It keeps answering 200
while PostgreSQL is down, without the SQL-backed series (``outlier_metrics_sql_up 0``).
"""

from __future__ import annotations

import orjson
from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET

from outlier_admin.observability import health, metrics


@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    if not metrics.scrape_allowed(request.headers.get("Authorization")):
        body = {"error": metrics.UNAUTHORIZED_MESSAGE}
        resp = HttpResponse(orjson.dumps(body), status=401, content_type="application/json")
        resp["WWW-Authenticate"] = "Bearer"
        return resp
    # Served during a database outage too: the SQL-backed series are skipped (metrics.FleetCollector).
    return HttpResponse(metrics.render(), content_type=metrics.CONTENT_TYPE)


@require_GET
def healthz(request: HttpRequest) -> HttpResponse:
    return HttpResponse(orjson.dumps({"status": "ok"}), content_type="application/json")


@require_GET
def readyz(request: HttpRequest) -> HttpResponse:
    ready, checks = health.readiness()
    body = {"status": "ready" if ready else "not_ready", "checks": checks}
    return HttpResponse(orjson.dumps(body), status=200 if ready else 503, content_type="application/json")
