"""``open_object_store``: which backend a ``--shared-store`` URL names, and the URLs it refuses."""

from __future__ import annotations

from pathlib import Path

import pytest

from warren.errors import InvalidRequestError
from warren.snapshots.shared import DirObjectStore, S3ObjectStore, open_object_store


def test_a_path_or_file_url_is_a_directory_store(tmp_path: Path) -> None:
    for url in (str(tmp_path / "a"), f"file://{tmp_path}/b", f"file://localhost{tmp_path}/c"):
        store = open_object_store(url)
        assert isinstance(store, DirObjectStore)
        assert store.root == Path(url.removeprefix("file://").removeprefix("localhost"))
        assert (store.root / ".tmp").is_dir()


def test_an_s3_url_names_bucket_prefix_endpoint_and_region() -> None:
    env = {"WARREN_S3_ENDPOINT": "http://minio:9000", "AWS_DEFAULT_REGION": "eu-west-1"}
    store = open_object_store("s3://snaps/prod/eu/", environ=env)
    assert isinstance(store, S3ObjectStore)
    assert (store.bucket, store.prefix, store.endpoint_url) == ("snaps", "prod/eu/", "http://minio:9000")
    assert store._client.meta.region_name == "eu-west-1"

    store = open_object_store("s3://snaps?endpoint=https://s3.example:8443&region=us-west-2", environ=env)
    assert isinstance(store, S3ObjectStore)
    assert (store.prefix, store.endpoint_url) == ("", "https://s3.example:8443")
    assert store._client.meta.region_name == "us-west-2"

    store = open_object_store("s3://snaps", environ={})
    assert isinstance(store, S3ObjectStore)
    assert store.endpoint_url is None  # AWS itself


@pytest.mark.parametrize(
    "url",
    [
        "",
        "relative/path",
        "file://host/path",
        "file:relative",
        "file:///a/../b",
        "/a/../b",
        "s3://",
        "s3:///prefix-without-bucket",
        "s3://user@bucket/x",
        "s3://bucket/../x",
        "s3://bucket/x?endpoint=ftp://h",
        "s3://bucket/x?color=blue",
        "http://example.com/bucket",
        "redis://localhost:6379/0",
    ],
)
def test_other_urls_are_refused_clearly(url: str) -> None:
    with pytest.raises(InvalidRequestError, match="shared store"):
        open_object_store(url)
