"""A small "internet" for egress tests, in a network namespace of its own.

    netns wegr-inet  eth0 198.18.0.2/30 <-> host veth wegr0 198.18.0.1/30, host route 203.0.113.0/24 via it
    203.0.113.10  allowed.test, api.allowed.test      203.0.113.11  other.test
    203.0.113.12  *.example.test (and example.test)   203.0.113.53  dnsmasq answering those names

A SOCKS5 server on 203.0.113.20:1080 (user ``u``, password ``p``) logs each CONNECT target to
``socks.log``. One echo server answers on every address, HTTP on 80 and 8080, HTTPS on 443 (a certificate for all the
names from a test CA): a JSON object with the Host, the request headers and the address it was reached on;
``/bytes/N`` answers N bytes (the egress benchmark's bulk transfer).
Nothing on the host's resolver is touched; everything is removed at the end (the leak check looks).
"""

from __future__ import annotations

import contextlib
import datetime
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

NETNS = "wegr-inet"
HOST_IF = "wegr0"
DNS_IP = "203.0.113.53"
ADDRS = {"allowed": "203.0.113.10", "other": "203.0.113.11", "example": "203.0.113.12"}
NAMES = ["allowed.test", "api.allowed.test", "other.test", "example.test", "*.example.test"]

SERVER = r'''
import http.server, json, socketserver, ssl, sys, threading
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    def _answer(self):
        if self.path.startswith("/bytes/"):
            size = min(int(self.path[7:]), 1 << 30)
            self.send_response(200)
            self.send_header("Content-Length", str(size))
            self.end_headers()
            block = b"x" * 65536
            while size > 0:
                self.wfile.write(block[:size])
                size -= 65536
            return
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        out = json.dumps({"host": self.headers.get("Host"), "headers": dict(self.headers.items()),
                          "local": self.connection.getsockname()[0], "path": self.path,
                          "body": len(body)}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)
    do_GET = do_POST = _answer
    def log_message(self, *a): pass
class S(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 512
servers = [S(("0.0.0.0", 80), H), S(("0.0.0.0", 8080), H), S(("0.0.0.0", 443), H)]
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(sys.argv[1], sys.argv[2])
servers[2].socket = ctx.wrap_socket(servers[2].socket, server_side=True)
for s in servers[:-1]:
    threading.Thread(target=s.serve_forever, daemon=True).start()
print("ready", flush=True)
servers[-1].serve_forever()
'''


SOCKS = r'''
import asyncio, socket, sys
NAMES = {"allowed.test": "203.0.113.10", "other.test": "203.0.113.11"}
log = open(sys.argv[1], "a", buffering=1)
async def pipe(r, w):
    try:
        while data := await r.read(65536):
            w.write(data)
            await w.drain()
    finally:
        w.close()
async def serve(r, w):
    try:
        _, n = await r.readexactly(2)
        methods = await r.readexactly(n)
        if 2 not in methods:
            w.write(b"\x05\xff"); return
        w.write(b"\x05\x02")
        _, ulen = await r.readexactly(2); user = await r.readexactly(ulen)
        plen = (await r.readexactly(1))[0]; password = await r.readexactly(plen)
        if (user, password) != (b"u", b"p"):
            log.write("auth-failed\n"); w.write(b"\x01\x01"); return
        w.write(b"\x01\x00")
        _, cmd, _, atyp = await r.readexactly(4)
        if atyp == 3:
            host = (await r.readexactly((await r.readexactly(1))[0])).decode(); addr = NAMES.get(host, host)
        else:
            host = addr = socket.inet_ntoa(await r.readexactly(4))
        port = int.from_bytes(await r.readexactly(2), "big")
        log.write(f"{host}:{port}\n")
        ur, uw = await asyncio.open_connection(addr, port)
        w.write(b"\x05\x00\x00\x01" + socket.inet_aton("0.0.0.0") + b"\x00\x00")
        await asyncio.gather(pipe(r, uw), pipe(ur, w))
    except Exception as e:
        log.write(f"error {e!r}\n")
    finally:
        w.close()
async def main():
    server = await asyncio.start_server(serve, "203.0.113.20", 1080)
    print("ready", flush=True)
    await server.serve_forever()
asyncio.run(main())
'''
SOCKS_IP = "203.0.113.20"


@dataclass(frozen=True)
class World:
    ca_file: Path
    socks_log: Path
    dns: str = DNS_IP


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=check)


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write_certs(d: Path) -> tuple[Path, Path, Path]:
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(_name("egress test CA")).issuer_name(_name("egress test CA"))
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=2))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(_name("allowed.test")).issuer_name(ca.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in NAMES]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    (d / "ca.pem").write_bytes(ca.public_bytes(pem))
    (d / "server.pem").write_bytes(cert.public_bytes(pem))
    (d / "server.key").write_bytes(key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                                      serialization.NoEncryption()))
    return d / "ca.pem", d / "server.pem", d / "server.key"


def _teardown() -> None:
    _run("ip", "link", "del", HOST_IF, check=False)
    _run("ip", "netns", "del", NETNS, check=False)


@contextlib.contextmanager
def internet(workdir: Path) -> Iterator[World]:
    """The namespace, its servers and dnsmasq; all removed afterwards. Needs root and dnsmasq."""
    dnsmasq = shutil.which("dnsmasq")
    if dnsmasq is None:
        raise LookupError("dnsmasq is not installed (scripts/setup.sh installs dnsmasq-base)")
    _teardown()  # a run that was killed may have left them
    workdir.mkdir(parents=True, exist_ok=True)
    ca, cert, key = _write_certs(workdir)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        _run("ip", "netns", "add", NETNS)
        _run("ip", "link", "add", HOST_IF, "type", "veth", "peer", "name", "eth0", "netns", NETNS)
        _run("ip", "addr", "add", "198.18.0.1/30", "dev", HOST_IF)
        _run("ip", "link", "set", HOST_IF, "up")
        _run("ip", "route", "add", "203.0.113.0/24", "via", "198.18.0.2", "dev", HOST_IF)
        ns = ("ip", "-n", NETNS)
        _run(*ns, "addr", "add", "198.18.0.2/30", "dev", "eth0")
        _run(*ns, "link", "set", "eth0", "up")
        _run(*ns, "link", "set", "lo", "up")
        for ip in (*ADDRS.values(), DNS_IP, SOCKS_IP):
            _run(*ns, "addr", "add", f"{ip}/32", "dev", "lo")
        _run(*ns, "route", "add", "default", "via", "198.18.0.1")
        script = workdir / "server.py"
        script.write_text(SERVER)
        server = subprocess.Popen(["ip", "netns", "exec", NETNS, sys.executable, str(script), str(cert), str(key)],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        procs.append(server)
        assert server.stdout is not None
        line = server.stdout.readline()
        assert line.strip() == b"ready", line + server.stdout.read(2000)
        (workdir / "socks.py").write_text(SOCKS)
        socks = subprocess.Popen(["ip", "netns", "exec", NETNS, sys.executable, str(workdir / "socks.py"),
                                  str(workdir / "socks.log")], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        procs.append(socks)
        assert socks.stdout is not None and socks.stdout.readline().strip() == b"ready"
        addresses = [f"--address=/allowed.test/{ADDRS['allowed']}", f"--address=/other.test/{ADDRS['other']}",
                     f"--address=/example.test/{ADDRS['example']}"]
        procs.append(subprocess.Popen(
            ["ip", "netns", "exec", NETNS, dnsmasq, "--keep-in-foreground", "--no-resolv", "--no-hosts",
             "--conf-file=/dev/null", f"--listen-address={DNS_IP}", "--bind-interfaces", "--port=53",
             f"--pid-file={workdir / 'dnsmasq.pid'}", "--user=root", *addresses],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        time.sleep(0.3)
        assert procs[-1].poll() is None, "dnsmasq did not start"
        yield World(ca_file=ca, socks_log=workdir / "socks.log")
    finally:
        for proc in procs:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        _teardown()
