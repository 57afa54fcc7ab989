"""A networking-capable runsc for tests: a byte-patched copy of the host's /usr/bin/runsc.

The Debian runsc (0.0~20221219) cannot start a ``--network=sandbox`` sandbox on kernels >= 6.7
(guest-agent-notes B1, google/gvisor#10704): it decides "am I in the root netns?" by checking that
``/proc/sys/net/core/rmem_default`` exists, and since 6.7 that sysctl exists in every netns. The copy
swaps that path, same length, for ``/proc/sys/net/core/message_cost``, which only the root netns has.

The copy stands in for a fixed upstream runsc release (2024-08 or later) in TESTS ONLY. warren itself
never modifies a runtime binary; in production its startup probe reports the bug instead.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

__all__ = ["patch_runsc", "patched_runsc", "system_runsc"]

SYSTEM_RUNSC = Path("/usr/bin/runsc")
_OLD = b"/proc/sys/net/core/rmem_default"
_NEW = b"/proc/sys/net/core/message_cost"
_EXPECTED_OCCURRENCES = 2


def patch_runsc(src: Path, dest: Path) -> Path:
    """Write the patched copy of ``src`` to ``dest`` (mode 0755) and return ``dest``."""
    assert len(_OLD) == len(_NEW)
    data = src.read_bytes()
    found = data.count(_OLD)
    if found != _EXPECTED_OCCURRENCES:
        raise ValueError(f"{src}: expected {_EXPECTED_OCCURRENCES} occurrences of {_OLD!r}, found {found}")
    dest.write_bytes(data.replace(_OLD, _NEW))
    dest.chmod(0o755)
    return dest


@pytest.fixture(scope="session")
def system_runsc() -> Path:
    """The unmodified host runsc; skips when there is none."""
    if not SYSTEM_RUNSC.is_file():
        pytest.skip(f"needs runsc at {SYSTEM_RUNSC}")
    return SYSTEM_RUNSC


@pytest.fixture(scope="session")
def patched_runsc(system_runsc: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Path to the patched copy (see the module docstring); skips when the host runsc does not match."""
    dest = tmp_path_factory.mktemp("runsc-patched") / "runsc"
    try:
        patch_runsc(system_runsc, dest)
    except ValueError as exc:
        pytest.skip(f"cannot make the B1-patched runsc copy: {exc}")
    yield dest
    shutil.rmtree(dest.parent, ignore_errors=True)
