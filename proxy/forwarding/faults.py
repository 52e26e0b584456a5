"""The fault rules of forwarding: which failures mean a request never reached its target.

Only a request that never reached its target may run again elsewhere (failover, in the serving
core): a refused connection, or one reset while the request was still being written. A backend
that refused the connection or exited is gone and is started again; a pooled connection it had
closed is not.
"""

from __future__ import annotations

import aiohttp

from routerproject.errors import RouterError


class NotSent(RouterError):
    """The request never reached its target: the connection was refused, or reset while the
    request was still being written. It cannot have run there, so it may go to another
    replica (or the restarted backend) once; every other failure is answered as it is."""


class SentBody(aiohttp.BytesPayload):
    """A request body that notes when it has been handed over whole.

    An inference server runs nothing before it has the whole body, so a connection that
    failed while the body was still being written cannot have run the request anywhere.
    """

    written = False

    async def write_with_length(
        self, writer: aiohttp.abc.AbstractStreamWriter, content_length: int | None
    ) -> None:
        await super().write_with_length(writer, content_length)
        self.written = True


def never_sent(exc: BaseException, body: SentBody | None = None) -> bool:
    """Whether an aiohttp failure happened before the whole request was handed over."""
    if isinstance(exc, aiohttp.ClientConnectorError):
        return True  # no connection: refused, unreachable, reset during the handshake
    # Reset or closed while the body was still being written (a read of the answer can
    # notice the reset first, so the body's own record decides, not the exception's wording).
    return (
        body is not None
        and not body.written
        and isinstance(exc, (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError))
    )


def backend_gone(exc: BaseException, *, died: bool) -> bool:
    """Whether a request that never reached its backend shows the backend itself is gone.

    A refused connection or an exited process is; a pooled connection the backend had closed
    (reset while the request was being written, the process still running) is not: that
    backend is fine, and reloading it would cost a whole model load for nothing.
    """
    return died or isinstance(exc, aiohttp.ClientConnectorError)


def cut_off(exc: BaseException) -> bool:
    """The connection closed or was reset before any answer (a crashed backend does that)."""
    return isinstance(exc, (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError))
