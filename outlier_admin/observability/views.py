"""``/metrics``, ``/healthz``, ``/readyz`` (thin: logic in :mod:`.metrics` and :mod:`.health`).

``/healthz`` answers 200 whenever the process serves requests (liveness: restart me if not).
``/readyz`` answers 200 when the database and Redis both answer, else 503 with which one failed
(readiness: send me no traffic until then). Neither needs authentication, like ``/metrics``:
expose them on the internal network only.
"""

from __future__ import annotations

import orjson
from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET

from outlier_admin.observability import health, metrics


@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    return HttpResponse(metrics.render(), content_type=metrics.CONTENT_TYPE)


@require_GET
def healthz(request: HttpRequest) -> HttpResponse:
    return HttpResponse(orjson.dumps({"status": "ok"}), content_type="application/json")


@require_GET
def readyz(request: HttpRequest) -> HttpResponse:
    ready, checks = health.readiness()
    body = {"status": "ready" if ready else "not_ready", "checks": checks}
    return HttpResponse(orjson.dumps(body), status=200 if ready else 503, content_type="application/json")
