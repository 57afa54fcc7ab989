"""warren: self-hosted AI-agent sandboxes that serve the unmodified E2B SDK."""

__version__ = "0.1.0"
