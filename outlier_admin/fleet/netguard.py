"""Where a scrape or a probe may connect, checked when it connects (DNS rebinding, resolver spellings).

:func:`contract.names.validate_scrape_url` and ``parse_address`` judge the host as it is
written. A DNS name is only a promise: it may resolve to ``169.254.169.254`` (the cloud metadata
service) or ``0.0.0.0`` (this very host) at the moment of the request, and differently at each
request (DNS rebinding). So every outgoing connection of the control plane to a node resolves the
name itself and judges **every** address it gets with the same rule,
:func:`contract.names.check_ip` (one owner): a name with one forbidden address is refused
whole (an attacker who controls a zone can mix addresses), and the connection goes to an address that
was checked, never to a second resolution of the name.

- aiohttp (the model-server scraper, the DCGM scrape): :func:`guarded_connector` builds a
  ``TCPConnector`` with :class:`GuardedResolver` (wrapping aiohttp's ``DefaultResolver``) and a socket
  factory that checks the address each socket connects to (an IP literal never reaches a resolver).
- httpx (the canary): :func:`guarded_transport` builds an ``HTTPTransport`` whose network backend
  (:class:`GuardedBackend`) resolves, checks and connects to the checked address.

A refusal is :class:`ForbiddenAddress`, an ``OSError`` (so each client reports it as a connection
failure of that request only); :func:`forbidden_cause` finds it in a client's wrapped exception.
"""

from __future__ import annotations

import errno
import socket
import typing
from typing import Any

import aiohttp
import httpcore
import httpx
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver

from contract.names import NameError_, check_host, check_ip


class ForbiddenAddress(OSError):
    """A connection refused before it was made: the host, or an address it resolved to, is never
    an inference server (``reason`` as :class:`~contract.names.NameError_`'s)."""

    def __init__(self, reason: str, detail: str) -> None:
        # (errno, strerror): aiohttp shows the strerror in its connection error's message.
        super().__init__(errno.EACCES, f"forbidden address: {detail}")
        self.reason = reason
        self.detail = detail


def _refuse(exc: NameError_) -> ForbiddenAddress:
    return ForbiddenAddress(exc.reason, exc.detail)


def check_resolved(host: str, addresses: typing.Iterable[str]) -> None:
    """Raise :class:`ForbiddenAddress` when any of the ``addresses`` ``host`` resolved to is
    forbidden (:func:`~contract.names.check_ip`) or when it resolved to none."""
    seen = False
    for address in addresses:
        seen = True
        try:
            check_ip(address)
        except (NameError_, ValueError) as exc:
            detail = exc.detail if isinstance(exc, NameError_) else f"{address!r} is no IP address"
            raise ForbiddenAddress("forbidden_address", f"{host} resolves to {address}: {detail}") from None
    if not seen:
        raise ForbiddenAddress("bad_address", f"{host} resolves to no address")


def check_name(host: str) -> str:
    """``host`` judged as written (:func:`~contract.names.check_host`: hex, octal and
    short IPv4 spellings included); :class:`ForbiddenAddress` when refused."""
    try:
        return check_host(host)
    except NameError_ as exc:
        raise _refuse(exc) from None


class GuardedResolver(AbstractResolver):
    """aiohttp resolver: the name judged as written, resolved by the wrapped resolver (aiohttp's
    ``DefaultResolver`` unless given), and every address it returns judged (:func:`check_resolved`)."""

    def __init__(self, inner: AbstractResolver | None = None) -> None:
        self._inner = inner if inner is not None else DefaultResolver()

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        check_name(host)
        results = await self._inner.resolve(host, port, family)
        check_resolved(host, (r["host"] for r in results))
        return results

    async def close(self) -> None:
        await self._inner.close()


def guarded_socket(addr_info: tuple[Any, ...]) -> socket.socket:
    """aiohttp's ``socket_factory``: the socket of one connection attempt, after its address is
    judged (an IP literal in a URL is connected to without a resolver; this sees it too)."""
    family, type_, proto, _, sockaddr = addr_info
    try:
        check_ip(str(sockaddr[0]).split("%", 1)[0])
    except NameError_ as exc:
        raise _refuse(exc) from None
    return socket.socket(family=family, type=type_, proto=proto)


def guarded_connector(**kwargs: Any) -> aiohttp.TCPConnector:
    """``aiohttp.TCPConnector(**kwargs)`` that connects only to allowed addresses (see module
    docstring); call it inside the event loop, as the connector itself."""
    if "resolver" in kwargs or "socket_factory" in kwargs:
        raise TypeError("guarded_connector sets the resolver and the socket factory itself")
    return aiohttp.TCPConnector(resolver=GuardedResolver(), socket_factory=guarded_socket, **kwargs)


class GuardedBackend(httpcore.NetworkBackend):
    """httpcore network backend: resolves the host itself, judges every address, then connects to
    the first checked address that answers (TLS still names the host: httpcore sends the URL's host
    as SNI and checks the certificate against it)."""

    def __init__(self, inner: httpcore.NetworkBackend | None = None) -> None:
        self._inner = inner if inner is not None else httpcore.SyncBackend()

    def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                    socket_options: typing.Iterable[Any] | None = None) -> httpcore.NetworkStream:
        name = host.strip("[]")
        try:
            check_name(name)
            infos = socket.getaddrinfo(name, port, type=socket.SOCK_STREAM)
            addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
            check_resolved(name, addresses)
        except OSError as exc:  # httpx reports httpcore's errors (ConnectError), never a bare OSError
            raise httpcore.ConnectError(f"{host}: {exc}") from exc
        last: Exception | None = None
        for address in addresses:
            try:
                return self._inner.connect_tcp(address, port, timeout=timeout, local_address=local_address,
                                               socket_options=socket_options)
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                last = exc
        assert last is not None
        raise last

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options: typing.Iterable[Any] | None = None) -> httpcore.NetworkStream:
        raise httpcore.ConnectError("a node is reached over TCP, never a Unix socket") from ForbiddenAddress(
            "bad_address", f"Unix socket {path!r}")

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


def guarded_transport(**kwargs: Any) -> httpx.HTTPTransport:
    """``httpx.HTTPTransport(**kwargs)`` that connects only to allowed addresses (no proxy: a proxy
    would resolve the name itself, out of reach of the check)."""
    if kwargs.get("proxy") is not None or kwargs.get("uds") is not None:
        raise TypeError("a guarded transport connects directly over TCP (no proxy, no Unix socket)")
    transport = httpx.HTTPTransport(**kwargs)
    pool = transport._pool  # httpx passes no network backend through; its pool takes one
    if not isinstance(pool, httpcore.ConnectionPool):
        raise TypeError(f"unexpected httpx pool {type(pool).__name__}")
    pool._network_backend = GuardedBackend(pool._network_backend)
    return transport


def forbidden_cause(exc: BaseException | None) -> ForbiddenAddress | None:
    """The :class:`ForbiddenAddress` behind ``exc`` (a client's wrapped exception, through its
    cause, context and ``os_error``), or None."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, ForbiddenAddress):
            return exc
        inner = getattr(exc, "os_error", None)
        if isinstance(inner, ForbiddenAddress):
            return inner
        exc = exc.__cause__ or exc.__context__
    return None
