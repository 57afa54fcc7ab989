"""The warren guest agent: an envd-compatible HTTP/1.1 + Connect server that runs inside every sandbox.

Standard library only, and it imports nothing from ``warren`` outside this package: the package is
bundled with the host CPython and bind-mounted read-only at ``/.agent``, where it is launched as
``/.agent/bin/python3 -S -E -B -u`` with ``/.agent/pkg`` on ``sys.path``. ``main.main`` is the entry
point; ``python -m warren.guest --host 127.0.0.1 --port N`` runs it on the host for tests.

Modules:
    main        command line, event loop (poll(2), never epoll), signal handling
    state       the ``Agent`` state object built in ``main`` and passed down
    server      a small HTTP/1.1 server on asyncio streams (chunked bodies, keep-alive)
    routes      the top-level router: auth, /health, /init, /envs, /metrics, /files, Connect RPCs
    connect     the Connect protocol (JSON codec): unary and streaming calls, envelopes, errors
    errors      ``RpcError`` and the OS-error to Connect-code table
    users       passwd/group parsing and path resolution against a user's home
    process     child processes: spawn, output fan-out, stdin, PTY, exit, timeouts
    process_rpc the ``process.Process`` service
    filesystem  the ``filesystem.Filesystem`` service and ``EntryInfo``
    watch       directory watching through inotify (ctypes), with a polling fallback
    files       ``GET``/``POST /files``: streamed downloads and uploads, signatures
    multipart   a streaming multipart/form-data parser
    metrics     ``GET /metrics`` from /proc and statvfs
"""

ENVD_VERSION = "0.6.4"
"""The envd version whose behaviour this agent implements."""
