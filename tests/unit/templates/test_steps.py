"""Build steps, pure: request parsing, metadata folding, cache keys and prefixes, COPY file hashes."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path
from typing import Any

import pytest
from e2b.template.utils import calculate_files_hash, tar_file_stream

from warren.errors import InvalidRequestError
from warren.templates.build import describe_pull_error, mounted_lower_dirs, validate_name
from warren.templates.steps import (
    Metadata,
    StepType,
    base_key,
    cache_search,
    chain_keys,
    copy_is_glob,
    copy_source_base,
    expand_vars,
    files_hash_of_bytes,
    fold,
    parse_build_request,
    parse_step,
    seal_point,
)

HASH = "a" * 64


def _body(**extra: Any) -> dict[str, Any]:
    return {
        "fromTemplate": "base",
        "steps": [
            {"type": "RUN", "args": ["echo hi"], "force": False},
            {"type": "ENV", "args": ["A", "1", "B", "${A}-2"]},
            {"type": "WORKDIR", "args": ["app"]},
            {"type": "COPY", "args": ["src", "dest/", "", "0755"], "filesHash": HASH},
            {"type": "USER", "args": ["dev:staff"]},
        ],
        "startCmd": "serve",
        "readyCmd": "true",
        **extra,
    }


def test_parse_build_request() -> None:
    req = parse_build_request(_body())
    assert req.from_template == "base" and req.from_image is None
    assert [s.type for s in req.steps] == [StepType.RUN, StepType.ENV, StepType.WORKDIR, StepType.COPY, StepType.USER]
    assert req.steps[3].files_hash == HASH and req.steps[0].files_hash is None
    assert [s.name for s in req.steps] == ["1", "2", "3", "4", "5"]
    assert req.start_cmd == "serve" and req.ready_cmd == "true" and not req.force
    assert req.first_forced == 5


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"fromImage": "x", "fromTemplate": "y"}, "not both"),
        ({"steps": []}, "required"),
        ({"fromTemplate": "b", "steps": [{"type": "FROB", "args": []}]}, "unsupported type"),
        ({"fromTemplate": "b", "steps": [{"type": "COPY", "args": ["a", "b"]}]}, "filesHash"),
        ({"fromTemplate": "b", "steps": [{"type": "COPY", "args": ["a", "b", "", "rwx"], "filesHash": HASH}]}, "octal"),
        ({"fromTemplate": "b", "steps": [{"type": "COPY", "args": ["../a", "b"], "filesHash": HASH}]}, "inside"),
        ({"fromTemplate": "b", "steps": [{"type": "COPY", "args": ["/etc", "b"], "filesHash": HASH}]}, "inside"),
        ({"fromTemplate": "b", "steps": [{"type": "ENV", "args": ["A"]}]}, "pairs"),
        ({"fromTemplate": "b", "steps": [{"type": "ENV", "args": ["1A", "x"]}]}, "invalid environment"),
        ({"fromTemplate": "b", "steps": [{"type": "RUN", "args": []}]}, "command"),
        ({"fromTemplate": "b", "steps": [{"type": "WORKDIR", "args": ["a", "b"]}]}, "exactly one"),
        ({"fromTemplate": "b", "steps": "RUN"}, "list"),
        ({"fromImage": "x", "fromImageRegistry": {"type": "aws"}}, "not supported"),
    ],
)
def test_bad_build_requests(body: dict[str, Any], needle: str) -> None:
    with pytest.raises(InvalidRequestError, match=needle):
        parse_build_request(body)


def test_registry_credentials_and_force() -> None:
    req = parse_build_request(
        {"fromImage": "r/x", "force": True, "fromImageRegistry": {"type": "registry", "username": "u", "password": "p"}}
    )
    assert req.registry_auth == ("u", "p") and req.first_forced == 0
    body = _body()
    body["steps"][2]["force"] = True
    assert parse_build_request(body).first_forced == 2


def test_metadata_folds_env_workdir_user() -> None:
    req = parse_build_request(_body())
    meta = fold(Metadata(env={"PATH": "/bin"}, workdir=None, user="user"), req.steps)
    assert meta.env == {"PATH": "/bin", "A": "1", "B": "1-2"}
    assert meta.workdir == "/home/user/app"  # relative: against the user's home when no workdir is set
    assert meta.user == "dev"
    again = fold(meta, [parse_step(0, {"type": "WORKDIR", "args": ["../lib"]})])
    assert again.workdir == "/home/user/lib"
    root = fold(Metadata(user="root"), [parse_step(0, {"type": "WORKDIR", "args": ["w"]})])
    assert root.workdir == "/root/w"


def test_expand_vars() -> None:
    env = {"PATH": "/usr/bin", "HOME": "/h"}
    assert expand_vars("/opt/bin:$PATH", env) == "/opt/bin:/usr/bin"
    assert expand_vars("${HOME}/x-$MISSING-y", env) == "/h/x--y"
    assert expand_vars("no vars", env) == "no vars"


def test_chain_keys_cover_steps_not_force() -> None:
    base = base_key(["/l/1"], Metadata(), provision=False, source="t")
    req = parse_build_request(_body())
    keys = chain_keys(base, req.steps)
    assert len(keys) == len(req.steps) + 1 and keys[0] == base
    assert keys == chain_keys(base, req.steps)
    forced = _body()
    forced["steps"][0]["force"] = True
    assert chain_keys(base, parse_build_request(forced).steps) == keys  # force is not part of the key
    changed = _body()
    changed["steps"][3]["filesHash"] = "b" * 64
    other = chain_keys(base, parse_build_request(changed).steps)
    assert other[:4] == keys[:4] and other[4] != keys[4] and other[5] != keys[5]
    assert base_key(["/l/2"], Metadata(), provision=False, source="t") != base
    assert base_key(["/l/1"], Metadata(user="root"), provision=False, source="t") != base
    assert base_key(["/l/1"], Metadata(), provision=True, source="t") != base


def test_cache_search_takes_the_longest_allowed_prefix() -> None:
    keys = ["k0", "k1", "k2", "k3"]
    cached = {"k1": ("/a",), "k3": ("/a", "/b")}
    assert cache_search(keys, 3, cached.get) == (3, ("/a", "/b"))
    assert cache_search(keys, 2, cached.get) == (1, ("/a",))  # step 3 forced: k3 may not be used
    assert cache_search(keys, 0, cached.get) is None
    assert cache_search(keys, 3, {}.get) is None


def test_seal_point() -> None:
    req = parse_build_request(_body())
    assert seal_point(req.steps) == 5
    env_only = [parse_step(0, {"type": "ENV", "args": ["A", "1"]})]
    assert seal_point(env_only) == 0
    tail = [parse_step(0, {"type": "RUN", "args": ["x"]}), parse_step(1, {"type": "ENV", "args": ["A", "1"]})]
    assert seal_point(tail) == 1


@pytest.mark.parametrize(
    ("src", "base", "glob"),
    [
        ("file.txt", "file.txt", False),
        ("./a/b.txt", "a/b.txt", False),
        ("conf/", "conf", False),
        ("app/*.py", "app", True),
        ("*.txt", "", True),
        ("a/**/x", "a", True),
        (".", "", False),
    ],
)
def test_copy_source_base(src: str, base: str, glob: bool) -> None:
    assert copy_source_base(src) == base
    assert copy_is_glob(src) is glob


def _context(tmp_path: Path) -> Path:
    ctx = tmp_path / "ctx"
    (ctx / "dir" / "sub").mkdir(parents=True)
    (ctx / "file.txt").write_text("hello\n")
    (ctx / "dir" / "a.bin").write_bytes(os.urandom(3000))
    (ctx / "dir" / "sub" / "run.sh").write_text("#!/bin/sh\n")
    (ctx / "dir" / "sub" / "run.sh").chmod(0o755)
    (ctx / "dir" / "link").symlink_to("a.bin")
    (ctx / "dir" / "abs-link").symlink_to("/etc/passwd")
    (ctx / "dir" / "empty").mkdir()
    os.link(ctx / "dir" / "a.bin", ctx / "dir" / "hard.bin")
    return ctx


@pytest.mark.parametrize("gzip", [True, False])
@pytest.mark.parametrize(("src", "dest"), [("file.txt", "/app/"), ("dir", "/srv/dir"), ("dir/*.bin", "/x/")])
def test_files_hash_of_the_sdk_upload_matches_the_sdk_hash(tmp_path: Path, src: str, dest: str, gzip: bool) -> None:
    ctx = _context(tmp_path)
    expected = calculate_files_hash(src, dest, str(ctx), [], False, None)
    with tar_file_stream(src, str(ctx), [], False, gzip) as tar:
        data = tar.read()
    assert files_hash_of_bytes(data, src, dest) == expected
    assert files_hash_of_bytes(data, src, dest + "x") != expected  # the destination is part of the hash


def test_files_hash_sees_changed_content(tmp_path: Path) -> None:
    ctx = _context(tmp_path)
    expected = calculate_files_hash("dir", "/d", str(ctx), [], False, None)
    (ctx / "dir" / "sub" / "run.sh").write_text("#!/bin/sh\necho changed\n")
    with tar_file_stream("dir", str(ctx), [], False, True) as tar:
        assert files_hash_of_bytes(tar.read(), "dir", "/d") != expected


def test_files_hash_with_resolved_symlinks(tmp_path: Path) -> None:
    ctx = _context(tmp_path)
    (ctx / "dir" / "abs-link").unlink()
    expected = calculate_files_hash("dir", "/d", str(ctx), [], True, None)
    with tar_file_stream("dir", str(ctx), [], True, True) as tar:
        assert files_hash_of_bytes(tar.read(), "dir", "/d") == expected


def test_files_hash_of_garbage_is_a_clear_error() -> None:
    with pytest.raises(InvalidRequestError, match="not a readable tar"):
        files_hash_of_bytes(b"\x1f\x8bnot really gzip", "a", "b")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w"):
        pass
    assert len(files_hash_of_bytes(buf.getvalue(), "a", "b")) == 64  # an empty tar is a (useless) tar


@pytest.mark.parametrize("name", ["app", "my-env:v1.0", "a.b_c", "X9"])
def test_valid_names(name: str) -> None:
    assert validate_name(name) == name


@pytest.mark.parametrize("name", ["", "-x", "a b", "a/b", "x" * 129, "é"])
def test_invalid_names(name: str) -> None:
    with pytest.raises(InvalidRequestError):
        validate_name(name)


def test_mounted_lower_dirs(tmp_path: Path) -> None:
    info = tmp_path / "mountinfo"
    info.write_text(
        "22 1 8:1 / / rw - ext4 /dev/vda rw\n"
        "90 22 0:50 / /s/a/bundle/rootfs rw - overlay overlay rw,lowerdir=/l/top:/l/my\\040base,"
        "upperdir=/s/a/upper,workdir=/s/a/work\n"
        "91 22 0:51 / /x rw - tmpfs tmpfs rw\n"
    )
    assert mounted_lower_dirs(info) == {"/l/top", "/l/my base"}
    assert mounted_lower_dirs(tmp_path / "missing") == set()


def test_pull_errors_read_as_build_errors() -> None:
    from warren.errors import NotFoundError
    from warren.images import DigestMismatchError, RegistryAuthError, RegistryError, UnsafeLayerError

    assert "refused access" in describe_pull_error("r/x", RegistryAuthError("401"))
    assert "not found" in describe_pull_error("r/x", NotFoundError("no tag"))
    assert "digest mismatch" in describe_pull_error("r/x", DigestMismatchError("bad"))
    assert "unsafe layer" in describe_pull_error("r/x", UnsafeLayerError("dev"))
    assert "cannot pull" in describe_pull_error("r/x", RegistryError("down"))
