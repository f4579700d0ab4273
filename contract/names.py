"""What a group name, a node id, a node address and a scrape URL may be: the one owner of these rules.

Everything that arrives in data (an ingest record, a log line) is untrusted, and some of it ends up in
places where it acts: a node's address becomes the URL the canary POSTs to, a group name becomes a
Redis key and a page URL, a node id becomes a label and a line on the dashboard. So:

- a **node id** (``Node.name``, the detector's id) is an identifier, nothing more: a short run of
  letters, digits and ``. _ : @ - [ ]`` (enough for ``10.0.0.5:8000``, ``[fd00::5]:8000``,
  ``gpu-node-03``, ``vllm-0@pool-a``), never a URL;
- a node **address** is ``host:port`` (or ``[v6]:port``), optionally with an ``http://`` or
  ``https://`` scheme, and nothing else: no user info, path, query or fragment, so the only URLs we
  build from it are ``<scheme>://<host>:<port>/v1/completions`` and the like. Hosts that are never an
  inference server are refused (:func:`check_ip`, the one owner of that rule): unspecified and
  "this network" (``0.0.0.0/8``: a connect to ``0.0.0.0`` reaches this very host), multicast,
  link-local (``169.254.169.254`` is the cloud metadata service, the classic SSRF target) and
  reserved addresses, also when wrapped in IPv6 (``::ffff:a.b.c.d``, 6to4 ``2002:abcd:...``).
  Loopback and private addresses are allowed: an inference server is on the operator's network,
  and the tests' servers are on 127.0.0.0/8;
- a host is read **as the resolver reads it**: ``socket.inet_aton`` (glibc's ``getaddrinfo``) takes
  ``0xa9fea9fe``, ``169.0xfea9fe``, ``0251.0376.0251.0376`` and ``127.1`` for IPv4 addresses, so any
  host it accepts is that address: judged by :func:`check_ip`, and refused even when allowed unless
  written as the dotted quad (``bad_address``: one spelling, so an allow-list or a log reads the
  address that is reached). A DNS name is checked again **when it is resolved**, each resolved
  address by :func:`check_ip` (:mod:`outlier_admin.fleet.netguard`: DNS rebinding);
- a **scrape URL** (``metrics_url``, ``dcgm_url``) is an ``http(s)`` URL with such a host, an optional
  port and path, and no user info, query or fragment;
- an **auto-register allow-list** entry is a CIDR (``127.0.0.0/8``, ``fd00::/8``) or a DNS suffix
  (``pool-a.svc.cluster.local``). A node that arrives in data is registered only when its id is an
  address whose host lies inside one of them (a DNS name is matched by suffix, never resolved: a
  resolved address could change between the check and the probe).

Every rule raises :class:`NameError_` with a short reason code (stored with rejected input) and a
sentence for a person.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

GROUP_NAME_MAX = 200
GROUP_SLUG_MAX = 220
NODE_ID_MAX = 200
ADDRESS_MAX = 300
URL_MAX = 300

# A Hugging Face model id (``meta-llama/Llama-3.1-70B-Instruct``) plus an optional ``@hardware``:
# a "/" only between two names (never first, last or doubled), so a name is never a path trick.
GROUP_NAME_RE = re.compile(r"[A-Za-z0-9](?:[-A-Za-z0-9_.@]|/(?=[A-Za-z0-9])){0,199}")  # fullmatch: "$" would let "g1\n" through
_SLUG_UNSAFE = re.compile(r"[^-A-Za-z0-9_]+")
NODE_ID_RE = re.compile(r"[A-Za-z0-9\[][A-Za-z0-9._:@\[\]-]{0,199}")
_DNS_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")
_URL_PATH = re.compile(r"[A-Za-z0-9._~!$&'()*+,;=:@/%-]*")
# What inet_aton may read as a number: decimal, octal (leading 0) and hex (0x) parts, 1 to 4 of them.
_NUMERIC_HOST = re.compile(r"[0-9A-Fa-fXx.]+")
# 0.0.0.0/8 is "this host on this network" (RFC 1122 3.2.1.3): never a destination, and Linux sends a
# connect to 0.0.0.0 to this very host. ``is_unspecified`` covers 0.0.0.0 alone.
_THIS_NETWORK = ipaddress.ip_network("0.0.0.0/8")
# A derived slug (of a name that is not a slug itself) starts with this, which no group name can.
DERIVED_SLUG_MARK = "_"


class NameError_(ValueError):
    """A name, address or URL was refused; ``reason`` is a short code, ``str()`` a sentence."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


def validate_group_name(name: object) -> str:
    """A group name: a Hugging Face model id with an optional ``@hardware`` suffix
    (``meta-llama/Llama-3.1-70B-Instruct@h100``, ``llama3-70b/h800``): letters, digits and
    ``- _ . @ /``, up to 200 characters, starting with a letter or digit, a ``/`` only between two
    names. It is a Redis key part and a metric label, never a URL segment (see :func:`group_slug`)."""
    if not isinstance(name, str) or ".." in name or not GROUP_NAME_RE.fullmatch(name):
        raise NameError_(
            "bad_group",
            f"group name {_show(name)} must be 1-{GROUP_NAME_MAX} of letters, digits and - _ . @ / "
            "(a model id such as meta-llama/Llama-3.1-70B-Instruct@h100), starting with a letter or digit",
        )
    return name


def group_slug(name: str) -> str:
    """The URL segment of a group (``ModelGroup.slug``, set once when the group is created).

    A name that is already a slug (letters, digits, ``-`` and ``_``: every name from before ``/ . @``
    were allowed) is its own slug. Any other name gets :data:`DERIVED_SLUG_MARK` (``_``) followed by
    the name with every run of ``/ . @`` replaced by ``-`` (``meta-llama/Llama-3.1-70B-Instruct@h100``
    -> ``_meta-llama-Llama-3-1-70B-Instruct-h100``). A group name never starts with ``_``
    (:data:`GROUP_NAME_RE`), so a derived slug can never be another group's name: ``a.b`` (``_a-b``)
    does not squat the slug of a group created later as ``a-b`` (``a-b``). Only derived slugs can
    collide (``a.b``, ``a@b``); :meth:`~outlier_admin.fleet.models.ModelGroup.save` numbers the later one
    (``_a-b-2``), still outside the names' space (:func:`unique_group_slug`)."""
    if _SLUG_UNSAFE.search(name) is None:
        return name[:GROUP_SLUG_MAX - 10]
    return (DERIVED_SLUG_MARK + _SLUG_UNSAFE.sub("-", name))[:GROUP_SLUG_MAX - 10]


def unique_group_slug(name: str, taken: set[str]) -> str:
    """:func:`group_slug` of ``name``, numbered (``-2``, ``-3``, ...) while it is in ``taken`` (the
    slugs of the existing groups that start with it). Only a derived slug can be taken, by another
    derived one, or a name's own slug by a group created before this rule (whose derived slug had no
    mark): then the name falls back to the marked form, so the numbered slug is outside the names'
    space too and no later group's name is squatted."""
    base = slug = group_slug(name)
    if slug in taken and not slug.startswith(DERIVED_SLUG_MARK):
        base = slug = (DERIVED_SLUG_MARK + slug)[:GROUP_SLUG_MAX - 10]
    n = 1
    while slug in taken:
        n += 1
        slug = f"{base}-{n}"
    return slug


def validate_node_id(node: object) -> str:
    """A node id: up to 200 of ``A-Z a-z 0-9 . _ : @ - [ ]`` (an id, never a URL)."""
    if not isinstance(node, str) or not NODE_ID_RE.fullmatch(node):
        raise NameError_(
            "bad_node", f"node id {_show(node)} must be 1-{NODE_ID_MAX} of letters, digits and . _ : @ - [ ]"
        )
    return node


def validate_new_node_name(node: object) -> str:
    """The name of a node being registered: a node id (:func:`validate_node_id`) that is not all digits.
    A URL's ``/nodes/<x>/`` reads a run of ASCII digits as a node's numeric id, always; a node *named*
    ``3`` would be a second meaning of ``/nodes/3/`` (an override meant for it would land on node id 3,
    in whatever group). Nodes registered before this rule keep their names and are reached within their
    group (``/api/v1/groups/<group>/nodes/3/``)."""
    node = validate_node_id(node)
    if node.isascii() and node.isdigit():
        raise NameError_("numeric_node_name", f"node name {_show(node)} is all digits, which the API reads as a "
                         "node's numeric id: give it a name with a letter or a separator (e.g. node-3)")
    return node


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def check_ip(ip: IPAddress | str) -> IPAddress:
    """The address a connection to ``ip`` reaches, or :class:`NameError_` (``forbidden_address``)
    when it is never an inference server: unspecified or ``0.0.0.0/8``, multicast, link-local, or
    reserved (loopback aside: ``::1`` is in IPv6's reserved ``::/8``). An IPv4-mapped IPv6 address is
    judged (and returned) as its IPv4 host; a 6to4 one (``2002::/16``) is judged by the IPv4 host its
    relay reaches too. The one owner of this rule: URL and address validation (:func:`check_host`) and
    the resolver of every scrape and probe (:mod:`outlier_admin.fleet.netguard`) call it."""
    if isinstance(ip, str):
        ip = ipaddress.ip_address(ip)  # ValueError for a string that is no address
    if ip.version == 6 and ip.ipv4_mapped is not None:
        # ::ffff:169.254.169.254 reaches the IPv4 host: judge (and store) it as that host.
        ip = ip.ipv4_mapped
    judged = [ip]
    if ip.version == 6 and ip.sixtofour is not None:
        judged.append(ip.sixtofour)
    for one in judged:
        if (one.is_unspecified or one.is_multicast or one.is_link_local or (one.is_reserved and not one.is_loopback)
                or (one.version == 4 and one in _THIS_NETWORK)):
            shown = str(ip) if one is ip else f"{ip} (IPv4 {one})"
            raise NameError_("forbidden_address",
                             f"host {shown} is unspecified, multicast, link-local or reserved")
    return ip


def legacy_ipv4(host: str) -> ipaddress.IPv4Address | None:
    """The IPv4 address the C resolver reads in ``host`` when it is not a dotted quad
    (``inet_aton``: ``0x7f000001``, ``127.1``, ``169.0xfea9fe``, ``0251.0376.0251.0376``), else None.
    A trailing dot is ignored, as the resolver's own lookup may."""
    text = host.rstrip(".")
    if not text or not _NUMERIC_HOST.fullmatch(text):
        return None  # inet_aton also stops at whitespace: only a whole numeric host counts
    try:
        packed = socket.inet_aton(text)
    except OSError:
        return None
    return ipaddress.IPv4Address(packed)


def check_host(host: str) -> str:
    """A host as it appears in a URL (IPv6 without brackets), lower-cased, an IP in its compressed
    form; raises :class:`NameError_` for hosts that are never an inference server
    (``forbidden_address``, :func:`check_ip`) or not a host (``bad_address``), an IPv4 address in
    another spelling than the dotted quad included (:func:`legacy_ipv4`)."""
    if not host:
        raise NameError_("bad_address", "the address has no host")
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        legacy = legacy_ipv4(host)
        if legacy is not None:
            try:
                check_ip(legacy)
            except NameError_ as exc:
                raise NameError_("forbidden_address", f"host {_show(host)} is {legacy}: {exc.detail}") from None
            raise NameError_("bad_address", f"host {_show(host)} is the IPv4 address {legacy} in a hex, octal or "
                                            f"short form: write it as {legacy}") from None
        name = host.lower().rstrip(".")
        labels = name.split(".")
        if len(name) > 253 or not all(_DNS_LABEL.fullmatch(label) for label in labels):
            raise NameError_("bad_address", f"host {_show(host)} is neither an IP address nor a DNS name") from None
        if labels[-1].isdigit():
            raise NameError_("bad_address", f"host {_show(host)} is not a valid IPv4 address") from None
        return name
    return check_ip(ip).compressed


_valid_host = check_host  # the name the module's callers knew it by


@dataclass(frozen=True)
class Address:
    """A node's address: where the canary and the gateways reach its OpenAI-compatible server."""

    scheme: str  # "http" or "https"
    host: str  # IP (IPv6 without brackets) or DNS name
    port: int

    @property
    def url_host(self) -> str:
        return f"[{self.host}]" if ":" in self.host else self.host

    @property
    def hostport(self) -> str:
        """``host:port`` / ``[v6]:port``: what a gateway's server line takes."""
        return f"{self.url_host}:{self.port}"

    @property
    def base_url(self) -> str:
        """``scheme://host:port``: the only base from which we build a request URL."""
        return f"{self.scheme}://{self.hostport}"

    def ip(self) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
        try:
            return ipaddress.ip_address(self.host)
        except ValueError:
            return None


def parse_address(text: object) -> Address:
    """``host:port``, ``[v6]:port`` or ``http(s)://host:port`` (a trailing ``/`` is allowed) ->
    :class:`Address`; raises :class:`NameError_` (``bad_address`` / ``forbidden_address``)."""
    if not isinstance(text, str) or not text or len(text) > ADDRESS_MAX or not text.isprintable() or " " in text:
        raise NameError_("bad_address", f"address {_show(text)} must be host:port or http(s)://host:port")
    scheme = "http"
    rest = text
    if "://" in text:
        scheme, _, rest = text.partition("://")
        scheme = scheme.lower()
        if scheme not in ("http", "https"):
            raise NameError_("bad_address", f"address scheme {scheme!r} must be http or https")
        if rest.endswith("/"):
            rest = rest[:-1]
    if any(c in rest for c in "/?#@\\"):
        raise NameError_(
            "bad_address", f"address {_show(text)} must be host:port only (no path, query, fragment or user)"
        )
    if rest.startswith("["):
        host, sep, port_text = rest[1:].partition("]:")
        if not sep:
            raise NameError_("bad_address", f"address {_show(text)}: an IPv6 address is written [v6]:port")
        try:
            if ipaddress.ip_address(host).version != 6:
                raise ValueError
        except ValueError:
            raise NameError_("bad_address", f"[{host}] is not an IPv6 address") from None
    else:
        host, sep, port_text = rest.rpartition(":")
        if not sep or ":" in host:
            raise NameError_("bad_address", f"address {_show(text)} must be host:port (IPv6 as [v6]:port)")
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise NameError_("bad_address", f"port {_show(port_text)} must be 1-65535")
    return Address(scheme=scheme, host=_valid_host(host), port=int(port_text))


def address_key(node_id: str) -> str:
    """The one spelling of an address as a node id: ``parse_address(node_id).hostport`` (host
    lower-cased without a trailing dot, an IPv4-mapped IPv6 host as IPv4, IPv6 compressed, the port
    without leading zeros), so that ``127.0.0.1:018950``, ``[::ffff:127.0.0.1]:18950`` and
    ``127.0.0.1:18950`` are one node, not three; ``node_id`` itself when it is not an address."""
    try:
        return parse_address(node_id).hostport
    except NameError_:
        return node_id


def validate_scrape_url(text: str) -> str:
    """An operator's ``metrics_url`` / ``dcgm_url``: ``http(s)://host[:port][/path]``; ``""`` = not
    scraped. Returns the URL unchanged; raises :class:`NameError_` (``bad_url``)."""
    if text == "":
        return text
    if not isinstance(text, str) or len(text) > URL_MAX or not text.isprintable() or " " in text:
        raise NameError_("bad_url", f"URL {_show(text)} must be an http(s) URL of at most {URL_MAX} characters")
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as exc:
        raise NameError_("bad_url", f"URL {_show(text)}: {exc}") from None
    if parts.scheme not in ("http", "https"):
        raise NameError_("bad_url", f"URL {_show(text)} must start with http:// or https://")
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        raise NameError_("bad_url", f"URL {_show(text)} must not carry user info")
    if parts.query or parts.fragment or "?" in text or "#" in text:
        raise NameError_("bad_url", f"URL {_show(text)} must not carry a query or a fragment")
    if not _URL_PATH.fullmatch(parts.path):
        raise NameError_("bad_url", f"URL {_show(text)} has characters not allowed in a path")
    if port == 0:
        raise NameError_("bad_url", f"URL {_show(text)}: port must be 1-65535")
    try:
        _valid_host(parts.hostname or "")
    except NameError_ as exc:
        raise NameError_("bad_url", f"URL {_show(text)}: {exc.detail}") from None
    return text


def validate_allow_entry(entry: object) -> str:
    """One auto-register allow-list entry: a CIDR or a DNS suffix; returns it normalised."""
    if not isinstance(entry, str) or not entry.strip():
        raise NameError_("bad_allow_entry", "an auto-register entry is a CIDR or a DNS suffix")
    text = entry.strip().lower()
    if "/" in text or text.replace(".", "").isdigit() or ":" in text:
        try:
            return ipaddress.ip_network(text, strict=False).compressed
        except ValueError:
            raise NameError_("bad_allow_entry", f"{_show(entry)} is not a CIDR (e.g. 127.0.0.0/8)") from None
    suffix = text.lstrip(".")
    try:
        _valid_host(suffix)
    except NameError_:
        raise NameError_("bad_allow_entry", f"{_show(entry)} is neither a CIDR nor a DNS suffix") from None
    if "." not in suffix and suffix != "localhost":
        # A one-label suffix (``com``, ``local``) would admit a whole namespace.
        raise NameError_("bad_allow_entry", f"DNS suffix {_show(entry)} needs at least two labels")
    return suffix


def host_allowed(address: Address, allow: list[str]) -> bool:
    """Whether ``address``'s host lies inside one of the (normalised) allow-list entries."""
    ip = address.ip()
    for entry in allow:
        if "/" in entry:
            net = ipaddress.ip_network(entry)
            if ip is not None and ip.version == net.version and ip in net:
                return True
        elif ip is None and (address.host == entry or address.host.endswith("." + entry)):
            return True
    return False
