"""Suite-wide ordering: the slowest test files start first.

Under pytest-xdist (`--dist loadfile`, as ./scripts/test runs it) each file goes whole to one
worker, in collection order; a long file handed out last would leave the other workers idle
while it runs. The order comes from tests/durations.json, seconds per file as measured by a
run with ROUTER_TEST_DURATIONS=write; a file it does not name yet counts as slow, so a new
integration file is not left for last. Within a file, pytest-randomly's shuffle is kept.
"""

from __future__ import annotations

import functools
import json
import ssl
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx._transports.default as httpx_transport
import pytest

DURATIONS = Path(__file__).resolve().parent / "tests" / "durations.json"
WRITE_ENV = "ROUTER_TEST_DURATIONS"


def _known() -> dict[str, float]:
    try:
        loaded: dict[str, float] = json.loads(DURATIONS.read_text())
    except FileNotFoundError:
        return {}
    return loaded


def _share_default_tls_context() -> None:
    """Every `httpx.Client()` builds a TLS context and loads the CA bundle into it: 37 ms of CPU
    here, even for the plain-HTTP clients the tests open by the thousand. The tests' default
    context (verify=True, no client certificate) is built once; any other is built as before."""
    build = httpx_transport.create_ssl_context
    default = functools.cache(lambda: build())

    def create_ssl_context(
        verify: Any = True, cert: Any = None, trust_env: bool = True
    ) -> ssl.SSLContext:
        if verify is True and cert is None and trust_env:
            return default()
        return build(verify=verify, cert=cert, trust_env=trust_env)

    httpx_transport.create_ssl_context = create_ssl_context


_share_default_tls_context()


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    known = _known()
    unknown = max(known.values(), default=0.0)
    # sort() is stable: tests of one file keep their (shuffled) order and stay together.
    items.sort(key=lambda item: -known.get(item.nodeid.split("::", 1)[0], unknown))


class _Recorder:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[report.nodeid.split("::", 1)[0]] += report.duration

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if hasattr(session.config, "workerinput"):
            return  # the controller writes, from every worker's reports
        ranked = sorted(self.seconds.items(), key=lambda kv: -kv[1])
        DURATIONS.write_text(json.dumps({f: round(s, 1) for f, s in ranked}, indent=1) + "\n")


def pytest_configure(config: pytest.Config) -> None:
    import os

    if os.environ.get(WRITE_ENV) == "write":
        config.pluginmanager.register(_Recorder(), "router-durations")
