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
  inference server are refused: unspecified, multicast, link-local (``169.254.169.254`` is the cloud
  metadata service, the classic SSRF target) and reserved addresses;
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
    """The URL segment of a group: its name with every run of ``/ . @`` replaced by ``-``
    (``meta-llama/Llama-3.1-70B-Instruct@h100`` -> ``meta-llama-Llama-3-1-70B-Instruct-h100``). A
    name without those characters is its own slug, so the URLs of groups named before ``/ . @`` were
    allowed do not change. Two names can share a slug (``a.b``, ``a-b``):
    :meth:`~outlier_admin.fleet.models.ModelGroup.save` numbers the later one (``a-b-2``)."""
    return _SLUG_UNSAFE.sub("-", name)[:GROUP_SLUG_MAX - 10]


def validate_node_id(node: object) -> str:
    """A node id: up to 200 of ``A-Z a-z 0-9 . _ : @ - [ ]`` (an id, never a URL)."""
    if not isinstance(node, str) or not NODE_ID_RE.fullmatch(node):
        raise NameError_(
            "bad_node", f"node id {_show(node)} must be 1-{NODE_ID_MAX} of letters, digits and . _ : @ - [ ]"
        )
    return node


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _valid_host(host: str) -> str:
    """A host as it appears in a URL (IPv6 without brackets), lower-cased; raises for hosts that are
    never an inference server."""
    if not host:
        raise NameError_("bad_address", "the address has no host")
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        name = host.lower().rstrip(".")
        labels = name.split(".")
        if len(name) > 253 or not all(_DNS_LABEL.fullmatch(label) for label in labels):
            raise NameError_("bad_address", f"host {_show(host)} is neither an IP address nor a DNS name") from None
        if labels[-1].isdigit():
            raise NameError_("bad_address", f"host {_show(host)} is not a valid IPv4 address") from None
        return name
    if ip.version == 6 and ip.ipv4_mapped is not None:
        # ::ffff:169.254.169.254 reaches the IPv4 host: judge (and store) it as that host.
        ip = ip.ipv4_mapped
    if ip.is_unspecified or ip.is_multicast or ip.is_link_local or (ip.is_reserved and not ip.is_loopback):
        raise NameError_("forbidden_address", f"host {ip} is unspecified, multicast, link-local or reserved")
    return ip.compressed


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
