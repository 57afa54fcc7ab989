"""HTTP control plane (E2B-compatible routes and warren's own) and the data-plane proxy."""

from .app import create_app
from .services import Services

__all__ = ["Services", "create_app"]
