"""The audit log: one `audit_log` row per management write, naming who changed what.

Every write path calls `record` (or one of the request helpers) once the write has succeeded,
so a write refused by validation leaves no row. Before and after are the thing's state as plain
JSON; any field whose name says it holds a secret is dropped from them before they are stored
(`scrub`), so neither a key nor its hash can reach the table, the API or the admin.

Who the actor is comes from the request: the front door's `Caller` (a stored key's name,
`config key`, `master`), or the signed-in Django user for the admin and session pages.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

from channels.db import database_sync_to_async
from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import transaction
from django.db.models import Q

from access.identity import ADMIN_USER, ANONYMOUS, CONFIG, MASTER_ACTOR, caller_of
from access.models import AuditEntry
from routerproject import request_ids

# A field whose name has one of these words (split at `_`, `-` and case changes) is never
# stored. Whole words, not substrings: `tokens_per_second` is no secret, but `token` and
# `key_hash` are. `key` alone is the one-time secret in an API-key answer.
SECRET_WORDS = frozenset(
    {"key", "keys", "token", "tokens", "secret", "secrets", "password", "passwd", "hash"}
)
SECRET_WORDS |= {"authorization", "credential", "credentials", "cookie"}
_WORD_RE = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])")

T = TypeVar("T")

ACTOR_MAX_CHARS = 150
ACTION_MAX_CHARS = 64
TARGET_MAX_CHARS = 512
REQUEST_ID_MAX_CHARS = 128
ROW_FIELDS = ("at_ms", "actor", "action", "target", "before", "after", "node_id", "request_id")


def is_secret_name(name: str) -> bool:
    """Whether a field called `name` may hold a secret (and so is never stored)."""
    return any(word.lower() in SECRET_WORDS for word in _WORD_RE.findall(name))


class _Encoder(DjangoJSONEncoder):
    """Django's JSON (ISO times, decimals, UUIDs); anything else, such as a related object in
    an admin form's state, as its text."""

    def default(self, o: Any) -> Any:
        try:
            return super().default(o)
        except TypeError:
            return str(o)


def scrub(value: Any) -> Any:
    """`value` as plain JSON, with every field named like a secret left out, at any depth."""
    plain = json.loads(json.dumps(value, cls=_Encoder))
    return _without_secrets(plain)


def _without_secrets(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_secrets(v) for k, v in value.items() if not is_secret_name(str(k))}
    if isinstance(value, list):
        return [_without_secrets(item) for item in value]
    return value


def _now_ms() -> int:
    # Stored at whole milliseconds, so a row's `at_ms` is exact and a paging cursor built from
    # it finds the row again.
    return int(datetime.now(UTC).timestamp() * 1000)


def this_node_id() -> str:
    return str(settings.ROUTER.cluster.node_id)


def record(
    *,
    actor: str,
    action: str,
    target: str,
    before: Any = None,
    after: Any = None,
    request_id: str | None = None,
    node_id: str | None = None,
    at_ms: int | None = None,
) -> AuditEntry:
    """Store one audit row. `request_id` defaults to the ID of the request being served."""
    at = datetime.fromtimestamp((at_ms if at_ms is not None else _now_ms()) / 1000, tz=UTC)
    return AuditEntry.objects.create(
        at=at,
        actor=actor[:ACTOR_MAX_CHARS],
        action=action[:ACTION_MAX_CHARS],
        target=target[:TARGET_MAX_CHARS],
        before=scrub(before),
        after=scrub(after),
        node_id=node_id if node_id is not None else this_node_id(),
        request_id=(request_id or request_ids.current() or "")[:REQUEST_ID_MAX_CHARS],
    )


arecord = database_sync_to_async(record)


# -- who asked ---------------------------------------------------------------------------------


def _django_request(request: Any) -> Any:
    # A DRF Request wraps Django's; the admin hands Django's own.
    return getattr(request, "_request", request)


def request_id_of(request: Any) -> str:
    """The ID of the request being served, else the `X-Request-Id` the request carries."""
    found = request_ids.current()
    if found:
        return found
    headers = getattr(_django_request(request), "headers", None)
    return str(headers.get("X-Request-Id", "")) if headers is not None else ""


def _username(user: Any) -> str | None:
    if user is not None and getattr(user, "is_authenticated", False):
        name = user.get_username()
        return str(name) if name else None
    return None


def actor_of(request: Any) -> str:
    """Who made `request`: the caller the front door recorded, else the signed-in Django user.

    Sync only (the admin, sync views): reading `request.user` may query the database.
    """
    caller = caller_of(getattr(_django_request(request), "scope", None))
    if caller.kind in (ANONYMOUS, CONFIG, ADMIN_USER):
        user = _username(getattr(_django_request(request), "user", None))
        if user:
            return user
    return caller.actor


async def aactor_of(request: Any) -> str:
    """`actor_of` for async views: the session user is read with `auser()`."""
    django_request = _django_request(request)
    caller = caller_of(getattr(django_request, "scope", None))
    if caller.kind in (ANONYMOUS, CONFIG, ADMIN_USER) and hasattr(django_request, "auser"):
        user = _username(await django_request.auser())
        if user:
            return user
    return caller.actor


def audit_request(request: Any, action: str, target: str, before: Any, after: Any) -> AuditEntry:
    """Record a write made by `request` (a DRF or Django request), from sync code."""
    return record(
        actor=actor_of(request),
        action=action,
        target=target,
        before=before,
        after=after,
        request_id=request_id_of(request),
    )


async def aaudit_request(
    request: Any, action: str, target: str, before: Any, after: Any
) -> AuditEntry:
    """Record a write made by `request` from an async view."""
    actor = await aactor_of(request)
    return await arecord(
        actor=actor,
        action=action,
        target=target,
        before=before,
        after=after,
        request_id=request_id_of(request),
    )


def audited_write(
    *,
    actor: str,
    action: str | Callable[[Any], str],
    target: str,
    read: Callable[[], Any],
    write: Callable[[], T],
    request_id: str | None = None,
) -> T:
    """Run a database write and record it in one transaction: `read` gives the thing's state
    before and after, so no other write can slip between them, and the write stands only with
    its row. `action` may be chosen from the state before (`link.create` or `link.update`)."""
    with transaction.atomic():
        before = read()
        result = write()
        after = read()
        record(
            actor=actor,
            action=action(before) if callable(action) else action,
            target=target,
            before=before,
            after=after,
            request_id=request_id,
        )
    return result


async def aaudited_write(
    request: Any,
    *,
    action: str | Callable[[Any], str],
    target: str,
    read: Callable[[], Any],
    write: Callable[[], T],
) -> T:
    """`audited_write` for an async view, naming the actor and request from `request`."""
    actor = await aactor_of(request)
    result: T = await database_sync_to_async(audited_write)(
        actor=actor,
        action=action,
        target=target,
        read=read,
        write=write,
        request_id=request_id_of(request),
    )
    return result


async def arecord_push(action: str, target: str, before: Any, after: Any) -> AuditEntry | None:
    """On a slave: record what the master pushed, only when it changed what the slave runs."""
    if scrub(before) == scrub(after):
        return None
    return await arecord(
        actor=MASTER_ACTOR, action=action, target=target, before=before, after=after
    )


# -- reading -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cursor:
    """Where a page ended: rows strictly older (in `at_ms`, `node_id`, `id` order) come next."""

    at_ms: int
    row_id: int
    node_id: str

    def text(self) -> str:
        return f"{self.at_ms}:{self.row_id}:{self.node_id}"

    @classmethod
    def parse(cls, text: str) -> Cursor | None:
        parts = text.split(":", 2)
        if len(parts) != 3 or not parts[0].isdigit() or not parts[1].isdigit() or not parts[2]:
            return None
        return cls(at_ms=int(parts[0]), row_id=int(parts[1]), node_id=parts[2])


def row_cursor(row: dict[str, Any]) -> Cursor:
    return Cursor(at_ms=int(row["at_ms"]), row_id=int(row["id"]), node_id=str(row["node_id"]))


def row_dict(entry: AuditEntry) -> dict[str, Any]:
    return {
        "id": entry.pk,
        "at_ms": int(entry.at.timestamp() * 1000),
        "actor": entry.actor,
        "action": entry.action,
        "target": entry.target,
        "before": entry.before,
        "after": entry.after,
        "node_id": entry.node_id,
        "request_id": entry.request_id,
    }


def audit_query(
    *,
    since_ms: int | None = None,
    actor: str | None = None,
    action: str | None = None,
    before: Cursor | None = None,
    limit: int,
) -> list[dict[str, Any]]:
    """This node's rows, newest first (ties by node then id, the order pages follow)."""
    rows = AuditEntry.objects.all()
    if since_ms is not None:
        rows = rows.filter(at__gte=datetime.fromtimestamp(since_ms / 1000, tz=UTC))
    if actor:
        rows = rows.filter(actor=actor)
    if action:
        rows = rows.filter(action=action)
    if before is not None:
        at = datetime.fromtimestamp(before.at_ms / 1000, tz=UTC)
        rows = rows.filter(
            Q(at__lt=at)
            | Q(at=at, node_id__lt=before.node_id)
            | Q(at=at, node_id=before.node_id, id__lt=before.row_id)
        )
    rows = rows.order_by("-at", "-node_id", "-id")[:limit]
    return [row_dict(entry) for entry in rows]


def merge_rows(per_node: dict[str, list[dict[str, Any]]], *, limit: int) -> list[dict[str, Any]]:
    """Every node's rows as one list, newest first, in the order `audit_query` pages by."""
    rows = [row for node_rows in per_node.values() for row in node_rows if _well_formed(row)]
    rows.sort(key=lambda r: (r["at_ms"], r["node_id"], r["id"]), reverse=True)
    return rows[:limit]


def _well_formed(row: dict[str, Any]) -> bool:
    # Another node's answer is only data: a row without its ordering fields is left out rather
    # than failing the whole page.
    return (
        isinstance(row.get("at_ms"), int)
        and isinstance(row.get("id"), int)
        and isinstance(row.get("node_id"), str)
    )
