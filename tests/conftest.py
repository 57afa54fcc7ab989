"""Root fixtures. ``WARREN_E2B_SDK=DIR`` runs the tests under the e2b SDK installed in DIR (the SDK version
matrix: scripts/setup.sh installs the older SDK into .sdk/e2b-<version>); it goes first on sys.path here,
before any test module imports e2b."""

from __future__ import annotations

import os
import sys

import pytest

_SDK_DIR = os.environ.get("WARREN_E2B_SDK")
if _SDK_DIR:
    sys.path.insert(0, os.path.abspath(_SDK_DIR))
    import e2b

    if not os.path.abspath(e2b.__file__ or "").startswith(os.path.abspath(_SDK_DIR) + os.sep):
        raise RuntimeError(f"WARREN_E2B_SDK={_SDK_DIR}: e2b was imported from {e2b.__file__} instead")

pytest_plugins = [
    "tests.framework.agent",
    "tests.framework.rootfs",
    "tests.framework.runsc",
    "tests.framework.runtime",
    "tests.framework.tls",
]


def pytest_report_header(config: pytest.Config) -> str:
    from importlib.metadata import PackageNotFoundError, distributions

    found = [d.version for d in distributions(path=sys.path) if (d.metadata["Name"] or "").lower() == "e2b"]
    if not found:
        raise PackageNotFoundError("e2b")
    return f"e2b SDK: {found[0]}" + (f" (from {_SDK_DIR})" if _SDK_DIR else "")
