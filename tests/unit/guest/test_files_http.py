"""``GET``/``POST /files`` over raw httpx: multipart, octet-stream, gzip, big files, errors."""

from __future__ import annotations

import gzip
import hashlib
import os
from collections.abc import Iterator

import httpx

from .conftest import USER_UID, AgentProc


def test_multipart_single_file_uses_path_query(agent: AgentProc) -> None:
    with agent.client() as c:
        r = c.post(
            "/files",
            params={"path": "up/one.txt"},
            files={"file": ("ignored-name", b"one", "text/plain")},
        )
    assert r.status_code == 200
    target = agent.home / "up" / "one.txt"
    assert r.json() == [{"name": "one.txt", "type": "file", "path": str(target)}]
    assert target.read_bytes() == b"one"
    assert target.stat().st_uid == USER_UID
    assert (agent.home / "up").stat().st_uid == USER_UID  # created parent chowned too


def test_multipart_several_files_use_filenames(agent: AgentProc) -> None:
    a = str(agent.home / "multi" / "a.txt")
    b = str(agent.home / "multi" / "deep" / 'b "quoted".bin')
    with agent.client() as c:
        r = c.post("/files", files=[("file", (a, b"AAA")), ("file", (b, bytes(range(256))))])
    assert r.status_code == 200
    assert [e["path"] for e in r.json()] == [a, b]
    assert open(b, "rb").read() == bytes(range(256))


def test_multipart_duplicate_path_is_400(agent: AgentProc) -> None:
    a = str(agent.home / "dup.txt")
    with agent.client() as c:
        r = c.post("/files", files=[("file", (a, b"1")), ("file", (a, b"2"))])
    assert r.status_code == 400 and "message" in r.json()


def test_octet_stream_chunked_and_gzip(agent: AgentProc) -> None:
    def chunks() -> Iterator[bytes]:
        for i in range(10):
            yield bytes([i]) * 1000

    with agent.client() as c:
        r = c.post(
            "/files",
            params={"path": "raw/chunked.bin"},
            content=chunks(),
            headers={"content-type": "application/octet-stream"},
        )
        assert r.status_code == 200
        assert (agent.home / "raw" / "chunked.bin").read_bytes() == b"".join(chunks())
        payload = b"compress me " * 10000
        two_members = gzip.compress(payload[:5000]) + gzip.compress(payload[5000:])
        r = c.post(
            "/files",
            params={"path": "raw/gz.txt"},
            content=two_members,
            headers={"content-type": "application/octet-stream", "content-encoding": "gzip"},
        )
        assert r.status_code == 200
        assert (agent.home / "raw" / "gz.txt").read_bytes() == payload
        r = c.post(
            "/files",
            params={"path": "raw/bad.txt"},
            content=b"not gzip",
            headers={"content-type": "application/octet-stream", "content-encoding": "gzip"},
        )
        assert r.status_code == 400
        r = c.post("/files", content=b"x", headers={"content-type": "application/octet-stream"})
        assert r.status_code == 400  # no path
        r = c.post("/files", params={"path": "x"}, content=b"x", headers={"content-type": "text/plain"})
        assert r.status_code == 400


def test_upload_overwrites_and_metadata_xattrs(agent: AgentProc) -> None:
    target = agent.home / "meta.txt"
    with agent.client() as c:
        for body in (b"first version, longer", b"second"):
            r = c.post(
                "/files",
                params={"path": "meta.txt"},
                content=body,
                headers={"content-type": "application/octet-stream", "X-Metadata-Owner": "Alice"},
            )
            assert r.status_code == 200
    assert target.read_bytes() == b"second"
    try:
        assert os.getxattr(target, "user.e2b.owner") == b"Alice"
    except OSError:
        pass  # the test filesystem has no user xattrs


def test_download_raw_gzip_and_headers(agent: AgentProc) -> None:
    (agent.home / "dl.txt").write_bytes(b"download me\n" * 100)
    with agent.client() as c:
        r = c.get("/files", params={"path": "dl.txt"}, headers={"accept-encoding": "identity"})
        assert r.status_code == 200
        assert r.content == b"download me\n" * 100
        assert r.headers["content-length"] == "1200"
        assert 'filename="dl.txt"' in r.headers["content-disposition"]
        r = c.get("/files", params={"path": "dl.txt"}, headers={"accept-encoding": "gzip"})
        assert r.headers["content-encoding"] == "gzip"
        assert r.content == b"download me\n" * 100  # httpx decodes it
        r = c.get("/files", params={"path": "dl.txt", "username": "root"})
        assert r.status_code == 404  # relative to root's home, not user's
        r = c.get("/files", params={"path": str(agent.home / "dl.txt"), "username": "root"})
        assert r.status_code == 200


def test_download_errors(agent: AgentProc) -> None:
    with agent.client() as c:
        r = c.get("/files", params={"path": "no/such/file"})
        assert r.status_code == 404 and "message" in r.json()
        r = c.get("/files", params={"path": str(agent.home)})
        assert r.status_code == 400
        r = c.get("/files", params={"path": "x", "username": "ghost"})
        assert r.status_code == 401
        r = c.get("/files", params={"path": "~ghost/x"})
        assert r.status_code == 400


def test_relative_paths_resolve_against_the_users_home(agent: AgentProc) -> None:
    with agent.client() as c:
        r = c.post(
            "/files",
            params={"path": "rel.txt", "username": "root"},
            content=b"r",
            headers={"content-type": "application/octet-stream"},
        )
        assert r.json()[0]["path"] == "/root/rel.txt"
        os.unlink("/root/rel.txt")


def test_fifty_mib_round_trip_is_streamed(agent: AgentProc) -> None:
    size = 50 << 20
    block = hashlib.sha256(b"seed").digest() * 2048  # 64 KiB

    def body() -> Iterator[bytes]:
        for _ in range(size // len(block)):
            yield block

    rss_before = agent.rss_kib()
    with agent.client() as c:
        r = c.post(
            "/files",
            params={"path": "big/50m.bin"},
            content=body(),
            headers={"content-type": "application/octet-stream"},
        )
        assert r.status_code == 200
        rss_after_upload = agent.rss_kib()
        digest = hashlib.sha256()
        got = 0
        with c.stream("GET", "/files", params={"path": "big/50m.bin"}, headers={"accept-encoding": "identity"}) as s:
            assert s.status_code == 200
            for chunk in s.iter_raw():
                digest.update(chunk)
                got += len(chunk)
        rss_after_download = agent.rss_kib()
        # and multipart, streamed too
        with open(agent.home / "big" / "50m.bin", "rb") as f:
            r = c.post("/files", params={"path": "big/50m-copy.bin"}, files={"file": ("x", f)})
        assert r.status_code == 200
    expected = hashlib.sha256(b"".join(block for _ in range(size // len(block)))).hexdigest()
    assert (got, digest.hexdigest()) == (size, expected)
    assert (agent.home / "big" / "50m-copy.bin").stat().st_size == size
    # Memory stays far below the file size (nothing held whole): a bound, not a timing.
    assert rss_after_upload - rss_before < 16 << 10
    assert rss_after_download - rss_before < 16 << 10
    os.unlink(agent.home / "big" / "50m.bin")
    os.unlink(agent.home / "big" / "50m-copy.bin")


def test_out_of_space_is_507(agent: AgentProc) -> None:
    if not os.path.exists("/dev/full"):
        return
    with agent.client() as c:
        r = c.post(
            "/files",
            params={"path": "/dev/full", "username": "root"},
            content=b"x" * 100000,
            headers={"content-type": "application/octet-stream"},
        )
    assert r.status_code == 507
    assert httpx.codes.INSUFFICIENT_STORAGE == 507
