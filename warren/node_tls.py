"""The node's side of domain mode (``warren serve --domain D``): what ``/health`` and the start-up
message say about how clients reach sandboxes. The certificates themselves: :mod:`warren.api.tls`,
shared with the gateway."""

from __future__ import annotations

from pathlib import Path

from .api.tls import TlsConfigError, TlsFiles, domain_host, ensure_certificate, tls_files

__all__ = [
    "HEADER_MODE",
    "TlsConfigError",
    "TlsFiles",
    "domain_host",
    "domain_info",
    "ensure_node_certificate",
    "startup_message",
    "tls_files",
]


def ensure_node_certificate(directory: Path, host: str) -> TlsFiles:
    """The node CA and a leaf for ``host`` and ``*.host`` in ``directory``, made when missing or stale."""
    return ensure_certificate(directory, host, role="node")


HEADER_MODE = (
    "header mode: this node has no --domain, so the E2B SDK must be given E2B_SANDBOX_URL=<this node's URL> "
    "(get_host, download_url/upload_url and browser traffic need domain mode: warren serve --domain D)"
)


def domain_info(domain: str | None, tls: TlsFiles | None) -> dict[str, object]:
    """What ``/health`` says about how clients reach sandboxes."""
    if domain is None:
        return {"domain": None, "sandboxUrls": HEADER_MODE}
    scheme = "https" if tls is not None else "http"
    out: dict[str, object] = {"domain": domain, "sandboxUrls": f"{scheme}://<port>-<sandboxID>.{domain}"}
    if tls is not None and tls.ca is not None:
        out["tlsCA"] = str(tls.ca)
    return out


def startup_message(domain: str | None, tls: TlsFiles | None) -> str:
    if domain is None:
        return f"warren: {HEADER_MODE}"
    text = f"warren: domain mode: sandboxes at https://<port>-<sandboxID>.{domain}; SDK: E2B_DOMAIN={domain}"
    if tls is not None and tls.ca is not None:
        text += f"\nwarren: clients must trust the node CA {tls.ca} (for the E2B SDK: SSL_CERT_FILE={tls.ca})"
    return text
