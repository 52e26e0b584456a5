"""`manage.py healthcheck [--live]`: ask this node's own `/readyz` (or `/healthz`), exit 0 when
it answers 200 and 1 otherwise. The Dockerfile's HEALTHCHECK runs it; the address comes from
the node's config (`server.bind`), so a container with its own config needs no other setting.
It carries the credential of the node's secret key (proxy.edge.selfcheck), so it passes the
front door even when `server.allowed_cidrs` leaves out loopback.
"""

from __future__ import annotations

import json
import ssl
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from proxy.edge.selfcheck import HEALTHCHECK_HEADER, healthcheck_credential

TIMEOUT_SECS = 5.0


def probe_url(path: str) -> str:
    server = settings.ROUTER.server
    host = server.host
    # A wildcard bind is reached on loopback from inside the container.
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    if ":" in host:
        host = f"[{host}]"
    scheme = "https" if server.tls_cert_file is not None else "http"
    return f"{scheme}://{host}:{server.port}{path}"


def _own_tls() -> ssl.SSLContext:
    # The node asks itself over loopback, an address its certificate need not name, and sends
    # no secret: whether it answers is the question, not who it is.
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


class Command(BaseCommand):
    help = "Exit 0 when this node's /readyz (or /healthz with --live) answers 200."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--live", action="store_true", help="ask /healthz: the process serves")
        parser.add_argument("--config", help="config file (read by manage.py)")

    def handle(self, *args: Any, **options: Any) -> None:
        code = check(live=options["live"], out=self.stdout.write, err=self.stderr.write)
        if code:
            sys.exit(code)


def check(*, live: bool, out: Callable[[str], Any], err: Callable[[str], Any]) -> int:
    """Ask the node; 0 when it answers 200. It needs the settings (the config and the secret
    key) but none of Django's apps, so manage.py runs it without setting them up."""
    url = probe_url("/healthz" if live else "/readyz")
    request = urllib.request.Request(
        url, headers={HEALTHCHECK_HEADER.decode(): healthcheck_credential()}
    )
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_SECS, context=_own_tls()) as resp:
            body = resp.read()
            status = resp.status
    except urllib.error.HTTPError as exc:
        body, status = exc.read(), exc.code
    except (OSError, urllib.error.URLError) as exc:
        err(f"{url}: {exc}")
        return 1
    if status != 200:
        try:
            detail = json.dumps(json.loads(body).get("checks", {}))
        except (ValueError, AttributeError):
            detail = body[:200].decode("utf-8", "replace")
        err(f"{url}: HTTP {status} {detail}")
        return 1
    out(f"{url}: ok")
    return 0
