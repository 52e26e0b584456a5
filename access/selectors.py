"""Reading stored keys: the table every node checks, and the rows the site API lists."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import Count, Max

from access.keys import ROLE_ADMIN, KeyRecord, KeyTable
from access.models import ApiKey


def _ms(moment: datetime | None) -> int | None:
    return None if moment is None else int(moment.timestamp() * 1000)


def api_key_record(key: ApiKey) -> KeyRecord:
    models = key.allowed_models
    return KeyRecord(
        name=key.name,
        key_hash=key.key_hash,
        role=key.role,
        models=None if models is None else frozenset(models),
        expires_at_ms=_ms(key.expires_at),
        rpm=key.rpm,
        tpm=key.tpm,
        max_concurrent=key.max_concurrent,
        share=key.share,
    )


def api_keys_table() -> KeyTable:
    """The table of every unrevoked key (expiry is checked per request, on each node's clock).

    Revoked and expired rows still count for `required`: a cluster that once had keys keeps
    asking for one.
    """
    rows = list(ApiKey.objects.filter(revoked_at__isnull=True))
    return KeyTable(
        (api_key_record(key) for key in rows),
        required=ApiKey.objects.exists(),
        admin_required=ApiKey.objects.filter(role=ROLE_ADMIN).exists(),
    )


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat().replace("+00:00", "Z")


def api_key_dict(key: ApiKey, *, now: datetime) -> dict[str, Any]:
    """A key as the API, the admin and the audit log show it: never the secret or its hash."""
    active = key.revoked_at is None and (key.expires_at is None or key.expires_at > now)
    return {
        "id": key.pk,
        "name": key.name,
        "key_prefix": key.key_prefix,
        "role": key.role,
        "models": None if key.allowed_models is None else list(key.allowed_models),
        "rpm": key.rpm,
        "tpm": key.tpm,
        "max_concurrent": key.max_concurrent,
        "share": key.share,
        "expires_at": _iso(key.expires_at),
        "created_at": _iso(key.created_at),
        "revoked_at": _iso(key.revoked_at),
        "active": active,
    }


def api_keys_list(*, now: datetime) -> list[dict[str, Any]]:
    return [api_key_dict(key, now=now) for key in ApiKey.objects.order_by("name")]


def api_keys_version() -> tuple[int, datetime | None]:
    """Changes when any row does (every write sets `updated_at`): the master's cheap look for
    writes made outside the site API."""
    found = ApiKey.objects.aggregate(count=Count("id"), latest=Max("updated_at"))
    return int(found["count"]), found["latest"]
