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
