"""``warren gateway``: the E2B API and data-plane proxy in front of many nodes, with its state in Redis."""

from .server import GatewaySettings, create_gateway_app, run_gateway, serve_gateway

__all__ = ["GatewaySettings", "create_gateway_app", "run_gateway", "serve_gateway"]
