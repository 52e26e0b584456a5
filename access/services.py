"""Writing stored keys: create, change, revoke. One function per write, each returning the key
as it was before and is after (never a secret or a hash), which is what an audit row records.

Every node learns of a write when the master republishes its table (the view, the admin and
the command each do that after calling in here); the database is the source of truth.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction

from access.keys import ROLE_INFERENCE, new_secret, secret_hash, visible_prefix
from access.models import ApiKey
from access.selectors import api_key_dict
from routerproject.errors import RouterError

# The fields a write may set; `allowed_models` is the attribute behind the API's `models`.
FIELDS = ("name", "role", "models", "rpm", "tpm", "max_concurrent", "share", "expires_at")


@dataclass(frozen=True)
class KeyWrite:
    key: ApiKey
    before: dict[str, Any] | None
    after: dict[str, Any]
    secret: str | None = None
    """Only on create: the one time the secret exists outside the client's hands."""


def _duplicate(name: str) -> RouterError:
    return RouterError(400, f'name "{name}" is taken by another key', param="name")


def api_key_check_models(*, models: Collection[str] | None, known: Collection[str] | None) -> None:
    """400 naming the first entry of `models` that is no public model ID in `known`."""
    if models is None or known is None:
        return
    for index, model in enumerate(models):
        if model not in known:
            raise RouterError(
                400,
                f'models[{index}]: "{model[:200]}" is no model this cluster knows',
                param=f"models[{index}]",
                code="model_not_found",
            )


def _apply(key: ApiKey, fields: Mapping[str, Any]) -> None:
    for field, value in fields.items():
        if field not in FIELDS:
            raise ValueError(f"{field} is not a field of a key")
        setattr(key, "allowed_models" if field == "models" else field, value)


def api_key_create(
    *,
    name: str,
    role: str = ROLE_INFERENCE,
    models: list[str] | None = None,
    rpm: int | None = None,
    tpm: int | None = None,
    max_concurrent: int | None = None,
    share: float = 1.0,
    expires_at: datetime | None = None,
    now: datetime,
) -> KeyWrite:
    """A new key with a fresh secret; 400 (param `name`) when the name is taken."""
    secret = new_secret()
    key = ApiKey(key_hash=secret_hash(secret), key_prefix=visible_prefix(secret))
    _apply(
        key,
        {
            "name": name,
            "role": role,
            "models": models,
            "rpm": rpm,
            "tpm": tpm,
            "max_concurrent": max_concurrent,
            "share": share,
            "expires_at": expires_at,
        },
    )
    try:
        with transaction.atomic():
            key.save()
    except IntegrityError as exc:
        # The hash is 256 random bits: a clash can only be the name.
        raise _duplicate(name) from exc
    return KeyWrite(key=key, before=None, after=api_key_dict(key, now=now), secret=secret)


def api_key_get(*, key_id: int) -> ApiKey:
    key = ApiKey.objects.filter(pk=key_id).first()
    if key is None:
        raise RouterError(404, f"no key with id {key_id}", type="not_found", code="key_not_found")
    return key


def api_key_update(*, key_id: int, fields: Mapping[str, Any], now: datetime) -> KeyWrite:
    """Change a key's fields (never its secret); a revoked key cannot change (409)."""
    key = api_key_get(key_id=key_id)
    if key.revoked_at is not None:
        raise RouterError(409, f'key "{key.name}" is revoked', code="key_revoked")
    before = api_key_dict(key, now=now)
    _apply(key, fields)
    try:
        with transaction.atomic():
            key.save()
    except IntegrityError as exc:
        raise _duplicate(str(fields.get("name", key.name))) from exc
    return KeyWrite(key=key, before=before, after=api_key_dict(key, now=now))


def api_key_revoke(*, key_id: int, now: datetime) -> KeyWrite:
    """Revoke a key: the row stays (usage and the audit log keep naming it). Revoking a revoked
    key changes nothing and answers as it is."""
    key = api_key_get(key_id=key_id)
    before = api_key_dict(key, now=now)
    # Compare-and-set: of two revocations at once, one sets the time, neither overwrites it.
    ApiKey.objects.filter(pk=key.pk, revoked_at__isnull=True).update(revoked_at=now, updated_at=now)
    key.refresh_from_db()
    return KeyWrite(key=key, before=before, after=api_key_dict(key, now=now))
