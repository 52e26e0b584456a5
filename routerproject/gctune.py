"""Garbage-collector settings for the long-running router process.

The router keeps a large, long-lived object graph (settings, Django, the registry view) and
allocates many short-lived objects per request. With CPython's defaults, full collections
walk the whole long-lived graph every few thousand allocations: measured here, they turned a
20 ms registry rebuild into a 130 ms one and showed up in the proxy's p99. Freezing what
startup built moves it out of the collector's view, and a larger first-generation threshold
makes collections rarer without letting garbage pile up (reference cycles are rare on the
request path).
"""

from __future__ import annotations

import gc
import sys

# CPython hands the GIL between threads every 5 ms by default: a worker thread writing a batch
# of rows (analytics, the decision log) could hold the event loop off for that long. 1 ms keeps
# the loop's worst lag under its 5 ms budget while batches flush (bench/queue.py).
SWITCH_INTERVAL_SECS = 0.001
GEN0_THRESHOLD = 50_000
GEN1_THRESHOLD = 20
GEN2_THRESHOLD = 20


def tune_gc() -> None:
    """Freeze what startup built and collect from here on (manage.py starts a node without)."""
    sys.setswitchinterval(SWITCH_INTERVAL_SECS)
    gc.collect()
    gc.freeze()
    gc.set_threshold(GEN0_THRESHOLD, GEN1_THRESHOLD, GEN2_THRESHOLD)
    gc.enable()


def disable_twisted_form_parsing() -> None:
    """Stop Twisted parsing POST bodies as HTML forms under Daphne.

    Twisted's Request parses the Content-Type of every POST through `email.message` (about 7%
    of the router's CPU, measured with py-spy) and, for multipart uploads, the whole body into
    `request.args`. Daphne never reads `args`: it hands the raw body to the ASGI app. Turning
    the parse off changes nothing the app sees.
    """
    from daphne.http_protocol import WebRequest

    if getattr(WebRequest, "_router_no_form_parse", False):
        return
    original = WebRequest.__init__

    def init(self: WebRequest, *args: object, **kwargs: object) -> None:
        original(self, *args, **kwargs)
        self._parsePOSTFormSubmission = False

    WebRequest.__init__ = init
    WebRequest._router_no_form_parse = True


def disable_twisted_access_log() -> None:
    """Skip Twisted's own access-log line, which Daphne never shows.

    Twisted's HTTPFactory formats a combined-log line for every request and hands it to
    Twisted's logging, which Daphne routes to nowhere (it keeps its own access log through
    `action_logger`): measured at ~2.5% of a master's CPU under load, for nothing.
    """
    from daphne.http_protocol import HTTPFactory

    def log(self: HTTPFactory, request: object) -> None:
        return None

    HTTPFactory.log = log
