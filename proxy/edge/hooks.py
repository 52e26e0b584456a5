"""What the node's own HTTP server offers its app beyond plain ASGI: being told at once that a
client went away.

Plain ASGI tells an app that its client left only through `receive()`, so an app that wants to
stop work for a departed client must keep a task waiting on it for every request: a task, a
future and a cancellation per request, about 3% of the router's instructions per proxied
request (callgrind). The node's server (`proxy.edge.cycle.RouterCycle`) advertises
`DISCONNECT_WATCH` in `scope["extensions"]`; the app then sends it a `DisconnectWatch` in a
message of that type, and the server fires it once if the connection is lost before the
answer is complete. Under any other server the app keeps its watching task.

The server's other offer, a whole answer in one message, is `proxy.request.WHOLE_ANSWER`: the
request context that sends it lives below the edge.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

logger = logging.getLogger(__name__)

DISCONNECT_WATCH = "router.disconnect_watch"


class DisconnectWatch:
    """A callback the server runs once, if the client goes away before its answer is complete.

    The app cancels it when its request is over, which also drops the callback: the server's
    request cycle holds the watch, and the callback (which holds the request) must not hold the
    cycle in a reference loop past the request's end.
    """

    __slots__ = ("callback",)

    def __init__(self, callback: Callable[[], None]) -> None:
        self.callback: Callable[[], None] | None = callback

    def fire(self) -> None:
        callback, self.callback = self.callback, None
        if callback is None:
            return
        try:
            callback()
        except Exception:
            # It runs inside the server's connection handling, which must go on regardless.
            logger.exception("a disconnect watch failed")

    def cancel(self) -> None:
        self.callback = None
