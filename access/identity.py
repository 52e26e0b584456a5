"""Who sent a request, as the front door decided it from the key the request carried.

The edge puts one `Caller` in the ASGI scope under `CALLER_SCOPE_KEY` for every request it
lets through; the management views read it to name the actor of an audit row, the proxy to
scope models, count usage and (with fair share) queue the request under its key.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

CALLER_SCOPE_KEY = "router.caller"

# `Caller.kind` values.
STORED = "stored"  # a key from access_api_keys (name is the key's name)
CONFIG = "config"  # a key from auth.inference_keys / auth.admin_keys
ADMIN_USER = "admin_user"  # a signed-in Django admin user (name is the username)
MASTER = "master"  # the master, over the node protocol with the cluster token
ANONYMOUS = "anonymous"  # a node with no keys configured

CONFIG_ACTOR = "config key"
MASTER_ACTOR = "master"


@dataclass(frozen=True, slots=True)
class Caller:
    kind: str
    name: str | None = None
    role: str | None = None
    # Public model IDs the key may ask for; None = all.
    models: frozenset[str] | None = None
    # The stored key's limits (None = unlimited) and its weight in fair share.
    rpm: int | None = None
    tpm: int | None = None
    max_concurrent: int | None = None
    share: float = 1.0

    @property
    def key_name(self) -> str | None:
        """The name usage rows and metrics carry: only stored keys have one."""
        return self.name if self.kind == STORED else None

    @property
    def actor(self) -> str:
        """How an audit row names this caller."""
        if self.kind in (STORED, ADMIN_USER) and self.name:
            return self.name
        if self.kind == MASTER:
            return MASTER_ACTOR
        return CONFIG_ACTOR

    def may_use(self, public_model_id: str) -> bool:
        return self.models is None or public_model_id in self.models


ANONYMOUS_CALLER = Caller(kind=ANONYMOUS)


def caller_of(scope: dict[str, Any] | Any) -> Caller:
    """The caller the edge recorded for `scope` (anonymous when it recorded none)."""
    found = scope.get(CALLER_SCOPE_KEY) if isinstance(scope, dict) else None
    return found if isinstance(found, Caller) else ANONYMOUS_CALLER
