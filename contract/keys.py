"""Every Redis key and pub/sub channel the project uses: the one place that spells them.

Plain Python (standard library only): the gateway agent's distribution ships this module, and the
control plane, the harness, the benchmarks and the tests import it; nothing else writes an
``outlier:`` literal (``tests/contract/test_keys.py`` tokenizes every source to check it).

Per-group keys carry the group in a Redis Cluster hash tag, ``outlier:{<group>}:<what>``: Redis
Cluster hashes only the part between the first ``{`` and ``}``, so everything one tick or one ingest
touches for a group (stream, state, lock, inputs, outbox, dedup sets, the weights document and its
sharded channel) lands in one hash slot, and a MULTI/EXEC or a WATCH over them is legal on a cluster.
Group names cannot hold ``{``, ``}`` or ``:`` (:data:`contract.names.GROUP_NAME_RE`), so
the tag is always exactly the group. Fleet-wide keys (the tickers' registry, the scheduler's last-tick
set, alerts, the event scan's cursors) stay few and small: each sits in one slot of its own.

The gateway contract (what a gateway agent reads) is :func:`weights` (``outlier:{<group>}:weights:v2``)
and, on a cluster client, the sharded channel :func:`weights_channel`. For one release the control
plane on a single Redis (or Sentinel) also writes :func:`legacy_weights` (``outlier:weights:<group>``)
and publishes on :data:`LEGACY_WEIGHTS_CHANNEL` (``outlier:weights``), and the agents read the
legacy key when the versioned one is absent (an older control plane): see
``agent/README.md``, "Key migration".
"""

from __future__ import annotations

PREFIX = "outlier:"


def group_tag(group: str) -> str:
    """``outlier:{<group>}:``: the prefix of every per-group key (one cluster hash slot per group)."""
    return f"{PREFIX}{{{group}}}:"


def group_of(key: str | bytes) -> str | None:
    """The group a per-group key belongs to (the hash tag of ``outlier:{<group>}:...``), a legacy
    weights key's group, or None for a fleet-wide key. For tools that clean up one group's keys."""
    text = key.decode() if isinstance(key, bytes) else key
    if text.startswith(PREFIX + "{"):
        group, sep, _ = text[len(PREFIX) + 1:].partition("}:")
        return group if sep and group[:1].isalnum() else None
    if text.startswith(_LEGACY_WEIGHTS_PREFIX):
        return text[len(_LEGACY_WEIGHTS_PREFIX):] or None
    return None


def _glob_escape(text: str) -> str:
    """``text`` matched literally by a Redis glob (``SCAN MATCH``)."""
    return "".join("\\" + c if c in "*?[]{}\\" else c for c in text)


def group_pattern(group: str) -> str:
    """A ``SCAN MATCH`` pattern for every per-group key of ``group``."""
    return f"{PREFIX}{_glob_escape('{' + group + '}')}:*"


# --- per group: the tick's and the ingest's keys ------------------------------------------------------------


def stream(group: str) -> str:
    """Redis Stream of ingest batches (consumer group ``ticks``): written by the ingest pipeline and the
    scrapers, read, acknowledged and trimmed by the group's tick."""
    return f"{group_tag(group)}stream"


def state(group: str) -> str:
    """Hash of the tick's state: ``detector`` (checkpoint), ``last_id``, ``rev`` (fence token),
    ``version``, ``thresholds_version``, ``history_slot``, ``checkpoint_at``; written only by the tick."""
    return f"{group_tag(group)}state"


def inputs(group: str) -> str:
    """Counter of operator inputs committed to SQL and not yet applied: raised by actions and canaries,
    read and cleared by the tick."""
    return f"{group_tag(group)}inputs"


def tick_lock(group: str) -> str:
    """The group's tick lease (token, PX, renewed while the tick runs): written by the tick's holder."""
    return f"{group_tag(group)}lock:tick"


def tick_queued(group: str) -> str:
    """Set (PX lease) while a tick of the group is queued: written by the scheduler, cleared by the tick."""
    return f"{group_tag(group)}tick:queued"


def dedup(group: str, window: int) -> str:
    """Set of the ``request_id`` s accepted in de-duplication window ``window``: written and read by
    the ingest pipeline in the same transaction as the stream append."""
    return f"{group_tag(group)}dedup:{window}"


def probes(group: str) -> str:
    """Hash node -> address of a canary probe due: written by the tick, taken by the canary worker."""
    return f"{group_tag(group)}probes"


def probe_inflight(group: str, node: str) -> str:
    """NX guard: one canary probe at a time per node (canary worker)."""
    return f"{group_tag(group)}probe-inflight:{node}"


def config_snapshot(group: str) -> str:
    """The group's configuration for ticks while PostgreSQL is down: written by a tick with SQL, read by
    an outage tick (``control.outage_store``)."""
    return f"{group_tag(group)}config"


def outbox(group: str) -> str:
    """List of an outage tick's SQL rows: pushed by the outage tick, drained when PostgreSQL returns."""
    return f"{group_tag(group)}outbox"


def outage_version(group: str) -> str:
    """The version an outage tick (PostgreSQL down) published: set by it, cleared by the outbox drain.
    The key keeps its name of the previous release (``...:degraded``), so that a mark an older worker
    set during an outage is still read and cleared by the drain after the upgrade."""
    return f"{group_tag(group)}degraded"


def itl(group: str) -> str:
    """Hash node -> the last model-server scrape's counters ``[ts, *EngineCounters]``: written and read
    by the scrapers (``ingest.modelserver``)."""
    return f"{group_tag(group)}itl"


# --- per group: the gateway contract ---------------------------------------------------------------------


def weights(group: str) -> str:
    """The published weights document (JSON string, one ``SET``): written by the tick and
    ``control.publish``, read by the gateway agents, the dashboard and the tools. Versioned (``v2``) and
    in the group's slot, so the tick writes it in its fenced MULTI/EXEC on a cluster too."""
    return f"{group_tag(group)}weights:v2"


def weights_channel(group: str) -> str:
    """Sharded pub/sub channel (``SPUBLISH``/``SSUBSCRIBE``) of the group's change notification
    ``{"group", "version"}`` on a Redis Cluster: in the group's slot, served by one shard only."""
    return f"{group_tag(group)}weights"


_LEGACY_WEIGHTS_PREFIX = f"{PREFIX}weights:"

#: Pub/sub channel (plain ``PUBLISH``) of every group's change notification on a single Redis or
#: Sentinel: published by the control plane, subscribed by the agents.
LEGACY_WEIGHTS_CHANNEL = f"{PREFIX}weights"


def legacy_weights(group: str) -> str:
    """The weights document at its pre-cluster name, ``outlier:weights:<group>``: still written on a
    single Redis for one release (agents of the previous release read it), read by agents as a fallback
    when :func:`weights` is absent (a control plane of the previous release)."""
    return f"{_LEGACY_WEIGHTS_PREFIX}{group}"


def legacy_weights_prefix() -> str:
    """``outlier:weights:``: the agent's ``--key-prefix`` default (the legacy key is prefix + group)."""
    return _LEGACY_WEIGHTS_PREFIX


def pre_cluster_names(group: str) -> dict[str, str]:
    """``{current name: name before the hash-tagged layout}`` of the group's lasting keys (stream with its
    consumer group, state, marks, probes, config snapshot, outbox, outage version, scrape counters): read
    only by ``manage.py migrate_redis_keys``, which renames them once at the upgrade."""
    return {new(group): f"{PREFIX}{old}:{group}" for new, old in (
        (stream, "stream"), (state, "state"), (inputs, "inputs"), (probes, "probes"),
        (config_snapshot, "config"), (outbox, "outbox"), (outage_version, "degraded"), (itl, "itl"))}


def pre_cluster_dedup_pattern(group: str) -> str:
    """``SCAN MATCH`` pattern of the group's de-duplication sets before the hash-tagged layout
    (``outlier:dedup:<group>:<window>``); the window is the part after the last ``:``."""
    return f"{PREFIX}dedup:{_glob_escape(group)}:*"


def applied(group: str) -> str:
    """Hash gateway id -> JSON ``{"version", "applied_at", "mode"}`` of the last document it applied:
    written by the agents, read by the dashboard's first screen (expires a day after the last report)."""
    return f"{PREFIX}applied:{group}"


# --- fleet-wide ------------------------------------------------------------------------------------------

#: Sorted set group -> Redis time its last completed tick started: written by ticks, read by the scheduler.
TICK_LAST = f"{PREFIX}tick:last"
#: Sorted set ticker id -> lease expiry of the event-driven tick loops (``control.scheduling.Ticker``).
TICKERS = f"{PREFIX}tickers"
#: Hash ticker id -> the groups it owns (for operators and tests), written by each ticker.
TICKER_GROUPS = f"{PREFIX}tickers:groups"
#: Set of the group names an outage tick may tick (``control.outage_store``), written while SQL is up; on a
#: single Redis only (on a cluster ``outage_store.known_groups`` scans the snapshots instead).
GROUPS = f"{PREFIX}groups"
#: Written before a ``WAIT`` (``control.redis_conn.replicas_acked``; single Redis or Sentinel); read by nobody.
REPLICA_ACK = f"{PREFIX}replica-ack"

#: List of alert deliveries Alertmanager refused, retried by the event scan (``observability.alerts``).
ALERTS_FAILED = f"{PREFIX}alerts:failed"
#: The alerts that held at the last sync (``observability.alerts``), read by the next sync.
ALERTS_ACTIVE = f"{PREFIX}alerts:active"
#: When the active alerts were last re-sent to Alertmanager (``observability.alerts``).
ALERTS_RESENT_AT = f"{PREFIX}alerts:resent_at"
#: Prefix of the event scan's cursors and lock (``observability.events``): ``outlier:obs:<name>``.
OBS_PREFIX = f"{PREFIX}obs:"

#: The scrapers' hash tag: a lease and the alive mark are set by one script, so they share a slot (a
#: group name cannot start with ``_``, so this is no group's tag).
_SCRAPERS = f"{PREFIX}{{_scraper}}:"
#: Some scrape_metrics process holds a shard (the beat's scrape round steps aside): ``ingest.scraper``.
SCRAPER_ALIVE = f"{_SCRAPERS}alive"

#: The demo's lease: one demo per Redis database (``outlier_admin.demo.runner``).
DEMO_LEASE = f"{PREFIX}demo:lease"


def scraper_lease(index: int, count: int) -> str:
    """The scrape_metrics process holding shard ``index`` of ``count`` (token, PX lease); in the slot of
    :data:`SCRAPER_ALIVE`."""
    return f"{_SCRAPERS}lease:{index}/{count}"


def scrape_rejected(group: str, node: str, kind: str) -> str:
    """NX guard of the scrapers: at most one rejected-input row a minute per node and kind."""
    return f"{PREFIX}scrape:rejected:{group}:{node}:{kind}"


def dcgm_rejected(group: str, node: str, kind: str) -> str:
    """NX guard of the DCGM scrape: at most one rejected-input row a minute per node and kind."""
    return f"{PREFIX}dcgm:rejected:{group}:{node}:{kind}"


def rejected_rows(source: str, hour: int) -> str:
    """Counter of rejected-input rows stored for ``source`` in clock hour ``hour`` (ingest pipeline)."""
    return f"{PREFIX}rejected-rows:{source}:{hour}"


def ingest_inflight(token_id: int | str) -> str:
    """The leases of an ingest token's requests in progress (``ingest.throttle``)."""
    return f"{PREFIX}ratelimit:ingest:inflight:{token_id}"


def ingest_bytes(token_id: int | str) -> str:
    """The token bucket of an ingest token's body bytes (``ingest.throttle``)."""
    return f"{PREFIX}ratelimit:ingest:bytes:{token_id}"


def preview_ratelimit(user_id: int | str) -> str:
    """The threshold preview's per-user rate-limit counter (``history.preview``)."""
    return f"{PREFIX}ratelimit:preview:{user_id}"


def obs(name: str) -> str:
    """The event scan's key ``name`` (a cursor or its lock): ``outlier:obs:<name>``."""
    return f"{OBS_PREFIX}{name}"
