"""`manage.py create_api_key`: the secret printed once, bad input refused with a clear error."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from access.keys import secret_hash
from access.models import ApiKey, AuditEntry

pytestmark = pytest.mark.django_db


def run(*args: str) -> str:
    out = StringIO()
    call_command("create_api_key", *args, stdout=out)
    return out.getvalue()


def test_it_creates_a_key_and_prints_its_secret_once() -> None:
    out = run(
        "--name",
        "ci",
        "--role",
        "admin",
        "--models",
        "a, b",
        "--expires-at",
        "2999-01-01T00:00:00Z",
    )
    secrets = [line for line in out.splitlines() if line.startswith("rk-")]
    assert len(secrets) == 1
    key = ApiKey.objects.get(name="ci")
    assert key.key_hash == secret_hash(secrets[0])
    assert (key.role, key.allowed_models) == ("admin", ["a", "b"])
    assert key.expires_at is not None and key.expires_at.year == 2999
    assert out.count(secrets[0]) == 1
    (row,) = AuditEntry.objects.all()
    assert (row.actor, row.action, row.target) == ("manage.py", "api_key.create", "ci")
    assert secrets[0] not in str(row.after)


def test_a_dry_run_creates_nothing() -> None:
    out = run("--name", "ci", "--dry-run")
    assert "nothing created" in out and "rk-" not in out
    assert not AuditEntry.objects.exists()
    assert not ApiKey.objects.exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--name", ""), "name is required"),
        (
            ("--name", "x", "--expires-at", "2001-01-01T00:00:00Z"),
            "expires_at must be in the future",
        ),
        (("--name", "x", "--expires-at", "soon"), "expires_at must be an RFC 3339 time"),
    ],
)
def test_bad_input_is_a_clear_error_and_stores_nothing(args: tuple[str, ...], message: str) -> None:
    with pytest.raises(CommandError, match=message):
        run(*args)
    assert not ApiKey.objects.exists()


def test_a_taken_name_fails() -> None:
    run("--name", "ci")
    with pytest.raises(CommandError, match="taken"):
        run("--name", "ci")
    assert ApiKey.objects.count() == 1


def test_an_unknown_role_exits_with_an_error() -> None:
    with pytest.raises(CommandError):
        run("--name", "x", "--role", "root")
