"""The security suite runs against the same kind of real node as the end-to-end suite."""

from tests.e2e.conftest import _sdk_env, node, runtime, sbx, template  # noqa: F401 (fixtures)
