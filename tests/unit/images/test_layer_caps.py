"""Layer size caps are counted on the bytes that stream, never taken from declared sizes.

Needs root (unpacking chowns what it writes).
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import pytest

from tests.framework.images import make_layer, member
from warren.images.errors import LayerTooLargeError
from warren.images.layers import unpack_layer

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="unpacking layers needs root")


def test_unpacked_cap_counts_the_stream_and_leaves_nothing(tmp_path: Path) -> None:
    layer = make_layer([member("zeros", bytes(2 << 20))], level=9)
    blob = tmp_path / "blob"
    blob.write_bytes(layer.blob)
    with pytest.raises(LayerTooLargeError, match="WARREN_MAX_LAYER_UNPACKED_BYTES"):
        unpack_layer(blob, tmp_path / "layer", layer.diff_id, max_bytes=1 << 20)
    assert not (tmp_path / "layer").exists()
    unpack_layer(blob, tmp_path / "ok", layer.diff_id, max_bytes=4 << 20)
    assert (tmp_path / "ok" / "zeros").stat().st_size == 2 << 20


def test_tar_headers_that_understate_a_member_do_not_dodge_the_cap(tmp_path: Path) -> None:
    """A tar that declares one 10-byte member and carries 2 MiB more: every byte of the stream counts."""
    small = make_layer([member("tiny", b"0123456789")], level=1)
    raw = gzip.decompress(small.blob) + bytes(2 << 20)
    blob = tmp_path / "blob"
    blob.write_bytes(gzip.compress(raw, compresslevel=1))
    with pytest.raises(LayerTooLargeError):
        unpack_layer(blob, tmp_path / "layer", "sha256:" + "0" * 64, max_bytes=1 << 20)
    assert not (tmp_path / "layer").exists()
