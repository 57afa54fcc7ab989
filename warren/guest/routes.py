"""The top-level router: access-token auth, the plain HTTP routes and the Connect services."""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from . import connect, filesystem, process_rpc
from .connect import Call, Method
from .errors import HttpError, RpcError
from .server import BodyTooLarge, Handler, Request, Response
from .state import Agent
from .users import User

RPC_METHODS: dict[str, Method] = {**process_rpc.METHODS, **filesystem.METHODS}
MAX_JSON_BODY = 1 << 20


def _basic_username(request: Request) -> str | None:
    """The user of ``Authorization: Basic base64("<user>:")``, None without the header."""
    header = request.header("authorization")
    if not header:
        return None
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(value.strip(), validate=True).decode("utf-8")
    except (binascii.Error, ValueError):
        raise RpcError("unauthenticated", "invalid basic authorization header") from None
    return decoded.partition(":")[0]


def rpc_user(agent: Agent, request: Request) -> User:
    """The RPC's user: Basic-auth user, else the default user; ``unauthenticated`` if unknown."""
    name = _basic_username(request)
    user = agent.user(name)
    if user is None:
        if name is None:
            raise RpcError("unauthenticated", f"invalid default user: '{agent.default_username()}'")
        raise RpcError("unauthenticated", f"invalid username: '{name}'")
    return user


async def _json_body(request: Request) -> Any:
    try:
        raw = await request.body.read_all(MAX_JSON_BODY)
    except BodyTooLarge as exc:
        raise HttpError(413, str(exc)) from None
    if not raw.strip():
        return {}
    try:
        return json.loads(raw)
    except ValueError:
        raise HttpError(400, "request body is not valid JSON") from None


async def _init(agent: Agent, request: Request, response: Response) -> None:
    """``POST /init``: env vars (merged), access token, default user and workdir.

    Once a token is set, /init itself needs it in X-Access-Token; a new token in the body then
    replaces it (a sandbox forked or restored from a snapshot gets its own token).
    """
    if agent.access_token is not None and not agent.token_matches(request.header("x-access-token")):
        raise HttpError(401, "unauthorized access, please provide a valid access token")
    body = await _json_body(request)
    if not isinstance(body, dict):
        raise HttpError(400, "/init expects a JSON object")
    env_vars = body.get("envVars") or body.get("env_vars") or {}
    if not isinstance(env_vars, dict) or not all(isinstance(v, str) for v in env_vars.values()):
        raise HttpError(400, "envVars must be a map of strings")
    token = body.get("accessToken", body.get("access_token"))
    default_user = body.get("defaultUser", body.get("default_user"))
    default_workdir = body.get("defaultWorkdir", body.get("default_workdir"))
    for name, value in (("accessToken", token), ("defaultUser", default_user), ("defaultWorkdir", default_workdir)):
        if value is not None and not isinstance(value, str):
            raise HttpError(400, f"{name} must be a string")
    agent.env_vars.update(env_vars)
    if token:
        agent.access_token = token
    if default_user:
        agent.default_user = default_user
    if default_workdir:
        agent.default_workdir = default_workdir
    await response.send(204, headers=[("Cache-Control", "no-store")])


def make_handler(agent: Agent) -> Handler:
    """The request handler the HTTP server runs for every request."""

    async def handle(request: Request, response: Response) -> None:
        try:
            await _route(agent, request, response)
        except HttpError as exc:
            if response.started:  # mid-stream: nothing sensible to add, drop the connection
                response.keep_alive = False
                return
            await response.send_error(exc.status, exc.message)

    return handle


async def _route(agent: Agent, request: Request, response: Response) -> None:
    path = request.path
    method = request.method
    if path == "/health":
        if method not in ("GET", "HEAD"):
            raise HttpError(405, "method not allowed")
        await response.send(204)
        return
    if path == "/init":
        if method != "POST":
            raise HttpError(405, "method not allowed")
        await _init(agent, request, response)
        return
    if path == "/files":
        from .files import get_files, post_files

        if method in ("GET", "HEAD"):
            await get_files(agent, request, response)
        elif method == "POST":
            await post_files(agent, request, response)
        else:
            raise HttpError(405, "method not allowed")
        return
    rpc = RPC_METHODS.get(path[1:])
    if not agent.token_matches(request.header("x-access-token")):
        message = "unauthorized access, please provide a valid access token or method signing if supported"
        if rpc is not None:
            await connect.send_unary_error(response, RpcError("unauthenticated", message))
            return
        raise HttpError(401, message)
    if rpc is not None:
        await connect.serve(rpc, request, response, lambda: Call(agent, request, rpc_user(agent, request)))
        return
    if path == "/envs" and method == "GET":
        await response.send_json(200, agent.env_vars)
        return
    if path == "/metrics" and method == "GET":
        from .metrics import collect

        await response.send_json(200, collect(agent))
        return
    if "/" in path[1:] and path[1:].split("/", 1)[0] in ("process.Process", "filesystem.Filesystem"):
        await connect.send_unary_error(response, RpcError("unimplemented", f"unknown method {path[1:]}"))
        return
    raise HttpError(404, f"no route for {method} {path}")
