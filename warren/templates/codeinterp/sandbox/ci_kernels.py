"""Kernels of the code-interpreter server: one Jupyter kernel per context, executions serialised per context.

Runs inside the sandbox with the template's venv (jupyter_client, ipykernel); never imported by warren.
A context owns a kernel (``jupyter_client.KernelManager``) and a blocking client; :meth:`Context.execute`
holds the context's lock for the whole execution, so two calls on one context run one after the other.
Each Jupyter message of the execution becomes one output record, in the order the kernel sent them:

    {"type": "number_of_executions", "execution_count": N}
    {"type": "stdout" | "stderr", "text": ..., "timestamp": <ns since the epoch>}
    {"type": "result", "is_main_result": bool, "text": ..., "png": ..., "data": ..., ...}
    {"type": "error", "name": ..., "value": ..., "traceback": ...}
    {"type": "end_of_execution"}
"""

from __future__ import annotations

import json
import os
import queue
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager

LANGUAGES = {"python": "warren-python3"}
"""Languages this template runs, and their kernel spec."""
START_TIMEOUT_S = 60.0
IPC_DIR = os.path.join(os.environ.get("XDG_RUNTIME_DIR") or "/tmp", "warren-ci")
KERNELS_DIR = os.path.join(IPC_DIR, "kernels")
LAUNCHER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ci_launcher.py")


def kernel_specs() -> KernelSpecManager:
    """The one kernel spec: this venv's python running ``ci_launcher.py`` (ipykernel, no fork pipe)."""
    spec_dir = os.path.join(KERNELS_DIR, "warren-python3")
    os.makedirs(spec_dir, mode=0o700, exist_ok=True)
    spec = {"argv": [sys.executable, LAUNCHER, "-f", "{connection_file}"], "display_name": "Python 3",
            "language": "python", "metadata": {"debugger": False}}
    with open(os.path.join(spec_dir, "kernel.json"), "w") as fh:
        json.dump(spec, fh)
    return KernelSpecManager(kernel_dirs=[KERNELS_DIR])
POLL_S = 1.0

MIME_FIELDS = {
    "text/plain": "text",
    "text/html": "html",
    "text/markdown": "markdown",
    "image/svg+xml": "svg",
    "image/png": "png",
    "image/jpeg": "jpeg",
    "application/pdf": "pdf",
    "text/latex": "latex",
    "application/json": "json",
    "application/javascript": "javascript",
    "e2b/data": "data",
}

# Run silently in every new kernel: data frames also as a dict ("e2b/data", as E2B's template does), and
# the helpers that set env vars for one execution and put them back afterwards.
SETUP_CODE = r"""
def __warren_setup():
    import IPython
    from IPython.core.formatters import BaseFormatter
    from traitlets import ObjectName, Unicode

    class DataFormatter(BaseFormatter):
        format_type = Unicode("e2b/data")
        print_method = ObjectName("_repr_e2b_data_")
        _return_type = (dict, str)

    shell = IPython.get_ipython()
    formatter = DataFormatter(parent=shell.display_formatter)
    for module in ("pandas", "pandas.core.frame"):  # DataFrame.__module__ is "pandas" in pandas >= 2.2
        formatter.for_type_by_name(module, "DataFrame", lambda df: df.to_dict(orient="list"))
    shell.display_formatter.formatters["e2b/data"] = formatter
    active = getattr(shell.display_formatter, "active_types", None)
    if isinstance(active, list) and "e2b/data" not in active:
        active.append("e2b/data")

def __warren_env_push(values):
    import os
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    return saved

def __warren_env_pop(saved):
    import os
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v

__warren_setup()
del __warren_setup
"""


class ContextError(Exception):
    """A request about contexts that cannot be served; ``status`` is the HTTP status to answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def now_ns() -> int:
    return time.time_ns()


def _timestamp(header: Mapping[str, Any]) -> int:
    date = header.get("date")
    stamp = getattr(date, "timestamp", None)
    return int(stamp() * 1e9) if callable(stamp) else now_ns()


def result_record(content: Mapping[str, Any], main: bool) -> dict[str, Any]:
    """A ``display_data`` / ``execute_result`` message's bundle as the SDK's ``Result`` fields."""
    record: dict[str, Any] = {"type": "result", "is_main_result": main}
    extra: dict[str, Any] = {}
    for mime, value in dict(content.get("data") or {}).items():
        field = MIME_FIELDS.get(mime)
        if field is None:
            extra[mime] = value
        else:
            record[field] = value
    text = record.get("text")
    if isinstance(text, str) and len(text) >= 2 and text[0] == text[-1] == "'":
        record["text"] = text[1:-1]  # E2B's server gives a str result without its repr quotes
    if extra:
        record["extra"] = extra
    return record


class Context:
    """One kernel: a context the SDK names by id."""

    def __init__(self, context_id: str, language: str, cwd: str, env: Mapping[str, str]) -> None:
        self.id = context_id
        self.language = language
        self.cwd = cwd
        self._env = dict(env)
        self._lock = threading.Lock()
        self._km: KernelManager | None = None
        self._kc: Any = None

    def describe(self) -> dict[str, str]:
        return {"id": self.id, "language": self.language, "cwd": self.cwd}

    def start(self) -> None:
        with self._lock:
            self._start()

    def _start(self) -> None:
        # ZMQ over unix sockets, not loopback TCP: gVisor cannot checkpoint a listening TCP socket that
        # libzmq waits on ("endpoint still has waiters upon save"), and the template is sealed that way.
        os.makedirs(IPC_DIR, mode=0o700, exist_ok=True)
        km = KernelManager(kernel_name=LANGUAGES[self.language], kernel_spec_manager=kernel_specs(),
                           transport="ipc", ip=os.path.join(IPC_DIR, f"kernel-{self.id}"))
        os.makedirs(self.cwd, exist_ok=True)
        km.start_kernel(cwd=self.cwd, env={**os.environ, **self._env})
        kc = km.client()
        kc.start_channels()
        try:
            kc.wait_for_ready(timeout=START_TIMEOUT_S)
        except RuntimeError:
            kc.stop_channels()
            km.shutdown_kernel(now=True)
            raise
        self._km, self._kc = km, kc
        self._silent(SETUP_CODE)

    def _stop(self) -> None:
        if self._kc is not None:
            self._kc.stop_channels()
        if self._km is not None:
            try:
                self._km.shutdown_kernel(now=True)
            except Exception:
                pass
        self._km = self._kc = None

    def restart(self) -> None:
        with self._lock:
            self._stop()
            self._start()

    def shutdown(self) -> None:
        with self._lock:
            self._stop()

    def _silent(self, code: str) -> None:
        """Run ``code`` without output or history and wait for its reply."""
        msg_id = self._kc.execute(code, silent=True, store_history=False, allow_stdin=False)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                reply = self._kc.get_shell_msg(timeout=POLL_S)
            except queue.Empty:
                continue
            if reply.get("parent_header", {}).get("msg_id") == msg_id:
                return
        raise RuntimeError("the kernel did not answer a setup request")

    def execute(
        self,
        code: str,
        env_vars: Mapping[str, str],
        emit: Callable[[dict[str, Any]], bool],
        gone: Callable[[], bool] = lambda: False,
    ) -> None:
        """Run ``code``, calling ``emit`` with each output record in order; ``emit`` returns False once
        the client is gone, as ``gone`` does while the kernel is quiet (the SDK's execution timeout closes
        the connection): the kernel is then interrupted and the execution drained."""
        with self._lock:
            if self._km is None or not self._km.is_alive():
                self._stop()
                self._start()
            pushed = bool(env_vars)
            if pushed:
                encoded = json.dumps(dict(env_vars))
                self._silent(f"__warren_saved = __warren_env_push(__import__('json').loads({encoded!r}))")
            interrupted = False

            def interrupt() -> None:
                nonlocal interrupted, emit
                if not interrupted and self._km is not None:
                    interrupted = True
                    self._km.interrupt_kernel()
                    emit = _discard

            try:
                for record in self._run(code, lambda: not interrupted and gone()):
                    if record.get("type") == "_idle":
                        interrupt()
                    elif not emit(record):
                        interrupt()
            finally:
                if pushed and self._km is not None and self._km.is_alive():
                    self._silent("__warren_env_pop(__warren_saved)")

    def _run(self, code: str, gone: Callable[[], bool]) -> Iterator[dict[str, Any]]:
        """The execution's records; ``{"type": "_idle"}`` (not for the client) when ``gone`` says so."""
        msg_id = self._kc.execute(code, silent=False, store_history=True, allow_stdin=False)
        while True:
            try:
                msg = self._kc.get_iopub_msg(timeout=POLL_S)
            except queue.Empty:
                if gone():
                    yield {"type": "_idle"}
                if self._km is not None and not self._km.is_alive():
                    yield {"type": "error", "name": "DeadKernelError", "traceback": "",
                           "value": "the kernel died while executing the code; its state is lost"}
                    yield {"type": "end_of_execution"}
                    return
                continue
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind, content = msg.get("msg_type"), msg.get("content") or {}
            if kind == "execute_input":
                yield {"type": "number_of_executions", "execution_count": content.get("execution_count")}
            elif kind == "stream":
                stream = "stderr" if content.get("name") == "stderr" else "stdout"
                yield {"type": stream, "text": content.get("text", ""), "timestamp": _timestamp(msg["header"])}
            elif kind == "display_data":
                yield result_record(content, False)
            elif kind == "execute_result":
                yield result_record(content, True)
            elif kind == "error":
                yield {"type": "error", "name": content.get("ename", ""), "value": content.get("evalue", ""),
                       "traceback": "\n".join(content.get("traceback") or [])}
            elif kind == "status" and content.get("execution_state") == "idle":
                yield {"type": "end_of_execution"}
                return


def _discard(_record: dict[str, Any]) -> bool:
    return True


class Contexts:
    """Every context of the sandbox; ``python`` has a default context, started with the server."""

    def __init__(self, default_cwd: str = "/home/user") -> None:
        self._lock = threading.Lock()
        self._contexts: dict[str, Context] = {}
        self._defaults: dict[str, str] = {}
        self._default_cwd = default_cwd
        self.sandbox_env: dict[str, str] = {}

    def start_default(self, language: str = "python") -> Context:
        return self.default_for(language)

    def default_for(self, language: str) -> Context:
        language = self._check_language(language)
        with self._lock:
            existing = self._defaults.get(language)
            if existing is not None:
                return self._contexts[existing]
        context = self.create(language, None, default=True)
        return context

    def create(self, language: str | None, cwd: str | None, *, default: bool = False) -> Context:
        language = self._check_language(language or "python")
        context = Context(str(uuid.uuid4()), language, cwd or self._default_cwd, self.sandbox_env)
        context.start()
        with self._lock:
            if default and language in self._defaults:  # another request made it meanwhile
                context.shutdown()
                return self._contexts[self._defaults[language]]
            self._contexts[context.id] = context
            if default:
                self._defaults[language] = context.id
        return context

    def get(self, context_id: str) -> Context:
        with self._lock:
            context = self._contexts.get(context_id)
            if context is None and context_id in LANGUAGES:
                default = self._defaults.get(context_id)
                context = self._contexts.get(default) if default else None
        if context is None:
            raise ContextError(404, f"Context {context_id} not found")
        return context

    def list(self) -> list[dict[str, str]]:
        with self._lock:
            return [c.describe() for c in self._contexts.values()]

    def remove(self, context_id: str) -> None:
        context = self.get(context_id)
        with self._lock:
            self._contexts.pop(context.id, None)
            for language, cid in list(self._defaults.items()):
                if cid == context.id:
                    del self._defaults[language]
        context.shutdown()

    @staticmethod
    def _check_language(language: str) -> str:
        name = language.strip().lower()
        if name not in LANGUAGES:
            raise ContextError(400, f"language {language!r} is not supported by this template; "
                               f"supported: {', '.join(sorted(LANGUAGES))}")
        return name
