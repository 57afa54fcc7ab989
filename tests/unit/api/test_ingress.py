"""The private-traffic check of the proxy (``api/proxy/ingress.py``) and the ``domain`` a node answers."""

from __future__ import annotations

from warren.api.models import NO_DOMAIN, answered_domain
from warren.api.proxy.ingress import TRAFFIC_TOKEN_HEADER, refusal
from warren.api.proxy.routing import ENVD_PORT, Target

H = TRAFFIC_TOKEN_HEADER.encode()


def test_public_sandboxes_and_envd_pass() -> None:
    assert refusal(Target("s", 8000), [], None, paused=False) is None
    assert refusal(Target("s", ENVD_PORT), [], "tok", paused=False) is None  # envd checks its own token


def test_missing_wrong_and_right_tokens() -> None:
    missing = refusal(Target("s", 8000), [], "tok", paused=False)
    assert missing is not None and missing.status == 403
    assert missing.body() == {
        "sandboxId": "s",
        "code": 403,
        "message": "Sandbox is secured with traffic access token. Token header 'e2b-traffic-access-token' is missing",
    }
    empty = refusal(Target("s", 8000), [(H, b"")], "tok", paused=False)
    assert empty is not None and "is missing" in empty.message
    for wrong in (b"tok2", b"to", b"TOK"):
        invalid = refusal(Target("s", 8000), [(H, wrong)], "tok", paused=False)
        assert invalid is not None and invalid.message.endswith("'e2b-traffic-access-token' is invalid")
    assert refusal(Target("s", 8000), [(b"E2B-Traffic-Access-Token", b"tok")], "tok", paused=False) is None


def test_a_paused_sandbox_answers_as_the_resume_path_does() -> None:
    refused = refusal(Target("s", 3000), [(H, b"nope")], "tok", paused=True)
    assert refused is not None and refused.status == 403 and "can't be resumed" in refused.message
    assert refusal(Target("s", 3000), [(H, b"tok")], "tok", paused=True) is None


def test_answered_domain() -> None:
    assert answered_domain("sbx.example.com") == "sbx.example.com"
    assert answered_domain(None) == NO_DOMAIN and NO_DOMAIN.endswith(".invalid")
