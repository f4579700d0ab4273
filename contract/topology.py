"""The Redis topology the control plane and the gateways share: one Redis, Sentinel or Cluster.

The one function that turns a Redis URL into a client (:func:`redis_from_url`: ``redis://``,
``rediss://``, ``unix://``, ``redis+sentinel://`` and ``redis+cluster://``), for the control plane
(``outlier_admin.control.redis_conn.get_redis``), the agents (:meth:`agent.client.GatewayClient.from_url`)
and the tools; :func:`is_cluster` (a cluster client runs a transaction within one slot only, and
publishes on sharded channels: :func:`publish`); the start-up checks (:func:`sentinel_problem`,
:func:`cluster_problem`) and the count of cluster redirections (:data:`REDIRECTIONS`).
Plain Python with redis-py only: no Django; the gateway host's distribution ships it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis

from contract import keys

log = logging.getLogger(__name__)


SENTINEL_SCHEME = "redis+sentinel"
#: Bounds of a sentinel URL: enough for any real deployment (Sentinel wants 3 or 5), small enough that
#: a typo pasted in cannot make start-up try hundreds of addresses.
MAX_SENTINELS = 16
MAX_DB = 9999
_MASTER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


class RedisURLError(ValueError):
    """A Redis URL that cannot be used; ``str(err)`` says what is wrong (never the password)."""


@dataclass(frozen=True)
class SentinelURL:
    """``redis+sentinel://[[user]:password@]host:port[,host:port...]/<master>[/<db>][?sentinel_password=...]``:
    the Sentinels to ask, the name of the master they monitor, the database number; the password
    (and user) are the data nodes' (primary and replicas), ``sentinel_password`` the Sentinels' own."""

    sentinels: tuple[tuple[str, int], ...]
    master: str
    db: int = 0
    username: str | None = None
    password: str | None = None
    sentinel_password: str | None = None

    def describe(self) -> str:
        """The URL without secrets, for messages."""
        hosts = ",".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in self.sentinels)
        return f"{SENTINEL_SCHEME}://{hosts}/{self.master}/{self.db}"


def _host_port(item: str) -> tuple[str, int]:
    if item.startswith("["):  # [::1]:26379
        host, sep, port = item[1:].partition("]:")
    else:
        host, sep, port = item.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise RedisURLError(f"address {item!r} is not host:port (port 1-65535)")
    if any(c.isspace() or c in "/@?#" for c in host):
        raise RedisURLError(f"address {item!r} has a bad host name")
    return host, int(port)


def parse_sentinel_url(url: str) -> SentinelURL:
    """Parse a ``redis+sentinel://`` URL (see :class:`SentinelURL`); raises :class:`RedisURLError`."""
    from urllib.parse import parse_qs, unquote

    prefix = f"{SENTINEL_SCHEME}://"
    if not url.startswith(prefix):
        raise RedisURLError(f"not a {prefix} URL")
    rest, _, query = url[len(prefix):].partition("?")
    netloc, _, path = rest.partition("/")
    sentinels, username, password = _hosts_and_credentials(
        netloc, none=f"{prefix} URL names no sentinel (host:port,host:port,...)",
        too_many="{n} sentinels listed; at most {limit}")
    parts = [p for p in path.split("/") if p]
    if not parts:
        raise RedisURLError(f"{prefix} URL names no master: {prefix}host:port,.../<master>/<db>")
    if len(parts) > 2:
        raise RedisURLError(f"{prefix} URL path must be /<master>[/<db>], not /{path}")
    master = unquote(parts[0])
    if not _MASTER_NAME.fullmatch(master):
        raise RedisURLError(f"master name {master!r} is not 1-64 letters, digits, '.', '_' or '-'")
    db = 0
    if len(parts) == 2:
        if not parts[1].isdigit() or int(parts[1]) > MAX_DB:
            raise RedisURLError(f"database {parts[1]!r} is not a number 0-{MAX_DB}")
        db = int(parts[1])
    options = parse_qs(query, keep_blank_values=True)
    unknown = set(options) - {"sentinel_password"}
    if unknown:
        raise RedisURLError(f"unknown {prefix} URL option(s): {', '.join(sorted(unknown))} "
                            "(only sentinel_password)")
    sentinel_password = options.get("sentinel_password", [None])[-1] or None
    return SentinelURL(sentinels, master, db, username, password, sentinel_password)


def is_sentinel_url(url: str) -> bool:
    return url.startswith(f"{SENTINEL_SCHEME}://")


def _sentinel(spec: SentinelURL, kwargs: dict[str, Any]) -> Any:
    from redis.sentinel import Sentinel

    # The Sentinels are asked with the same short timeouts as the data nodes: an unreachable one costs
    # at most the connect timeout, never a hang.
    sentinel_kwargs = {k: v for k, v in kwargs.items() if k in ("socket_timeout", "socket_connect_timeout")}
    if spec.sentinel_password:
        sentinel_kwargs["password"] = spec.sentinel_password
    return Sentinel(list(spec.sentinels), sentinel_kwargs=sentinel_kwargs, **kwargs)


def redis_from_url(url: str, **kwargs: Any) -> redis.Redis:
    """A redis-py client for ``url``. ``redis+cluster://host:port,...`` is a Redis Cluster
    (:func:`cluster_from_url`); ``redis://``, ``rediss://`` and ``unix://`` go to
    ``redis.Redis.from_url``; ``redis+sentinel://host:port,.../<master>/<db>`` to redis-py's
    ``redis.sentinel.Sentinel(...).master_for(master)``: every new connection asks the Sentinels
    where the primary is, and a connection that finds a demoted primary (``READONLY``) or loses its
    server reconnects to the one they name now, so a client follows a failover by itself.
    ``kwargs`` (socket timeouts, ``health_check_interval``) apply to the data nodes and, for the
    socket timeouts, to the Sentinels. Raises :class:`RedisURLError` for a sentinel URL that cannot
    be used (nothing is connected here: an unreachable Sentinel or an unknown master name is
    ``redis.sentinel.MasterNotFoundError`` at the first command, or see :func:`sentinel_problem`)."""
    if is_cluster_url(url):
        return cluster_from_url(url, **kwargs)
    if not is_sentinel_url(url):
        return redis.Redis.from_url(url, **kwargs)
    spec = parse_sentinel_url(url)
    node_kwargs = dict(kwargs)
    if spec.username:
        node_kwargs["username"] = spec.username
    if spec.password:
        node_kwargs["password"] = spec.password
    return _sentinel(spec, kwargs).master_for(spec.master, db=spec.db, **node_kwargs)


def sentinel_problem(url: str, timeout_s: float = 1.0) -> str | None:
    """What stops a client of the sentinel ``url`` from finding its primary, in words naming the
    Sentinels and the master (None when a Sentinel names a primary for it; for a URL that is not a
    sentinel one, None without any connection). Asks every listed Sentinel, each with ``timeout_s``
    to connect and to answer: a start-up check that fails fast instead of hanging."""
    if not is_sentinel_url(url):
        return None
    try:
        spec = parse_sentinel_url(url)
    except RedisURLError as exc:
        return str(exc)
    unreachable: list[str] = []
    not_sentinel: list[str] = []
    monitored: set[str] = set()
    for host, port in spec.sentinels:
        where = f"{host}:{port}"
        client = redis.Redis(host=host, port=port, password=spec.sentinel_password, socket_timeout=timeout_s,
                             socket_connect_timeout=timeout_s)
        try:
            masters = client.sentinel_masters()
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            unreachable.append(f"{where} ({type(exc).__name__}: {exc})")
            continue
        except redis.ResponseError as exc:  # e.g. a plain redis-server: unknown command 'SENTINEL'
            not_sentinel.append(f"{where} ({exc})")
            continue
        finally:
            client.close()
        state = masters.get(spec.master)
        if state is not None:
            return None  # a Sentinel names a primary (down or not: a failover is its job)
        monitored.update(masters)
    if monitored:
        return (f"{spec.describe()}: the Sentinels monitor no master named {spec.master!r} "
                f"(they monitor: {', '.join(sorted(monitored))})")
    if not_sentinel and not unreachable:
        return f"{spec.describe()}: not a Redis Sentinel: {'; '.join(not_sentinel)}"
    if not_sentinel or unreachable:
        return (f"{spec.describe()}: no Redis Sentinel reachable: "
                f"{'; '.join(unreachable + [f'not a sentinel: {x}' for x in not_sentinel])}")
    return f"{spec.describe()}: the Sentinels monitor no master named {spec.master!r} (they monitor none)"


# --- Redis Cluster ------------------------------------------------------------------------------------------

CLUSTER_SCHEME = "redis+cluster"


@dataclass(frozen=True)
class ClusterURL:
    """``redis+cluster://[[user]:password@]host:port[,host:port...][/0]``: start-up nodes of one Redis
    Cluster (any of its nodes; redis-py learns the rest from ``CLUSTER SLOTS``). A cluster has only
    database 0."""

    nodes: tuple[tuple[str, int], ...]
    username: str | None = None
    password: str | None = None

    def describe(self) -> str:
        """The URL without secrets, for messages."""
        return f"{CLUSTER_SCHEME}://{','.join(f'{h}:{p}' for h, p in self.nodes)}"


def is_cluster_url(url: str) -> bool:
    return url.startswith(f"{CLUSTER_SCHEME}://")


def parse_cluster_url(url: str) -> ClusterURL:
    """Parse a ``redis+cluster://`` URL (see :class:`ClusterURL`); raises :class:`RedisURLError`."""
    prefix = f"{CLUSTER_SCHEME}://"
    if not url.startswith(prefix):
        raise RedisURLError(f"not a {prefix} URL")
    rest, _, query = url[len(prefix):].partition("?")
    if query:
        raise RedisURLError(f"{prefix} URL takes no options (got ?{query.split('=')[0]}=...)")
    netloc, _, path = rest.partition("/")
    if path.strip("/") not in ("", "0"):
        raise RedisURLError(f"a Redis Cluster has only database 0, not /{path.strip('/')}")
    nodes, username, password = _hosts_and_credentials(
        netloc, none=f"{prefix} URL names no node ({prefix}host:port,host:port,...)",
        too_many="{n} cluster nodes listed; at most {limit} (a few are enough)")
    return ClusterURL(nodes, username, password)


def _hosts_and_credentials(netloc: str, *, none: str, too_many: str
                           ) -> tuple[tuple[tuple[str, int], ...], str | None, str | None]:
    """``user:password@host:port,host:port`` of a Sentinel or Cluster URL: the distinct hosts (at
    least one, at most :data:`MAX_SENTINELS`) and the percent-decoded credentials."""
    from urllib.parse import unquote

    userinfo, at, hosts = netloc.rpartition("@")
    username = password = None
    if at:
        user, colon, pw = userinfo.partition(":")
        username, password = (unquote(user) or None), (unquote(pw) if colon else None)
    items = [h.strip() for h in hosts.split(",") if h.strip()]
    if not items:
        raise RedisURLError(none)
    if len(items) > MAX_SENTINELS:
        raise RedisURLError(too_many.format(n=len(items), limit=MAX_SENTINELS))
    return tuple(dict.fromkeys(_host_port(h) for h in items)), username, password


#: MOVED and ASK redirections the Redis Cluster clients of this process received (each one retried by
#: redis-py): ``{"moved": n, "ask": n}``. Listeners (the control plane's Prometheus counter) are called
#: with the kind at every one.
REDIRECTIONS: dict[str, int] = {"moved": 0, "ask": 0}
_redirection_listeners: list[Callable[[str], None]] = []


def on_redirection(listener: Callable[[str], None]) -> None:
    """Call ``listener("moved" | "ask")`` at every cluster redirection this process receives."""
    if listener not in _redirection_listeners:
        _redirection_listeners.append(listener)


def _count_redirections() -> None:
    """Count every ``-MOVED``/``-ASK`` reply, where redis-py turns it into an exception (its one place,
    for plain commands, pipelines and transactions alike); redis-py retries them itself, and exposes
    no hook of its own. The exception returned is redis-py's own, unchanged (its cluster code checks
    the exact type)."""
    from redis._parsers.base import BaseParser

    if getattr(BaseParser.parse_error, "_outlier_counted", False):
        return
    original = BaseParser.parse_error.__func__

    def parse_error(cls: type, response: str) -> Exception:
        exc = original(cls, response)
        if isinstance(exc, redis.exceptions.AskError):  # MovedError is an AskError
            kind = "moved" if isinstance(exc, redis.exceptions.MovedError) else "ask"
            REDIRECTIONS[kind] += 1
            for listener in list(_redirection_listeners):
                try:
                    listener(kind)
                except Exception:  # a metric must not break a Redis command
                    log.debug("redirection listener failed", exc_info=True)
        return exc

    parse_error._outlier_counted = True  # type: ignore[attr-defined]
    BaseParser.parse_error = classmethod(parse_error)  # type: ignore[method-assign,assignment]


def cluster_from_url(url: str, **kwargs: Any) -> Any:
    """A ``redis.cluster.RedisCluster`` for a ``redis+cluster://`` URL. redis-py follows ``MOVED`` and
    ``ASK`` itself (counted in :data:`REDIRECTIONS`); ``kwargs`` (socket timeouts,
    ``health_check_interval``) apply to every node's connections. The constructor asks the listed
    nodes for the slot map: with none reachable it raises, after the connect timeout,
    ``redis.ConnectionError`` naming the nodes (see :func:`cluster_problem` for a
    start-up check that names each node)."""
    from redis.cluster import ClusterNode, RedisCluster
    from redis.exceptions import RedisClusterException

    spec = parse_cluster_url(url)
    _count_redirections()
    node_kwargs = dict(kwargs)
    if spec.username:
        node_kwargs["username"] = spec.username
    if spec.password:
        node_kwargs["password"] = spec.password
    try:
        return RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in spec.nodes], **node_kwargs)
    except RedisClusterException as exc:  # not a RedisError: callers that handle those would miss it
        raise redis.ConnectionError(f"{spec.describe()}: {exc}") from None


def is_cluster(client: Any) -> bool:
    """Whether ``client`` is a Redis Cluster client (sharded pub/sub, one slot per transaction)."""
    from redis.cluster import RedisCluster

    return isinstance(client, RedisCluster)


def cluster_problem(url: str, timeout_s: float = 1.0) -> str | None:
    """What is wrong with the Redis Cluster of ``url``, in words naming the nodes (None when every listed
    node answers as a member of one cluster whose 16384 slots are all served; for a URL that is not a
    cluster one, None without any connection). Each node gets ``timeout_s`` to connect and to answer:
    a start-up check that fails fast instead of hanging."""
    if not is_cluster_url(url):
        return None
    try:
        spec = parse_cluster_url(url)
    except RedisURLError as exc:
        return str(exc)
    problems: list[str] = []
    for host, port in spec.nodes:
        where = f"{host}:{port}"
        client = redis.Redis(host=host, port=port, username=spec.username, password=spec.password,
                             socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        try:
            info = client.execute_command("CLUSTER", "INFO")
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            problems.append(f"node {where} unreachable ({type(exc).__name__}: {exc})")
            continue
        except redis.ResponseError as exc:  # cluster support is disabled: not a cluster node
            problems.append(f"node {where} is not a cluster node ({exc})")
            continue
        finally:
            client.close()
        text = info.decode() if isinstance(info, bytes) else str(info)
        fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
        if fields.get("cluster_state") != "ok" or fields.get("cluster_slots_ok") != "16384":
            problems.append(f"node {where}: cluster_state {fields.get('cluster_state')}, "
                            f"{fields.get('cluster_slots_ok')} of 16384 slots served")
    if problems:
        return f"{spec.describe()}: {'; '.join(problems)}"
    return None


def queue_weights(pipe: Any, group: str, body: bytes, note: bytes) -> None:
    """Queue a group's weights document ``body`` and then its notification ``note`` on ``pipe`` (a
    MULTI, so a gateway never hears of a version before it can read it). On a cluster client every key
    and channel here is in the group's slot (one shard's MULTI) and the notification is a sharded
    ``SPUBLISH``: a plain ``PUBLISH`` would be copied to every node of the cluster. On a single Redis
    or Sentinel the legacy key and channel are written too, for one release (:mod:`contract.keys`)."""
    pipe.set(keys.weights(group), body)
    if is_cluster(pipe):
        pipe.spublish(keys.weights_channel(group), note)
    else:
        pipe.set(keys.legacy_weights(group), body)
        pipe.publish(keys.LEGACY_WEIGHTS_CHANNEL, note)
