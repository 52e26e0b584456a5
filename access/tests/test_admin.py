"""The admin's stored-key page: list, add (secret shown once), edit without the secret or hash,
revoke as an action, no delete."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from access.keys import secret_hash
from access.models import ApiKey, AuditEntry

pytestmark = pytest.mark.django_db

CHANGELIST = "/admin/access/apikey/"


@pytest.fixture
def admin_client() -> Client:
    user = User.objects.create_superuser("root", "root@example.invalid", "pw")
    client = Client()
    client.force_login(user)
    return client


def add(client: Client, **fields: str) -> object:
    data = {"name": "alice", "role": "inference", "allowed_models": "null", "share": "1", **fields}
    return client.post(f"{CHANGELIST}add/", data, follow=True)


def test_adding_a_key_shows_its_secret_once_and_stores_its_hash(admin_client: Client) -> None:
    response = add(admin_client)
    page = response.content.decode()  # type: ignore[attr-defined]
    (secret,) = set(re.findall(r"rk-[A-Za-z0-9_-]{43}", page))
    key = ApiKey.objects.get(name="alice")
    assert key.key_hash == secret_hash(secret)
    again = admin_client.get(CHANGELIST).content.decode()
    assert secret not in again and key.key_prefix in again


def test_the_edit_form_shows_neither_secret_nor_hash(admin_client: Client) -> None:
    add(admin_client)
    key = ApiKey.objects.get(name="alice")
    page = admin_client.get(f"{CHANGELIST}{key.pk}/change/").content.decode()
    assert key.key_hash not in page
    assert 'name="key_hash"' not in page
    assert 'name="allowed_models"' in page and 'name="expires_at_0"' in page


@pytest.mark.parametrize(
    ("field", "value"),
    [("rpm", "0"), ("share", "0"), ("allowed_models", '"chat"'), ("expires_at_0", "2001-01-01")],
)
def test_bad_values_are_refused_on_the_form(admin_client: Client, field: str, value: str) -> None:
    extra = {field: value}
    if field == "expires_at_0":
        extra["expires_at_1"] = "00:00:00"
    add(admin_client, **extra)
    assert not ApiKey.objects.exists()


def test_the_revoke_action_keeps_the_row(admin_client: Client) -> None:
    add(admin_client)
    key = ApiKey.objects.get(name="alice")
    admin_client.post(CHANGELIST, {"action": "revoke", "_selected_action": [str(key.pk)]})
    key.refresh_from_db()
    assert key.revoked_at is not None
    assert admin_client.get(f"{CHANGELIST}{key.pk}/delete/").status_code == 403


def test_writes_in_the_admin_are_audited_under_the_admin_user(admin_client: Client) -> None:
    page = add(admin_client).content.decode()  # type: ignore[attr-defined]
    (secret,) = set(re.findall(r"rk-[A-Za-z0-9_-]{43}", page))
    key = ApiKey.objects.get(name="alice")
    admin_client.post(CHANGELIST, {"action": "revoke", "_selected_action": [str(key.pk)]})
    rows = list(AuditEntry.objects.order_by("id"))
    assert [(r.actor, r.action) for r in rows] == [
        ("root", "api_key.create"),
        ("root", "api_key.revoke"),
    ]
    revoked: Any = rows[1].after
    assert revoked["revoked_at"] is not None
    stored = str([[r.before, r.after] for r in rows])
    assert secret not in stored and key.key_hash not in stored
