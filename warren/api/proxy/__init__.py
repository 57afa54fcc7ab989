"""The data-plane proxy: sandbox traffic by header or host name, to a port inside the sandbox."""

from .forward import SandboxProxy
from .routing import Target, target_of

__all__ = ["SandboxProxy", "Target", "target_of"]
