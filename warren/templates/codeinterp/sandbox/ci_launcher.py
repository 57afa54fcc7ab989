"""Starts an ipykernel for the code-interpreter server (its kernel spec's argv); never imported by warren.

The one change to ``python -m ipykernel_launcher``: IOPub's fork pipe is off. ipykernel binds it to a
random loopback TCP port (to forward output of forked children), and gVisor cannot checkpoint a listening
TCP socket that a thread waits on ("endpoint still has waiters upon save"), so a template sealed as a
memory snapshot with its kernel started could not be made. The kernel's own channels use ZMQ's ``ipc``
transport for the same reason (``ci_kernels``).
"""

from __future__ import annotations

from typing import Any

import ipykernel.iostream
from ipykernel import kernelapp

_init = ipykernel.iostream.IOPubThread.__init__


def _without_pipe(self: Any, socket: Any, pipe: bool = False, session: Any = False) -> None:
    _init(self, socket, pipe=False, session=session)


ipykernel.iostream.IOPubThread.__init__ = _without_pipe

if __name__ == "__main__":
    kernelapp.launch_new_instance()
