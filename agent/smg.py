"""SGLang Model Gateway (``smg``, 1.13) through its worker API (smg-docs ``reference/api/admin.md``).

``GET /workers`` lists the workers (``id``, ``url``, ``status``); a quarantined node's worker is
removed with ``DELETE /workers/{id}`` (a ``ready`` worker first turns ``draining``: no new request,
in-flight ones finish within ``drain_settle_secs``, 5 s by default) and a node back in service is
registered again with ``POST /workers`` (the gateway probes it and routes to it once ``ready``).
Both answer ``202 Accepted`` and run as background jobs. A worker still ``draining`` counts as gone;
re-adding it before it is removed answers ``409`` and the apply fails, to be retried a second later.

What a re-registered worker keeps: its URL and the ``priority``, ``cost``, ``labels``,
``runtime_type`` and ``worker_type`` the gateway listed before the removal. The per-worker
``api_key``, ``health``, ``http_pool`` and ``resilience`` settings are not returned by the gateway,
so a worker re-added by the agent runs on the gateway-wide defaults for them (set those on the
command line, not per worker, when the agent drives the gateway).

Weights: none (see :mod:`.worker_set`): ``priority`` and ``cost`` are stored, and no built-in policy
reads them (smg-docs, "Routing metadata"). With ``--api-key`` (or control-plane auth) on the
gateway, give the agent an admin credential: ``--router-api-key``.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from agent.base import ApplyError
from agent.worker_set import RouterAPI, WorkerSetApplier, worker_address

#: Spec fields the gateway lists and the agent sends back when it registers a worker again.
RESENT_FIELDS = ("priority", "cost", "labels", "runtime_type", "worker_type")


class SmgApplier(WorkerSetApplier):
    """Keeps an SGLang Model Gateway's workers in line with the weights (module docstring)."""

    name = "smg"

    def __init__(self, router_url: str, *, api_key: str | None = None,
                 router_workers: list[str] | tuple[str, ...] = (), remove_below: float = 0.0) -> None:
        super().__init__(RouterAPI(router_url, self.name, api_key=api_key), router_workers=router_workers,
                         remove_below=remove_below)
        #: address -> the worker as the gateway listed it, kept when the agent removes it.
        self._specs: dict[str, dict[str, Any]] = {}

    def list_workers(self) -> dict[str, Any]:
        _, body = self.api.call("GET", "/workers")
        if not isinstance(body, dict) or not isinstance(body.get("workers"), list):
            raise ApplyError(f"smg GET /workers: unexpected answer {str(body)[:200]!r}")
        out: dict[str, Any] = {}
        for worker in body["workers"]:
            if not isinstance(worker, dict) or not isinstance(worker.get("url"), str):
                continue
            if worker.get("status") == "draining" or worker.get("worker_type", "regular") != "regular":
                continue  # on its way out; prefill/decode/encode workers are not the agent's
            try:
                out[worker_address(worker["url"])] = worker
            except ValueError:
                continue
        return out

    def url_of(self, address: str, handle: Any) -> str:
        return str(handle.get("url") or f"http://{address}")

    def remove_worker(self, address: str, handle: Any) -> None:
        worker_id = str(handle.get("id", ""))
        if not worker_id:
            raise ApplyError(f"smg lists worker {address} without an id")
        self._specs[address] = {k: handle[k] for k in RESENT_FIELDS if k in handle}
        self.api.call("DELETE", f"/workers/{quote(worker_id, safe='')}", accept=(404,))

    def add_worker(self, address: str, url: str) -> None:
        spec = {**self._specs.get(address, {}), "url": url}
        status, body = self.api.call("POST", "/workers", spec, accept=(409,))
        if status == 409:
            code = body.get("code") if isinstance(body, dict) else ""
            if code == "WORKER_CREATE_IN_PROGRESS":
                return  # registered already, becoming ready
            # WORKER_ALREADY_EXISTS for a worker the list did not show: it is still draining.
            raise ApplyError(f"smg: worker {url} is still draining; registering it again shortly ({body})")
        self._specs.pop(address, None)
