"""The sandbox lifecycle: state machine, operations, TTLs, recovery."""

from .manager import SandboxManager
from .requests import CreateRequest, ListQuery
from .states import SandboxState

__all__ = ["CreateRequest", "ListQuery", "SandboxManager", "SandboxState"]
