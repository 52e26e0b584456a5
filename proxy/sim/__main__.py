"""`python -m proxy.sim`: the simulated backend, with llama-server's command line."""

from __future__ import annotations

import time

# Taken before the server's imports so that the simulated load time counts from as
# close to process start as Python allows, like a real server's would.
_STARTED_AT = time.monotonic()

import os  # noqa: E402
import sys  # noqa: E402

# The simulator speaks plain HTTP and opens no TLS connection, yet importing aiohttp builds two
# client TLS contexts, each parsing the system's CA bundle: a fifth of a sim's start (the
# test suite starts a few hundred). With no bundle to read, the contexts are built empty.
os.environ["SSL_CERT_FILE"] = os.devnull
os.environ["SSL_CERT_DIR"] = os.devnull

from proxy.sim.server import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(started_at=_STARTED_AT))
