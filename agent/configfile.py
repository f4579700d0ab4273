"""Appliers that edit a router's own JSON configuration file (Envoy's EDS file, Traefik's file
provider): one way to read, write and confirm, the router-specific part in :meth:`plan` and
:meth:`running`.

* The operator writes the file first, with the router's backends; a missing file or one that is not
  JSON fails the apply with what to do (``hint``), and nothing is invented.
* :meth:`plan` (pure, per router) returns the new body, the result and the *target*: what the router
  must run once it has loaded the file.
* The file is rewritten, by a rename (``write_atomically``: what both routers' watchers need), only
  when the content changed; the operator's formatting of an unchanged file is kept.
* With an API (``api``), the apply returns only once :meth:`running` equals the target, polled until
  ``confirm_timeout_s``; else it fails (counted and retried by the agent). A write not yet confirmed
  is confirmed again on the next apply, even if nothing new is written.
* The result's note is passed on once per change (:class:`~agent.base.NoteOnce`).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from agent.adminapi import AdminAPI
from agent.base import ApplyError, ApplyResult, NoteOnce
from agent.client import EffectiveWeights
from agent.nginx import write_atomically


class ConfigFileApplier:
    """Base of the file-editing appliers (module docstring)."""

    name = ""
    #: The router, for messages ("Envoy").
    router = ""
    #: What to do when the file is missing (its section of docs/gateways.md).
    hint = ""
    #: Seconds between two reads of the router's API while confirming.
    poll_s = 0.05

    def __init__(self, path: str | os.PathLike[str], *, api: AdminAPI | None, confirm_timeout_s: float) -> None:
        self.path = Path(path)
        self.api = api
        self.confirm_timeout_s = confirm_timeout_s
        self._unconfirmed: Any = None
        self._note = NoteOnce()

    def plan(self, body: Any, weights: EffectiveWeights) -> tuple[Any, ApplyResult, Any]:
        raise NotImplementedError

    def running(self) -> Any:
        """What the router runs, in the form of :meth:`plan`'s target (its API)."""
        raise NotImplementedError

    def apply(self, weights: EffectiveWeights) -> ApplyResult:
        try:
            old = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ApplyError(f"no file at {self.path}: {self.hint}") from None
        try:
            body = json.loads(old)
        except ValueError as exc:
            raise ApplyError(f"{self.path} is not JSON ({exc}): the agent reads and writes the JSON form "
                             f"({self.hint})") from None
        new_body, result, target = self.plan(body, weights)
        if new_body != body:
            write_atomically(self.path, json.dumps(new_body, indent=2) + "\n")
            self._unconfirmed = target
            if not result.changes:
                result.changes.append(f"rewrote {self.path}")
        if self.api is not None and self._unconfirmed is not None:
            self._confirm(self._unconfirmed)
            self._unconfirmed = None
        return self._note(result)

    def _confirm(self, target: Any) -> None:
        deadline = time.monotonic() + self.confirm_timeout_s
        while True:
            now = self.running()
            if now == target:
                return
            if time.monotonic() >= deadline:
                raise ApplyError(f"{self.router} did not load {self.path} within {self.confirm_timeout_s:g} s "
                                 f"(running {now}, wanted {target}); its log says why (a file it rejects "
                                 "leaves the previous configuration running)")
            time.sleep(self.poll_s)

    def set_safeguard(self, active: bool) -> None:
        # Neither file has a place for it; the flag is in the agent's metrics and status file.
        return None
