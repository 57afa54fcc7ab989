"""The ``process.Process`` service: Start, Connect, List, SendInput, StreamInput, SendSignal,
CloseStdin, Update."""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator
from typing import Any

from .connect import (
    Call,
    Message,
    Method,
    client_stream,
    get_bytes,
    get_enum,
    get_int,
    get_list,
    get_map,
    get_msg,
    get_opt_str,
    get_str,
    server_stream,
    unary,
)
from .errors import RpcError
from .process import DEFAULT_PATH, ManagedProcess, SpawnSpec, Subscriber
from .users import PathError, resolve_path

SIGNALS = {"SIGNAL_UNSPECIFIED": 0, "SIGNAL_SIGTERM": 15, "SIGNAL_SIGKILL": 9}
KEEPALIVE_EVENT = b'{"event":{"keepalive":{}}}'


def _select(call: Call, selector: Message | None) -> ManagedProcess:
    if not selector:
        raise RpcError("invalid_argument", "a process selector (pid or tag) is required")
    table = call.agent.processes
    tag = get_opt_str(selector, "tag")
    if tag is not None and "pid" not in selector:
        proc = table.by_tag(tag)
        if proc is None:
            raise RpcError("not_found", f"process with tag {tag} not found")
        return proc
    pid = get_int(selector, "pid")
    proc = table.get(pid)
    if proc is None or proc.done.is_set():
        raise RpcError("not_found", f"process with pid {pid} not found")
    return proc


def _env_for(call: Call, envs: dict[str, str]) -> dict[str, str]:
    user = call.user
    env = {
        "PATH": os.environ.get("PATH") or DEFAULT_PATH,
        "HOME": user.home,
        "USER": user.name,
        "LOGNAME": user.name,
    }
    env.update(call.agent.env_vars)
    env.update(envs)  # the request's own envs win
    return env


def _resolve_cwd(call: Call, cwd: str) -> str:
    try:
        resolved = resolve_path(cwd, call.user, call.agent.default_workdir)
    except PathError as exc:
        raise RpcError("invalid_argument", str(exc)) from None
    if not os.path.isdir(resolved):
        raise RpcError("invalid_argument", f"cwd '{resolved}' does not exist")
    return resolved


async def _events(call: Call, proc: ManagedProcess, sub: Subscriber) -> AsyncIterator[bytes]:
    """The stream after the start event: data events, keepalives, then the end event."""
    while not sub.drained:
        payload = await sub.get(call.keepalive_s)
        yield KEEPALIVE_EVENT if payload is None else payload


async def start(call: Call, msg: Message) -> AsyncIterator[Any]:
    cfg = get_msg(msg, "process") or {}
    cmd = get_str(cfg, "cmd")
    if not cmd:
        raise RpcError("invalid_argument", "process.cmd is required")
    args = get_list(cfg, "args")
    envs = get_map(cfg, "envs")
    cwd_req = get_opt_str(cfg, "cwd")
    cwd = _resolve_cwd(call, cwd_req or "")
    pty = get_msg(msg, "pty")
    pty_size: tuple[int, int] | None = None
    if pty is not None:
        size = get_msg(pty, "size") or {}
        pty_size = (get_int(size, "cols") or 80, get_int(size, "rows") or 24)
    stdin_flag = msg.get("stdin")
    config: dict[str, Any] = {"cmd": cmd}
    if args:
        config["args"] = args
    if envs:
        config["envs"] = envs
    if cwd_req is not None:
        config["cwd"] = cwd_req
    spec = SpawnSpec(
        argv=[cmd, *args],
        env=_env_for(call, envs),
        cwd=cwd,
        user=call.user,
        pty_size=pty_size,
        stdin=stdin_flag is not False,
        tag=get_opt_str(msg, "tag"),
        config=config,
    )
    proc = call.agent.processes.spawn(spec)
    sub = proc.subscribe()
    # envd: the process's lifetime is bounded by the request's timeout, not by the client staying.
    if call.timeout_s is not None:
        proc.set_deadline(call.timeout_s)
    try:
        yield {"event": {"start": {"pid": proc.pid}}}
        async for item in _events(call, proc, sub):
            yield item
    finally:
        proc.unsubscribe(sub)
    if proc.timed_out:
        raise RpcError("deadline_exceeded", f"process {proc.pid} was killed when its timeout passed")


async def connect(call: Call, msg: Message) -> AsyncIterator[Any]:
    proc = _select(call, get_msg(msg, "process"))
    sub = proc.subscribe()
    try:
        yield {"event": {"start": {"pid": proc.pid}}}
        async for item in _events(call, proc, sub):
            yield item
    finally:
        proc.unsubscribe(sub)


async def list_processes(call: Call, msg: Message) -> Message:
    out = []
    for proc in call.agent.processes.running():
        info: dict[str, Any] = {"config": proc.config, "pid": proc.pid}
        if proc.tag is not None:
            info["tag"] = proc.tag
        out.append(info)
    return {"processes": out} if out else {}


async def _handle_input(proc: ManagedProcess, data: Message | None) -> None:
    if not data:
        raise RpcError("unimplemented", "process input must set stdin or pty")
    pty = get_bytes(data, "pty")
    if pty is not None:
        await proc.write_input(pty, pty=True)
        return
    stdin = get_bytes(data, "stdin")
    if stdin is not None:
        await proc.write_input(stdin, pty=False)
        return
    raise RpcError("unimplemented", "process input must set stdin or pty")


async def send_input(call: Call, msg: Message) -> Message:
    proc = _select(call, get_msg(msg, "process"))
    await _handle_input(proc, get_msg(msg, "input"))
    return {}


async def stream_input(call: Call, messages: AsyncIterator[Message]) -> Message:
    proc: ManagedProcess | None = None
    async for msg in messages:
        start_ev = get_msg(msg, "start")
        data_ev = get_msg(msg, "data")
        if start_ev is not None:
            proc = _select(call, get_msg(start_ev, "process"))
        elif data_ev is not None:
            if proc is None:
                raise RpcError("failed_precondition", "StreamInput data before its start event")
            await _handle_input(proc, get_msg(data_ev, "input"))
        elif "keepalive" in msg:
            continue
        else:
            raise RpcError("unimplemented", "unknown StreamInput event")
    return {}


async def send_signal(call: Call, msg: Message) -> Message:
    proc = _select(call, get_msg(msg, "process"))
    sig = get_enum(msg, "signal", SIGNALS)
    if sig not in (signal.SIGKILL, signal.SIGTERM):
        raise RpcError("invalid_argument", f"unsupported signal {msg.get('signal')!r}")
    proc.send_signal(sig)
    return {}


async def close_stdin(call: Call, msg: Message) -> Message:
    proc = _select(call, get_msg(msg, "process"))
    proc.close_stdin()
    return {}


async def update(call: Call, msg: Message) -> Message:
    proc = _select(call, get_msg(msg, "process"))
    pty = get_msg(msg, "pty")
    if pty is not None:
        size = get_msg(pty, "size") or {}
        try:
            proc.resize(get_int(size, "cols"), get_int(size, "rows"))
        except OSError as exc:
            raise RpcError("internal", f"error resizing tty: {exc}") from None
    return {}


METHODS: dict[str, Method] = {
    "process.Process/Start": server_stream(start, own_deadline=True),
    "process.Process/Connect": server_stream(connect),
    "process.Process/List": unary(list_processes),
    "process.Process/SendInput": unary(send_input),
    "process.Process/StreamInput": client_stream(stream_input),
    "process.Process/SendSignal": unary(send_signal),
    "process.Process/CloseStdin": unary(close_stdin),
    "process.Process/Update": unary(update),
}
