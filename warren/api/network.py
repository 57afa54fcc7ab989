"""E2B's ``SandboxNetworkConfig`` / ``SandboxNetworkUpdateConfig`` wire shapes <-> :class:`EgressPolicy`.

What is parsed here: ``allowOut`` (IPs, CIDRs, domains, ``*.`` wildcards), ``denyOut`` (IPs and CIDRs only),
``rules`` (per-host ``transform.headers``), ``dnsServers``, ``egressProxy`` (a SOCKS5 upstream, optionally
over TLS) and ``allow_internet_access`` of the update. ``allowPublicTraffic``, ``maskRequestHost`` and
``httpsPorts`` concern inbound traffic and are read elsewhere.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any

from ..errors import InvalidRequestError
from ..store import EgressPolicy, HostRule, UpstreamProxy

ALL_TRAFFIC = "0.0.0.0/0"
MAX_ENTRIES = 1000
"""Entries per list (allowOut, denyOut, rules): beyond it, 400."""
MAX_DNS_SERVERS = 10
MAX_HEADERS = 64
MAX_HEADER_BYTES = 8192

_LABEL = re.compile(r"^(?!-)[a-z0-9_-]{1,63}(?<!-)$")
_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")


def _domain(text: str, what: str) -> str | None:
    """``text`` as a lowercase domain or ``*.`` wildcard, or None when it is not one."""
    name = text.strip().lower().rstrip(".")
    body = name[2:] if name.startswith("*.") else name
    labels = body.split(".")
    if not body or len(body) > 253 or not all(_LABEL.match(label) for label in labels):
        return None
    if all(label.isdigit() for label in labels):
        raise InvalidRequestError(f"{what}: {text!r} is neither an IPv4 address nor a domain")
    return name


def _cidr(text: str) -> str | None:
    try:
        net = ipaddress.ip_network(text.strip(), strict=False)
    except ValueError:
        return None
    if net.version != 4:
        raise InvalidRequestError(f"{text!r}: only IPv4 addresses and CIDRs are supported (sandboxes have no IPv6)")
    return str(net)


def _strings(body: dict[str, Any], key: str) -> list[str]:
    value = body.get(key)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InvalidRequestError(f"network.{key} must be an array of strings")
    if len(value) > MAX_ENTRIES:
        raise InvalidRequestError(f"network.{key} has more than {MAX_ENTRIES} entries")
    return value


def _allow(entries: list[str]) -> tuple[str, ...]:
    out: list[str] = []
    for entry in entries:
        if entry.strip() == "*":
            raise InvalidRequestError("network.allowOut: a bare '*' is not valid; use 0.0.0.0/0")
        value = _cidr(entry) or _domain(entry, "network.allowOut")
        if value is None:
            raise InvalidRequestError(f"network.allowOut: {entry!r} is not an IP address, CIDR block or domain")
        out.append(value)
    return tuple(dict.fromkeys(out))


def _deny(entries: list[str]) -> tuple[str, ...]:
    out: list[str] = []
    for entry in entries:
        value = _cidr(entry)
        if value is None:
            raise InvalidRequestError(
                f"network.denyOut: {entry!r} is not an IP address or CIDR block"
                " (domains are not supported for deny rules)"
            )
        out.append(value)
    return tuple(dict.fromkeys(out))


def _headers(host: str, rules: object) -> tuple[tuple[str, str], ...]:
    if not isinstance(rules, list):
        raise InvalidRequestError(f"network.rules[{host!r}] must be an array of rules")
    merged: dict[str, tuple[str, str]] = {}
    for rule in rules:
        transform = rule.get("transform") if isinstance(rule, dict) else None
        if transform is None:
            if not isinstance(rule, dict):
                raise InvalidRequestError(f"network.rules[{host!r}]: each rule must be an object")
            continue
        headers = transform.get("headers") if isinstance(transform, dict) else None
        if headers is None:
            continue
        if not isinstance(headers, dict) or not all(isinstance(v, str) for v in headers.values()):
            raise InvalidRequestError(f"network.rules[{host!r}].transform.headers must be an object of strings")
        for name, value in headers.items():
            if not _TOKEN.match(name):
                raise InvalidRequestError(f"network.rules[{host!r}]: {name!r} is not a valid header name")
            if any(c in value for c in "\r\n\0"):
                raise InvalidRequestError(f"network.rules[{host!r}]: the value of {name} has a line break")
            merged[name.lower()] = (name, value)
    out = tuple(merged.values())
    if len(out) > MAX_HEADERS or sum(len(n) + len(v) for n, v in out) > MAX_HEADER_BYTES:
        raise InvalidRequestError(f"network.rules[{host!r}]: too many or too large headers")
    return out


def _rules(value: object) -> tuple[HostRule, ...]:
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise InvalidRequestError("network.rules must be an object of host -> rules")
    if len(value) > MAX_ENTRIES:
        raise InvalidRequestError(f"network.rules has more than {MAX_ENTRIES} hosts")
    out: dict[str, HostRule] = {}
    for host, rules in value.items():
        name = _domain(host, "network.rules") if isinstance(host, str) and host.strip() != "*" else None
        if name is None:
            raise InvalidRequestError(f"network.rules: {host!r} is not a domain or '*.' wildcard")
        out[name] = HostRule(name, _headers(name, rules))
    return tuple(out.values())


def _short(value: object, what: str, limit: int) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or len(value.encode()) > limit:
        raise InvalidRequestError(f"network.egressProxy.{what} must be a string of at most {limit} bytes")
    return value


def _upstream(value: object) -> UpstreamProxy | None:
    """``egressProxy``: ``{address: "host:port", username?, password?, tls?: bool | {enabled, serverName?,
    caCert?}}``. Where the host resolves is checked at every dial (a blocked range fails closed)."""
    if value is None:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("address"), str):
        raise InvalidRequestError("network.egressProxy must be an object with a string address (host:port)")
    address = value["address"].strip()
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536 or not host:
        raise InvalidRequestError(f"network.egressProxy.address {address!r} must be host:port")
    if _cidr(host) is None and _domain(host, "network.egressProxy.address") is None:
        raise InvalidRequestError(f"network.egressProxy.address {address!r}: bad host")
    username = _short(value.get("username"), "username", 255)
    password = _short(value.get("password"), "password", 255)
    if password is not None and username is None:
        raise InvalidRequestError("network.egressProxy.password needs a username")
    tls, server_name, ca_cert = value.get("tls"), None, None
    if isinstance(tls, dict):
        server_name = _short(tls.get("serverName"), "tls.serverName", 253)
        ca_cert = _short(tls.get("caCert"), "tls.caCert", 8192)
        tls = tls.get("enabled", True)
    if tls is not None and not isinstance(tls, bool):
        raise InvalidRequestError("network.egressProxy.tls must be a boolean or an object")
    return UpstreamProxy(address=address, username=username, password=password, tls=bool(tls),
                         server_name=server_name, ca_cert=ca_cert)


def _dns(value: object) -> tuple[str, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InvalidRequestError("network.dnsServers must be an array of IPv4 addresses")
    if len(value) > MAX_DNS_SERVERS:
        raise InvalidRequestError(f"network.dnsServers has more than {MAX_DNS_SERVERS} entries")
    out = []
    for entry in value:
        try:
            out.append(str(ipaddress.IPv4Address(entry.strip())))
        except ValueError:
            raise InvalidRequestError(f"network.dnsServers: {entry!r} is not an IPv4 address") from None
    return tuple(out)


def parse_egress(network: object, *, allow_internet: bool = True) -> EgressPolicy:
    """The policy of a create's ``network`` object (or an update body). ``allow_internet=False`` adds
    ``0.0.0.0/0`` to the denied ranges (E2B: the same as ``denyOut: ["0.0.0.0/0"]``)."""
    if network is None:
        network = {}
    if not isinstance(network, dict):
        raise InvalidRequestError("network must be an object")
    deny = _deny(_strings(network, "denyOut"))
    if not allow_internet and ALL_TRAFFIC not in deny:
        deny = (*deny, ALL_TRAFFIC)
    return EgressPolicy(
        allow_out=_allow(_strings(network, "allowOut")),
        deny_out=deny,
        rules=_rules(network.get("rules")),
        dns_servers=_dns(network.get("dnsServers")),
        upstream=_upstream(network.get("egressProxy")),
    )


def parse_update(body: dict[str, Any]) -> EgressPolicy:
    """``PUT /sandboxes/{id}/network``: replaces the whole policy; omitted fields are cleared."""
    allow = body.get("allow_internet_access", body.get("allowInternetAccess", True))
    if not isinstance(allow, bool):
        raise InvalidRequestError("allow_internet_access must be a boolean")
    return parse_egress(body, allow_internet=allow)


def egress_body(egress: EgressPolicy) -> dict[str, Any]:
    """What ``SandboxDetail.network`` shows of the policy besides ``allowOut``/``denyOut`` (those are
    shown as sent, from the record's ``requested``): rules, DNS servers, the upstream proxy."""
    out: dict[str, Any] = {}
    if egress.rules:
        out["rules"] = {r.host: [{"transform": {"headers": dict(r.headers)}}] for r in egress.rules}
    if egress.dns_servers is not None:
        out["dnsServers"] = list(egress.dns_servers)
    if (up := egress.upstream) is not None:  # never the password nor the CA, as E2B
        proxy: dict[str, Any] = {"address": up.address}
        if up.username is not None:
            proxy["username"] = up.username
        if up.tls:
            proxy["tls"] = {"serverName": up.server_name} if up.server_name else {}
        out["egressProxy"] = proxy
    return out
