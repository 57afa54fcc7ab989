"""The warren error tree. Every module translates low-level errors into these at its edge.

    WarrenError
    ├── InvalidRequestError      the caller sent something malformed (400)
    ├── AuthenticationError      missing or wrong API key / access token (401)
    ├── ForbiddenError           authenticated, but not allowed (a path outside the import roots) (403)
    ├── NotFoundError            no such sandbox, template, file (404)
    ├── ConflictError            the object exists, or is in a state that forbids the action (409)
    │   └── InvalidStateError    lifecycle transition not allowed from the current state
    ├── PayloadTooLargeError     a body or blob over the node's size cap (413)
    ├── GoneError                it existed, and never will again: a sandbox lost with its node (410)
    ├── TooManyRequestsError     a node cap is reached: concurrent sandboxes (429)
    ├── UnavailableError         the node refuses work right now (draining, overloaded) (503)
    └── HostError                the host failed us (runtime, network, disk): 500
        └── RuntimeFailure       a runtime command or sandbox start failed

``api/errors.py`` is the single place these become HTTP statuses.
"""

from __future__ import annotations


class WarrenError(Exception):
    """Base class of every error warren raises on purpose."""


class InvalidRequestError(WarrenError):
    """The request is malformed or names impossible values."""


class AuthenticationError(WarrenError):
    """Missing or wrong credentials."""


class ForbiddenError(WarrenError):
    """The caller is authenticated but the node's configuration does not allow this."""


class NotFoundError(WarrenError):
    """The named object does not exist."""


class ConflictError(WarrenError):
    """The object exists already, or its state forbids the action."""


class InvalidStateError(ConflictError):
    """A lifecycle action is not allowed from the sandbox's current state."""


class PayloadTooLargeError(WarrenError):
    """A request body (an upload) is larger than the node accepts."""


class GoneError(WarrenError):
    """The object existed and is gone for good (a running sandbox on a node that died)."""


class TooManyRequestsError(WarrenError):
    """A node cap is reached (E2B's 429: the maximum number of concurrent sandboxes)."""


class UnavailableError(WarrenError):
    """The node cannot take this work now (draining, missing capability)."""


class HostError(WarrenError):
    """The host failed: a command, the network, the disk. Not the caller's fault."""


class RuntimeFailure(HostError):
    """A runtime command (runc, runsc, ip, nft, mount) failed, or a sandbox did not come up."""
