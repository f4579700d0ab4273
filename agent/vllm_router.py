"""vLLM router (``vllm-router``, 0.1.x; a fork of the SGLang router) through its worker API
(vllm-project/router ``src/server.rs``).

``GET /list_workers`` (``{"urls": [...]}``) lists the workers, ``POST /remove_worker?url=...``
removes one at once (no drain: requests in flight on it finish, new ones go elsewhere) and
``POST /add_worker?url=...`` registers one again; the router checks the worker's health before it
answers, so the call returns once the worker routes (or fails with the reason, and the agent tries
again a second later). Weights: none (see :mod:`.worker_set`): ``priority`` and ``cost`` appear in
``GET /workers`` with their defaults and no API sets them. With ``--api-key`` or API-key validation
on the router, give the agent a key it accepts: ``--router-api-key``.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from agent.base import ApplyError
from agent.worker_set import RouterAPI, WorkerSetApplier, by_address

#: ``/add_worker`` waits for the worker's health check: a longer timeout than the other calls.
ADD_TIMEOUT_S = 10.0


class VllmRouterApplier(WorkerSetApplier):
    """Keeps a vLLM router's workers in line with the weights (module docstring)."""

    name = "vllm-router"

    def __init__(self, router_url: str, *, api_key: str | None = None,
                 router_workers: list[str] | tuple[str, ...] = (), remove_below: float = 0.0) -> None:
        super().__init__(RouterAPI(router_url, self.name, api_key=api_key), router_workers=router_workers,
                         remove_below=remove_below)
        self._add_api = RouterAPI(router_url, self.name, api_key=api_key, timeout_s=ADD_TIMEOUT_S)

    def list_workers(self) -> dict[str, Any]:
        _, body = self.api.call("GET", "/list_workers")
        urls = body.get("urls") if isinstance(body, dict) else None
        if not isinstance(urls, list):
            raise ApplyError(f"vllm-router GET /list_workers: unexpected answer {str(body)[:200]!r}")
        return by_address([u for u in urls if isinstance(u, str)])

    def url_of(self, address: str, handle: Any) -> str:
        return str(handle)

    def remove_worker(self, address: str, handle: Any) -> None:
        self.api.call("POST", f"/remove_worker?url={quote(str(handle), safe='')}", raw=True)

    def add_worker(self, address: str, url: str) -> None:
        self._add_api.call("POST", f"/add_worker?url={quote(url, safe='')}", raw=True)
