"""Small gateway-side client for the weights document the control plane publishes in Redis.

Runs on a gateway host with only ``redis-py`` installed: no Django (nor numpy) import here, nor in
anything this module imports (``detector.states`` is plain Python).

Contract (written by the control plane)
---------------------------------------
* Redis key :func:`contract.keys.weights` (``outlier:{<group>}:weights:v2``; on a Redis of the
  previous release, :func:`~contract.keys.legacy_weights`, which this client reads when the
  versioned key is absent: see ``agent/README.md``, "Key migration") holds JSON::

      {"group": "llama-70b", "version": 42, "generated_at": 1733212345.2, "stale_after_s": 30,
       "safeguard": false,
       "nodes": [{"node": "gpu-07", "address": "10.0.0.7:8000", "weight": 35,
                  "state": "degraded", "base_weight": 100}, ...]}

  ``weight`` is an integer on the node's ``0..base_weight`` scale; quarantined nodes carry weight 0
  and a state the traffic table (:data:`detector.states.TRAFFIC`) drains: ``quarantined``,
  ``probing``, ``forced_quarantine``. A ``pending_approval`` node is kept at the floor weight until a
  human decides; a state label this client does not know follows its weight.
* Every publish also sends ``{"group": ..., "version": ...}``: on a single Redis (or Sentinel) with
  ``PUBLISH`` on channel :data:`contract.keys.LEGACY_WEIGHTS_CHANNEL`; on a Redis Cluster with
  ``SPUBLISH`` on the group's sharded channel :func:`contract.keys.weights_channel` (a plain
  ``PUBLISH`` would be copied to every node of the cluster).

The document's type, its JSON, its defaults and its validation are
:mod:`contract.weights_document` (re-exported here).

What the client does with it (fail static, then fail open)
----------------------------------------------------------
* It pulls the document on start, on every notification for its group, and every ``poll_interval_s``
  (pub/sub is best effort: a missed message is repaired by the next poll).
* A document is accepted when its version is newer than the last good one, or the same version with
  a newer ``generated_at`` (the control plane re-stamps an unchanged document on every tick, which is
  what keeps it fresh). Older versions are ignored; malformed documents are rejected with a reason and
  the last good document is kept. One malformed *node* (an address that is not ``host:port``, a
  weight out of range, a duplicate) is skipped with a logged reason and the rest of the group is
  applied: one bad record must not take a whole group's gateways out of the control plane's hands.
  The control plane checks every document against this same contract before it publishes it
  (:meth:`WeightsDocument.build`, called by ``outlier_admin.control.publish``).
* While Redis is unreachable or the control plane stops re-publishing, the last good document keeps
  being served (**fail static**): ``mode == "live"``.
* Once ``now - generated_at > stale_after_s`` the client serves every node at its ``base_weight`` in
  state ``ready`` (**fail open**): ``mode == "fail_open"``. A dead control plane must not leave a
  fleet stuck with nodes drained on old evidence. ``generated_at`` is the control plane's clock, so
  the gateway and control-plane hosts need NTP-level clock agreement (seconds, not minutes).
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import redis

from contract import keys
from contract.topology import (  # noqa: F401  (re-exported: the agents' and tools' one connection function)
    REDIRECTIONS,
    RedisURLError,
    is_cluster,
    redis_from_url,
)
from contract.traffic import OUT_OF_SERVICE_LABELS
from contract.weights_document import (  # noqa: F401  (the contract; re-exported for the agents)
    DEFAULT_BASE_WEIGHT,
    DEFAULT_STALE_AFTER_S,
    DocumentError,
    NodeWeight,
    WeightsDocument,
    check_document,
    parse_document,
    split_address,
)

log = logging.getLogger("agent.client")

#: The agent's ``--key-prefix`` / ``--channel`` defaults: the legacy (single-Redis) key and channel.
KEY_PREFIX = keys.legacy_weights_prefix()
CHANNEL = keys.LEGACY_WEIGHTS_CHANNEL
#: The hash expires a day after its last report, so gateways that went away do not stay listed for ever.
APPLIED_TTL_S = 86400

#: States in which a node must receive no traffic (weight 0 plus drain on gateways that have it): the
#: control plane's one traffic table (``pending_approval`` is kept at the floor weight, not drained).
QUARANTINE_STATES = OUT_OF_SERVICE_LABELS

MODE_LIVE = "live"
MODE_FAIL_OPEN = "fail_open"


@dataclass(frozen=True)
class EffectiveWeights:
    """What a gateway should apply now: the live document, or its fail-open base-weight version.

    ``key()`` identifies the routing content (mode + per-node weight/state) so that appliers can
    skip work when nothing changed even if the version moved.
    """

    group: str
    version: int
    generated_at: float
    mode: str  # MODE_LIVE or MODE_FAIL_OPEN
    safeguard: bool
    nodes: tuple[NodeWeight, ...]
    age_s: float = 0.0

    def key(self) -> tuple[Any, ...]:
        return (
            self.mode,
            self.safeguard,
            tuple((n.node, n.address, n.weight, n.state, n.base_weight) for n in self.nodes),
        )


def effective_weights(doc: WeightsDocument, now: float) -> EffectiveWeights:
    """The weights to apply at ``now``: the document itself, or base weights once it is stale."""
    age = doc.age_s(now)
    if not doc.is_stale(now):
        return EffectiveWeights(doc.group, doc.version, doc.generated_at, MODE_LIVE, doc.safeguard,
                                doc.nodes, age)
    # Fail open: every node back at its base weight; the safeguard flag no longer means anything.
    nodes = tuple(replace(n, weight=n.base_weight, state="ready") for n in doc.nodes)
    return EffectiveWeights(doc.group, doc.version, doc.generated_at, MODE_FAIL_OPEN, False, nodes, age)


@dataclass
class ClientStats:
    """Counters a caller can export (the agent turns them into Prometheus metrics)."""

    fetches: int = 0
    redis_errors: int = 0
    rejected_documents: int = 0
    skipped_nodes: int = 0  # nodes left out of the current document (see WeightsDocument.skipped)
    last_error: str = ""
    last_rejection: str = ""
    last_fetch_ok_at: float | None = None


@dataclass
class GatewayClient:
    """Pull/subscribe the weights document of one group and keep the last good one.

    >>> client = GatewayClient(redis_from_url("redis://127.0.0.1:6379/0"), "llama-70b")
    >>> client.refresh()           # pull once (never raises on Redis errors)
    >>> client.effective()         # EffectiveWeights or None before the first good document

    ``run(on_update, stop)`` is the long-running loop (pub/sub + polling) that the agent uses.
    """

    redis_client: redis.Redis
    group: str
    key_prefix: str = KEY_PREFIX
    channel: str = CHANNEL
    poll_interval_s: float = 5.0
    clock: Callable[[], float] = time.time
    document: WeightsDocument | None = None
    stats: ClientStats = field(default_factory=ClientStats)

    @classmethod
    def from_url(cls, url: str, group: str, **kwargs: Any) -> GatewayClient:
        """A client for ``url``: ``redis://``, ``rediss://``, ``unix://`` or, for a Redis run with
        Sentinel, ``redis+sentinel://host:port,host:port/<master>/<db>`` (see :func:`redis_from_url`;
        the agent's ``--redis-url`` takes any of them). Raises :class:`RedisURLError` for a URL that
        cannot be used."""
        # Short socket timeouts: a hung Redis must not freeze the gateway's fail-static clock.
        conn = redis_from_url(url, socket_timeout=2.0, socket_connect_timeout=2.0)
        return cls(conn, group, **kwargs)

    @property
    def key(self) -> str:
        """The versioned document key (:func:`contract.keys.weights`), read first."""
        return keys.weights(self.group)

    @property
    def legacy_key(self) -> str:
        """``<key_prefix><group>``, read when :attr:`key` is absent (a control plane of the previous
        release; see the agent README's "Key migration")."""
        return f"{self.key_prefix}{self.group}"


    def offer(self, raw: bytes | str) -> bool:
        """Validate ``raw`` and keep it if newer than the last good document. True if accepted."""
        try:
            doc = parse_document(raw, expected_group=self.group)
        except DocumentError as exc:
            self.stats.rejected_documents += 1
            self.stats.last_rejection = str(exc)
            log.warning("rejected weights document for group %s: %s", self.group, exc)
            return False
        cur = self.document
        if cur is not None and (doc.version, doc.generated_at) <= (cur.version, cur.generated_at):
            if doc.version < cur.version:
                log.info("ignored older weights version %s < %s for group %s", doc.version, cur.version,
                         self.group)
            return False
        if doc.skipped and (cur is None or doc.skipped != cur.skipped):
            # Logged when the set changes, not at every re-stamp of the same document (every tick).
            for why in doc.skipped:
                log.warning("skipped a node of group %s (the rest of the group is applied): %s", self.group, why)
        self.stats.skipped_nodes = len(doc.skipped)
        self.document = doc
        return True

    def refresh(self) -> bool:
        """Pull the document from Redis. Returns True when a newer document was accepted.

        Redis errors are counted and logged, never raised: the last good document stays in force.
        """
        self.stats.fetches += 1
        try:
            raw = self.redis_client.get(self.key)
            if raw is None:
                raw = self.redis_client.get(self.legacy_key)
        except redis.RedisError as exc:
            self.stats.redis_errors += 1
            self.stats.last_error = f"{type(exc).__name__}: {exc}"
            log.warning("cannot read %s: %s (keeping last good weights)", self.key, exc)
            return False
        self.stats.last_fetch_ok_at = self.clock()
        if raw is None:
            return False
        return self.offer(raw)

    def notification_is_news(self, payload: bytes | str) -> bool:
        """True if a pub/sub payload announces a newer version of our group (or cannot be read)."""
        try:
            msg = json.loads(payload)
            if msg.get("group") != self.group:
                return False
            version = int(msg.get("version"))
        except (ValueError, TypeError, AttributeError):
            return True  # unreadable notice: a pull is cheap and settles it
        return self.document is None or version >= self.document.version

    def report_applied(self, gateway: str, version: int, applied_at: float, mode: str) -> bool:
        """Tell the control plane which version this gateway applied (:func:`contract.keys.applied`).
        Best effort: a Redis error is counted and logged, never raised (applying matters, reporting
        does not). True when written."""
        body = json.dumps({"version": int(version), "applied_at": round(float(applied_at), 3), "mode": mode})
        key = keys.applied(self.group)
        try:
            pipe = self.redis_client.pipeline(transaction=False)
            pipe.hset(key, gateway[:200], body)
            pipe.expire(key, APPLIED_TTL_S)
            pipe.execute()
        except redis.RedisError as exc:
            self.stats.redis_errors += 1
            self.stats.last_error = f"{type(exc).__name__}: {exc}"
            log.warning("cannot report the applied version to %s: %s", key, exc)
            return False
        return True

    def weights(self) -> dict[str, int]:
        """Pull once and return ``{address: weight}`` to apply now: 0 for a node to drain, the last
        good document while Redis is unreachable, base weights once it is older than
        ``stale_after_s``; ``{}`` before any good document. (The simple way; a gateway that must
        react within a second uses :meth:`run`.)"""
        self.refresh()
        eff = self.effective()
        if eff is None:
            return {}
        return {n.address: 0 if n.quarantined else n.weight for n in eff.nodes}

    def effective(self, now: float | None = None) -> EffectiveWeights | None:
        """The weights to apply now (see ``effective_weights``); None before any good document."""
        if self.document is None:
            return None
        return effective_weights(self.document, self.clock() if now is None else now)

    def run(
        self,
        on_update: Callable[[EffectiveWeights], None],
        stop: threading.Event,
        *,
        reconnect_backoff_s: float = 1.0,
        resync_interval_s: float | None = None,
        retry_backoff_s: float = 1.0,
        max_retry_backoff_s: float = 10.0,
    ) -> None:
        """Subscribe + poll until ``stop`` is set; call ``on_update`` whenever the effective weights
        change (new version, new content, or the live -> fail-open transition), and at least every
        ``resync_interval_s`` if given.

        ``on_update`` runs in this thread. If it raises, the update counts as not delivered and is
        offered again with exponential backoff: ``retry_backoff_s`` after the first failure, doubling
        up to ``max_retry_backoff_s`` while the same content keeps failing (a gateway that is down is
        not hammered, nor its logs flooded, by every heartbeat version), at once when the content
        changes (a new decision may be one the gateway takes); the loop itself never dies.
        """
        deliver = _Delivery(self, on_update, resync_interval_s=resync_interval_s, retry_backoff_s=retry_backoff_s,
                            max_retry_backoff_s=max_retry_backoff_s)
        pubsub = None
        next_poll = 0.0
        while not stop.is_set():
            if pubsub is None:
                pubsub = self._subscribe()
                if pubsub is not None:
                    next_poll = 0.0  # notifications sent while unsubscribed are lost: pull once now
            now = self.clock()
            if now >= next_poll:
                self.refresh()
                next_poll = now + self.poll_interval_s
                deliver()
            wait = max(0.0, min(next_poll - self.clock(), self._time_to_stale()))
            if pubsub is None:
                stop.wait(min(wait, reconnect_backoff_s))
                deliver()  # the fail-open transition happens on the clock, not on a message
                continue
            try:
                payload = pubsub.get(timeout=min(wait, 1.0) if wait > 0 else 0.0)
            except (redis.RedisError, OSError, ValueError, KeyError) as exc:
                self.stats.redis_errors += 1
                self.stats.last_error = f"{type(exc).__name__}: {exc}"
                log.warning("pub/sub connection lost: %s (reconnecting)", exc)
                _close(pubsub)
                pubsub = None
                stop.wait(reconnect_backoff_s)
                continue
            if payload is not None and self.notification_is_news(payload):
                self.refresh()
            deliver()
        _close(pubsub)

    def _subscribe(self) -> _Notifications | None:
        """Subscribe to the group's notifications; None (polling only, counted and logged) when Redis
        refuses."""
        try:
            return _Notifications(self.redis_client, self.group, self.channel)
        except redis.RedisError as exc:
            self.stats.redis_errors += 1
            self.stats.last_error = f"{type(exc).__name__}: {exc}"
            log.warning("cannot subscribe to %s: %s (polling only)", self.channel, exc)
            return None

    def _time_to_stale(self) -> float:
        if self.document is None:
            return math.inf
        remaining = self.document.generated_at + self.document.stale_after_s - self.clock()
        # Wake just after the deadline so the fail-open transition is applied promptly.
        return max(0.0, remaining) + 0.01 if remaining > 0 else math.inf


class _Delivery:
    """What :meth:`GatewayClient.run` hands to the gateway, and when: the effective weights when they
    changed since the last delivery (new version, new content, the live -> fail-open transition) or a
    resync is due; after ``on_update`` raised, the same content again only after a backoff
    (``retry_backoff_s`` doubling up to ``max_retry_backoff_s``), other content at once."""

    def __init__(self, client: GatewayClient, on_update: Callable[[EffectiveWeights], None], *,
                 resync_interval_s: float | None, retry_backoff_s: float, max_retry_backoff_s: float) -> None:
        self.client = client
        self.on_update = on_update
        self.resync_interval_s = resync_interval_s
        self.retry_backoff_s = retry_backoff_s
        self.max_retry_backoff_s = max_retry_backoff_s
        self.last_key: tuple[Any, ...] | None = None
        self.last_version: int | None = None
        self.last_delivery = -math.inf
        self.failures = 0
        self.failed_key: tuple[Any, ...] | None = None
        self.retry_at = -math.inf

    def __call__(self) -> None:
        client = self.client
        eff = client.effective()
        if eff is None:
            return
        due = self.resync_interval_s is not None and client.clock() - self.last_delivery >= self.resync_interval_s
        if eff.key() == self.last_key and eff.version == self.last_version and not due:
            return
        if self.failures and eff.key() == self.failed_key and client.clock() < self.retry_at:
            return  # backing off: this content failed moments ago
        try:
            self.on_update(eff)
        except Exception as exc:  # an applier failure must not kill the watcher
            self.failures += 1
            self.failed_key = eff.key()
            delay = min(self.max_retry_backoff_s, self.retry_backoff_s * 2 ** (self.failures - 1))
            self.retry_at = client.clock() + delay
            log.warning("weights update for group %s not applied (failure %d; retry in %.1f s): %s",
                        client.group, self.failures, delay, exc)
            log.debug("update handler traceback", exc_info=True)
            self.last_key = None  # force a retry
            return
        self.failures = 0
        self.last_key, self.last_version, self.last_delivery = eff.key(), eff.version, client.clock()


class _Notifications:
    """The group's change notifications: ``SSUBSCRIBE`` to its sharded channel on a Redis Cluster
    (:func:`contract.keys.weights_channel`), ``SUBSCRIBE`` to ``channel`` otherwise."""

    def __init__(self, client: Any, group: str, channel: str) -> None:
        self.sharded = is_cluster(client)
        self.channel = keys.weights_channel(group) if self.sharded else channel
        if not self.sharded:
            self.pubsub = client.pubsub(ignore_subscribe_messages=True)
            try:
                self.pubsub.subscribe(self.channel)
            except BaseException:
                _close(self.pubsub)
                raise
            return
        self.client = client
        self.pubsub = client.pubsub()
        try:
            self.node = client.get_node_from_key(self.channel)
            self.pubsub.ssubscribe(self.channel)
        except BaseException:
            _close(self.pubsub)
            raise

    def get(self, timeout: float) -> bytes | None:
        """The next notification's payload, or None after ``timeout`` s. Raises ``redis.ConnectionError``
        when the subscription ended: Redis ends a shard channel's subscriptions when its slot moves to
        another primary (resharding, failover), and the caller subscribes again."""
        if not self.sharded:
            msg = self.pubsub.get_message(timeout=timeout)
            return msg["data"] if msg is not None and msg.get("type") == "message" else None
        try:
            msg = self.pubsub.get_sharded_message(timeout=timeout, target_node=self.node)
        except redis.exceptions.MovedError as exc:
            # SSUBSCRIBE went to the slot's former primary (the client's map predates a move): redis-py
            # follows MOVED for commands, not for a subscription, so read the map again before the caller
            # subscribes again.
            self.client.nodes_manager.initialize()
            raise redis.ConnectionError(f"{self.channel}: its slot moved ({exc})") from None
        if msg is None:
            return None
        kind = msg.get("type")
        kind = kind.decode() if isinstance(kind, bytes) else kind
        if kind == "smessage":
            return msg["data"]
        if kind == "sunsubscribe":
            raise redis.ConnectionError(f"{self.channel}: unsubscribed by the server (its slot moved)")
        return None

    def close(self) -> None:
        _close(self.pubsub)


def _close(pubsub: Any) -> None:
    if pubsub is None:
        return
    try:
        pubsub.close()
    except Exception:  # closing a broken connection may raise anything; nothing to do about it
        log.debug("pubsub close failed", exc_info=True)
