"""Entry point: ``main(argv)`` parses the command line and serves until SIGTERM/SIGINT.

Options: ``--host`` (0.0.0.0), ``--port`` (``$WARREN_AGENT_PORT``, else 49983), ``--passwd``
(/etc/passwd), ``--group`` (/etc/group), ``--log-level`` (warning). ``WARREN_AGENT_WATCH=poll`` makes
directory watches poll instead of using inotify.

The event loop is a ``SelectorEventLoop`` over ``poll(2)``: gVisor (2022) cannot checkpoint a TCP
listener that sits in an epoll set, and poll registers waiters only while it blocks.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import asyncio
    import socket

DEFAULT_PORT = 49983
AGENT_OOM_SCORE_ADJ = "-998"
"""The agent's own OOM score: a memory bomb inside the sandbox is killed, not the agent."""

_USAGE = """usage: python -m warren.guest [--host HOST] [--port PORT] [--passwd PATH] [--group PATH]
                              [--log-level LEVEL]"""


@dataclass(frozen=True)
class Options:
    host: str = "0.0.0.0"
    port: int = DEFAULT_PORT
    passwd: str = "/etc/passwd"
    group: str = "/etc/group"
    log_level: str = "WARNING"


class UsageError(Exception):
    pass


def parse_args(argv: list[str], environ: dict[str, str] | None = None) -> Options:
    """The options from ``argv`` (without the program name); WARREN_AGENT_PORT is the port default."""
    env = os.environ if environ is None else environ
    values: dict[str, str] = {}
    names = {"--host": "host", "--port": "port", "--passwd": "passwd", "--group": "group", "--log-level": "log_level"}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("-h", "--help"):
            raise UsageError("")
        name, eq, value = arg.partition("=")
        if name not in names:
            raise UsageError(f"unknown option {arg!r}")
        if not eq:
            i += 1
            if i >= len(argv):
                raise UsageError(f"option {name} needs a value")
            value = argv[i]
        values[names[name]] = value
        i += 1
    port_text = values.get("port") or env.get("WARREN_AGENT_PORT") or str(DEFAULT_PORT)
    try:
        port = int(port_text)
    except ValueError:
        raise UsageError(f"invalid port {port_text!r}") from None
    if not 0 <= port <= 65535:
        raise UsageError(f"invalid port {port}")
    return Options(
        host=values.get("host", Options.host),
        port=port,
        passwd=values.get("passwd", Options.passwd),
        group=values.get("group", Options.group),
        log_level=values.get("log_level", Options.log_level).upper(),
    )


def _lower_own_oom_score() -> None:
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write(AGENT_OOM_SCORE_ADJ)
    except OSError:
        pass


def _listen(host: str, port: int) -> socket.socket:
    """A listening socket made directly: ``create_server(host=...)`` would resolve the name on a
    thread-pool thread that then stays alive."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto=IPPROTO_TCP matters: asyncio sets TCP_NODELAY on accepted sockets only when the proto
    # says TCP. Without it every streamed response stalls 40 ms on the client's delayed ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(512)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


async def serve(options: Options, *, ready: asyncio.Future[tuple[str, int]] | None = None) -> None:
    """Serve until SIGTERM or SIGINT. ``ready`` gets the bound (host, port)."""
    import asyncio
    import signal

    from .routes import make_handler
    from .server import HttpServer
    from .state import Agent
    from .users import Accounts

    loop = asyncio.get_running_loop()
    agent = Agent(
        loop,
        Accounts(options.passwd, options.group),
        poll_watch=os.environ.get("WARREN_AGENT_WATCH") == "poll",
    )
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGCHLD, agent.processes.reap)
    agent.processes.reap()
    http = HttpServer(make_handler(agent))
    sock = _listen(options.host, options.port)
    server = await asyncio.start_server(http.serve, sock=sock)
    bound = sock.getsockname()[:2]
    print(f"warren-guest listening on {bound[0]}:{bound[1]} pid {os.getpid()}", file=sys.stderr, flush=True)
    if ready is not None:
        ready.set_result((bound[0], bound[1]))
    try:
        await stop.wait()
    finally:
        server.close()
        http.close_all()
        agent.close()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD):
            loop.remove_signal_handler(sig)


def _skip_ssl() -> None:
    """Keep ``ssl`` out of the agent: asyncio imports it eagerly, which maps libssl and libcrypto
    (~6.5 MiB of RSS, ~50 ms of start-up) for an agent that only speaks plain HTTP. asyncio treats a
    failed ``import ssl`` as "no TLS support". Only done when nothing has imported ssl yet."""
    if "ssl" not in sys.modules and "asyncio" not in sys.modules:
        sys.modules["ssl"] = None  # type: ignore[assignment]


def main(argv: list[str] | None = None) -> None:
    """Run the agent (blocks until SIGTERM/SIGINT)."""
    try:
        options = parse_args(sys.argv[1:] if argv is None else argv)
    except UsageError as exc:
        if str(exc):
            print(f"warren-guest: {exc}", file=sys.stderr)
        print(_USAGE, file=sys.stderr)
        raise SystemExit(2 if str(exc) else 0) from None
    _skip_ssl()
    import asyncio
    import logging
    import selectors

    logging.basicConfig(
        level=getattr(logging, options.log_level, logging.WARNING),
        stream=sys.stderr,
        format="warren-guest %(levelname)s %(message)s",
    )
    _lower_own_oom_score()
    loop = asyncio.SelectorEventLoop(selectors.PollSelector())
    asyncio.set_event_loop(loop)
    try:
        loop.run_until_complete(serve(options))
    finally:
        # Connection handlers still running (long streams) are cancelled and given a turn to end.
        pending = asyncio.all_tasks(loop)
        for task in pending:
            task.cancel()
        if pending:
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
