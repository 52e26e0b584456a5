"""The node's own health check (`manage.py healthcheck`, the Docker HEALTHCHECK) past its own
front door.

`server.allowed_cidrs` may leave out loopback (a node that only its LAN may reach), and the
health check runs on loopback inside the container: refused there, it would get a working node
restarted. So the check carries a credential only what holds the node's secret key can make
(the same config and store, or `$DJANGO_SECRET_KEY`), and the front door admits it from a
loopback peer on `/healthz` and `/readyz` alone. A loopback caller without it is refused as
before, and the credential opens no other route. It is derived from the secret key, never the
key itself, so a probe that leaks it leaks nothing else.
"""

from __future__ import annotations

from django.utils.crypto import salted_hmac

HEALTHCHECK_HEADER = b"x-router-healthcheck"
HEALTHCHECK_PATHS = frozenset({"/healthz", "/readyz"})
_SALT = "router.healthcheck"


def healthcheck_credential(*, secret: str | None = None) -> str:
    """The value of the health check's header: from the node's secret key (settings' by
    default)."""
    return salted_hmac(_SALT, "own-front-door", secret=secret, algorithm="sha256").hexdigest()
