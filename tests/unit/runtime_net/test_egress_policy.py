"""The egress policy as the proxy sees it: names from first bytes, allow beats deny, header rules."""

from __future__ import annotations

import socket
import ssl
import struct

import pytest

from warren.api.network import egress_body, parse_egress, parse_update
from warren.errors import InvalidRequestError
from warren.runtime.net.dns import parse_a_records, query_packet
from warren.runtime.net.egress_policy import compile_egress
from warren.runtime.net.egress_proxy import rewrite_head
from warren.runtime.net.sniff import Kind, sniff
from warren.store import EgressPolicy, HostRule, UpstreamProxy


def _client_hello(name: str) -> bytes:
    """A real ClientHello from Python's ssl, with ``name`` as its SNI."""
    ctx = ssl.create_default_context()
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(incoming, outgoing, server_hostname=name)
    with pytest.raises(ssl.SSLWantReadError):
        obj.do_handshake()
    return outgoing.read()


def test_sni_and_host_are_read_and_partial_input_waits() -> None:
    hello = _client_hello("API.Example.test")
    assert sniff(hello) == (True, Kind.TLS, "api.example.test")
    assert sniff(hello[:40])[0] is False
    head = b"GET /x HTTP/1.1\r\nUser-Agent: t\r\nHost: Allowed.test:8080\r\n\r\n"
    assert sniff(head) == (True, Kind.HTTP, "allowed.test")
    assert sniff(head[:20]) == (False, Kind.HTTP, None)
    assert sniff(b"GE")[0] is False
    assert sniff(b"SSH-2.0-OpenSSH\r\n") == (True, Kind.OTHER, None)
    assert sniff(b"\x16\x03\x01\xff\xff" + b"\x01" * 20000)[0] is True  # too long: judged without a name


def test_allow_beats_deny_and_wildcards_skip_the_apex() -> None:
    p = compile_egress(EgressPolicy(allow_out=("203.0.113.10/32", "*.example.test", "allowed.test"),
                                    deny_out=("0.0.0.0/0",)))
    assert p.allows("203.0.113.10", None)
    assert not p.allows("203.0.113.11", None)
    assert p.allows("203.0.113.11", "allowed.test") and p.allows("203.0.113.11", "a.b.example.test")
    assert not p.allows("203.0.113.11", "example.test") and not p.allows("203.0.113.11", "sub.allowed.test")
    assert p.proxied and "8.8.8.8/32" in [str(n) for n in p.ip_allow]  # E2B's default DNS is opened
    open_policy = compile_egress(EgressPolicy(allow_out=("x.test",)))
    assert not open_policy.enforced and open_policy.allows("1.2.3.4", None)


def test_exact_rule_wins_then_longest_wildcard() -> None:
    p = compile_egress(EgressPolicy(rules=(
        HostRule("*.example.test", (("A", "wide"),)), HostRule("*.api.example.test", (("A", "narrow"),)),
        HostRule("x.api.example.test", (("A", "exact"),)),
    )))
    assert p.headers_for("x.api.example.test") == (("A", "exact"),)
    assert p.headers_for("y.api.example.test") == (("A", "narrow"),)
    assert p.headers_for("z.example.test") == (("A", "wide"),)
    assert p.headers_for("example.test") is None and p.headers_for(None) is None


def test_head_rewrite_replaces_headers_and_closes() -> None:
    head = b"GET / HTTP/1.1\r\nHost: a\r\nauthorization: mine\r\nConnection: keep-alive\r\n\r\n"
    out = rewrite_head(head, [("Authorization", "Bearer s")])
    assert out == b"GET / HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer s\r\nConnection: close\r\n\r\n"


def test_wire_shapes_parse_and_bad_input_is_400() -> None:
    body = {"allowOut": ["203.0.113.7", "*.Example.TEST", "10.0.0.0/8"], "denyOut": ["0.0.0.0/0"],
            "rules": {"API.test": [{"transform": {"headers": {"Authorization": "Bearer s"}}}]},
            "dnsServers": ["1.1.1.1"], "allowPublicTraffic": False, "maskRequestHost": "${PORT}-x.test"}
    p = parse_egress(body)
    assert p.allow_out == ("203.0.113.7/32", "*.example.test", "10.0.0.0/8") and p.deny_out == ("0.0.0.0/0",)
    assert p.rules == (HostRule("api.test", (("Authorization", "Bearer s"),)),) and p.dns_servers == ("1.1.1.1",)
    assert egress_body(p)["rules"] == {"api.test": [{"transform": {"headers": {"Authorization": "Bearer s"}}}]}
    assert parse_update({"allow_internet_access": False}).deny_out == ("0.0.0.0/0",)
    assert parse_egress(None) == EgressPolicy()
    up = parse_egress({"egressProxy": {"address": "p.test:1080", "username": "u", "password": "pw",
                                       "tls": {"enabled": True, "serverName": "s.test", "caCert": "PEM"}}})
    assert up.upstream == UpstreamProxy("p.test:1080", "u", "pw", True, "s.test", "PEM") and not up.is_open
    assert egress_body(up)["egressProxy"] == {"address": "p.test:1080", "username": "u",
                                               "tls": {"serverName": "s.test"}}
    for bad in ({"denyOut": ["example.com"]}, {"allowOut": ["*"]}, {"allowOut": ["not a name!"]},
                {"allowOut": "1.1.1.1"}, {"allowOut": ["::1"]}, {"rules": {"*": []}},
                {"rules": {"a.test": [{"transform": {"headers": {"Bad Name": "x"}}}]}},
                {"rules": {"a.test": [{"transform": {"headers": {"X": "a\r\nB: c"}}}]}},
                {"dnsServers": ["dns.test"]}, {"egressProxy": {"address": "p.test"}},
                {"egressProxy": {"address": "p.test:1080", "password": "x"}},
                {"egressProxy": {"address": "p.test:99999"}}, {"egressProxy": {"address": "p.test:1", "tls": "yes"}}):
        with pytest.raises(InvalidRequestError):
            parse_egress(bad)


def _answer(qid: int, name: str, addresses: list[str], rcode: int = 0) -> bytes:
    q = query_packet(qid, name)[12:]
    out = struct.pack("!HHHHHH", qid, 0x8180 | rcode, 1, len(addresses) + 1, 0, 0) + q
    out += b"\xc0\x0c" + struct.pack("!HHIH", 5, 1, 60, 2) + b"\xc0\x0c"  # a CNAME, skipped
    for a in addresses:
        out += b"\xc0\x0c" + struct.pack("!HHIH", 1, 1, 30, 4) + socket.inet_aton(a)
    return out


def test_dns_answers_are_parsed_and_bad_ones_refused() -> None:
    assert parse_a_records(_answer(7, "a.test", ["203.0.113.1", "203.0.113.2"]), 7) == (
        ["203.0.113.1", "203.0.113.2"], 30)
    assert parse_a_records(_answer(7, "a.test", [], rcode=3), 7) == ([], 0)
    for bad, qid in ((_answer(7, "a.test", ["1.2.3.4"]), 8), (b"\x00" * 5, 7),
                     (_answer(7, "a.test", ["1.2.3.4"])[:-8], 7), (query_packet(7, "a.test"), 7)):
        with pytest.raises(ValueError):
            parse_a_records(bad, qid)
    loop_ptr = struct.pack("!HHHHHH", 7, 0x8180, 1, 0, 0, 0) + b"\x01a" * 200 + b"\x00"
    with pytest.raises(ValueError):
        parse_a_records(loop_ptr, 7)
