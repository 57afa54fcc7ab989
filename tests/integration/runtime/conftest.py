from __future__ import annotations

import pytest

from tests.framework.runtime import SandboxFactory


@pytest.fixture(params=[pytest.param("runc", marks=pytest.mark.runc), pytest.param("runsc", marks=pytest.mark.runsc)])
def sandboxes(request: pytest.FixtureRequest) -> SandboxFactory:
    """The same test on runc and on runsc (the B1-patched copy)."""
    factory: SandboxFactory = request.getfixturevalue(f"{request.param}_sandboxes")
    return factory
