"""`python -m proxy.sim`: the simulated backend, with llama-server's command line."""

from __future__ import annotations

import time

# Taken before the server's imports so that the simulated load time counts from as
# close to process start as Python allows, like a real server's would.
_STARTED_AT = time.monotonic()

import sys  # noqa: E402

from proxy.sim.server import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(started_at=_STARTED_AT))
