"""A small JSON-over-HTTP client for routers' admin APIs (Caddy's admin endpoint, Envoy's admin
interface, Traefik's API), standard library only: the agent's distribution depends on redis-py alone.

Every call is retried with exponential backoff (``attempts`` tries, ``backoff_s`` doubling) when the
router is unreachable, times out, or answers 5xx: a router restarting or reloading comes back within
a second. A 4xx is the router refusing the request and is not retried. Every failed try is counted
(``outlier_agent_apply_failures_total{gateway}``). Failures raise
:class:`~agent.base.ApplyError`, which the agent counts
(``outlier_agent_apply_errors_total``) and retries on its next turn with the router's last good
configuration still in force. The base URL is checked once: ``http(s)://host:port`` with no path,
query or credentials (it is the operator's, from the command line).
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from agent.base import ApplyError
from agent.metrics import count_apply_failure


class AdminAPIRefused(ApplyError):
    """The router answered with a 4xx status: it refused the request (not retried). ``detail``: the
    start of its answer's body (the reason, often JSON)."""

    def __init__(self, message: str, status: int, detail: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.detail = detail


def check_base_url(url: str, what: str) -> str:
    """``url`` without a trailing slash, or ValueError when it is not ``http(s)://host:port``."""
    parts = urllib.parse.urlsplit(url.strip())
    if (parts.scheme not in ("http", "https") or not parts.hostname or parts.username or parts.password
            or parts.path.strip("/") or parts.query or parts.fragment):
        raise ValueError(f"{what} must be http://host:port (no path, query or credentials), got {url!r}")
    return f"{parts.scheme}://{parts.netloc}"


@dataclass
class Response:
    status: int
    body: Any
    headers: dict[str, str]


class AdminAPI:
    """JSON requests to ``base_url`` with retries (module docstring)."""

    def __init__(self, base_url: str, *, what: str = "admin API", timeout_s: float = 2.0, attempts: int = 3,
                 backoff_s: float = 0.2, gateway: str | None = None) -> None:
        self.base_url = check_base_url(base_url, what)
        self.what = what
        #: The ``gateway`` label of ``outlier_agent_apply_failures_total``: every failed try is counted.
        self.gateway = gateway or what
        self.timeout_s = timeout_s
        self.attempts = max(1, attempts)
        self.backoff_s = backoff_s

    def request(self, method: str, path: str, body: Any = None, *, headers: dict[str, str] | None = None,
                raw: bool = False) -> Response:
        """``method path`` with ``body`` as JSON; the answer's JSON (text when ``raw``)."""
        data = None if body is None else json.dumps(body).encode()
        hdrs = {"Accept": "application/json", **(headers or {})}
        if data is not None:
            hdrs["Content-Type"] = "application/json"
        url = self.base_url + path
        error = ""
        for attempt in range(self.attempts):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            req = urllib.request.Request(url, data=data, method=method, headers=hdrs)
            try:
                with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:  # the operator's URL
                    text = resp.read().decode("utf-8", "replace")
                    return Response(resp.status, text if raw else (json.loads(text) if text.strip() else None),
                                    {k.lower(): v for k, v in resp.headers.items()})
            except urllib.error.HTTPError as exc:
                count_apply_failure(self.gateway)
                detail = exc.read().decode("utf-8", "replace").strip()[:500]
                if exc.code < 500:
                    raise AdminAPIRefused(f"{self.what} {method} {path}: HTTP {exc.code} {detail}", exc.code,
                                          detail) from exc
                error = f"HTTP {exc.code} {detail}"
            except (OSError, ValueError) as exc:  # refused, reset, timeout; a body that is not JSON
                count_apply_failure(self.gateway)
                error = f"{type(exc).__name__}: {exc}"
        raise ApplyError(f"{self.what} {self.base_url} {method} {path} failed after {self.attempts} tries: {error}")

    def get(self, path: str) -> Any:
        return self.request("GET", path).body
