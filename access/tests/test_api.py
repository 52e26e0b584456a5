"""Site API for stored keys: create (secret once), list, read, change, revoke, and every bad
input refused with 400 naming the field, nothing stored."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest
from django.test import Client

from access.keys import current_table, reset_for_tests, secret_hash
from access.models import ApiKey, AuditEntry

# The views reach the database through database_sync_to_async, which closes the connection
# around each call: only committed rows (transaction=True) survive that.
pytestmark = pytest.mark.django_db(transaction=True)

URL = "/router/v1/site/api-keys"
# Models of the test process's node (tests/config.test.yaml: demo/kcpps).
KNOWN = "chat-small"


@pytest.fixture(autouse=True)
def _fresh_table() -> Iterator[None]:
    reset_for_tests()
    yield
    reset_for_tests()


def post(client: Client, body: Any) -> Any:
    return client.post(URL, orjson.dumps(body), content_type="application/json")


def patch(client: Client, key_id: int, body: Any) -> Any:
    return client.patch(f"{URL}/{key_id}", orjson.dumps(body), content_type="application/json")


def future(days: int = 30) -> str:
    return (datetime.now(UTC) + timedelta(days=days)).isoformat()


def refused(response: Any) -> tuple[str | None, str]:
    assert response.status_code == 400, response.content
    err = response.json()["error"]
    return err.get("param"), err["message"]


def test_a_new_key_shows_its_secret_once_and_is_stored_hashed(client: Client) -> None:
    response = post(
        client,
        {
            "name": "alice",
            "role": "admin",
            "models": [KNOWN],
            "rpm": 60,
            "tpm": 1000,
            "max_concurrent": 2,
            "share": 2,
            "expires_at": future(),
        },
    )
    assert response.status_code == 201, response.content
    doc = response.json()
    secret = doc["key"]
    assert secret.startswith("rk-") and doc["key_prefix"] == secret[:10]
    assert (doc["name"], doc["role"], doc["models"], doc["rpm"], doc["share"]) == (
        "alice",
        "admin",
        [KNOWN],
        60,
        2.0,
    )
    assert doc["active"] is True and doc["revoked_at"] is None
    row = ApiKey.objects.get(name="alice")
    assert row.key_hash == secret_hash(secret)
    # The node checks the new key at once.
    assert current_table().lookup(secret.encode()) is not None
    # Never again: not in the list, not in one key's answer.
    listed = client.get(URL)
    assert secret not in listed.content.decode()
    assert row.key_hash not in listed.content.decode()
    one = client.get(f"{URL}/{doc['id']}")
    assert one.status_code == 200 and "key" not in one.json()
    assert one.json()["name"] == "alice"


def test_the_defaults_are_an_inference_key_for_every_model_without_limits(client: Client) -> None:
    doc = post(client, {"name": "bob"}).json()
    assert {k: doc[k] for k in ("role", "models", "rpm", "tpm", "max_concurrent", "share")} == {
        "role": "inference",
        "models": None,
        "rpm": None,
        "tpm": None,
        "max_concurrent": None,
        "share": 1.0,
    }
    assert doc["expires_at"] is None


def test_the_list_shows_every_key_by_name_with_created_and_revoked_times(client: Client) -> None:
    post(client, {"name": "zed"})
    key_id = post(client, {"name": "amy"}).json()["id"]
    client.delete(f"{URL}/{key_id}")
    keys = client.get(URL).json()["keys"]
    assert [k["name"] for k in keys] == ["amy", "zed"]
    assert keys[0]["revoked_at"] is not None and keys[0]["active"] is False
    assert keys[1]["created_at"] and keys[1]["active"] is True


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"name": "a", "colour": "red"}, "colour"),
        ({"name": "a", "key": "rk-mine"}, "key"),
        ({}, "name"),
        ({"name": ""}, "name"),
        ({"name": 7}, "name"),
        ({"name": "a" * 65}, "name"),
        ({"name": "a", "role": "root"}, "role"),
        ({"name": "a", "models": "chat-small"}, "models"),
        ({"name": "a", "models": [3]}, "models[0]"),
        ({"name": "a", "models": [KNOWN, "no-such-model"]}, "models[1]"),
        ({"name": "a", "rpm": 0}, "rpm"),
        ({"name": "a", "tpm": -5}, "tpm"),
        ({"name": "a", "max_concurrent": 0}, "max_concurrent"),
        ({"name": "a", "rpm": "10"}, "rpm"),
        ({"name": "a", "rpm": 1.5}, "rpm"),
        ({"name": "a", "rpm": True}, "rpm"),
        ({"name": "a", "share": 0}, "share"),
        ({"name": "a", "share": -1}, "share"),
        ({"name": "a", "share": "1"}, "share"),
        ({"name": "a", "expires_at": "2001-01-01T00:00:00Z"}, "expires_at"),
        ({"name": "a", "expires_at": "tomorrow"}, "expires_at"),
        ({"name": "a", "expires_at": "2999-01-01T00:00:00"}, "expires_at"),
        ({"name": "a", "expires_at": 4102444800}, "expires_at"),
    ],
)
def test_bad_input_is_400_naming_the_field_and_stores_nothing(
    client: Client, body: dict[str, Any], param: str
) -> None:
    assert refused(post(client, body))[0] == param
    assert not ApiKey.objects.exists()
    assert not current_table().required


def test_a_models_entry_the_cluster_does_not_know_is_named(client: Client) -> None:
    param, message = refused(post(client, {"name": "a", "models": ["ghost"]}))
    assert param == "models[0]" and '"ghost"' in message


def test_a_body_that_is_not_an_object_is_refused(client: Client) -> None:
    assert refused(post(client, ["alice"])) == (None, "request body must be a JSON object")


def test_a_name_is_unique(client: Client) -> None:
    post(client, {"name": "alice"})
    param, message = refused(post(client, {"name": "alice"}))
    assert param == "name" and "taken" in message
    assert ApiKey.objects.count() == 1


def test_patch_changes_fields_but_never_the_secret(client: Client) -> None:
    created = post(client, {"name": "alice"}).json()
    secret = created["key"]
    response = patch(client, created["id"], {"models": [KNOWN], "rpm": 5, "expires_at": None})
    assert response.status_code == 200, response.content
    doc = response.json()
    assert (doc["models"], doc["rpm"], doc["name"]) == ([KNOWN], 5, "alice")
    assert "key" not in doc
    caller = current_table().lookup(secret.encode())
    assert caller is not None and caller.models == frozenset({KNOWN})


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({}, "name"),
        ({"key_prefix": "rk-x"}, "key_prefix"),
        ({"rpm": 0}, "rpm"),
        ({"models": ["ghost"]}, "models[0]"),
        ({"share": 0}, "share"),
        ({"expires_at": "2001-01-01T00:00:00Z"}, "expires_at"),
        ({"name": "taken"}, "name"),
    ],
)
def test_a_bad_patch_is_400_naming_the_field_and_changes_nothing(
    client: Client, body: dict[str, Any], param: str
) -> None:
    post(client, {"name": "taken"})
    key_id = post(client, {"name": "alice", "rpm": 9}).json()["id"]
    assert refused(patch(client, key_id, body))[0] == param
    row = ApiKey.objects.get(pk=key_id)
    assert (row.name, row.rpm, row.allowed_models, row.share) == ("alice", 9, None, 1.0)


def test_delete_revokes_keeps_the_row_and_the_key_stops_at_once(client: Client) -> None:
    created = post(client, {"name": "alice"}).json()
    secret = created["key"]
    response = client.delete(f"{URL}/{created['id']}")
    assert response.status_code == 200
    doc = response.json()
    assert doc["revoked_at"] is not None and doc["active"] is False
    assert ApiKey.objects.filter(name="alice", revoked_at__isnull=False).exists()
    assert current_table().lookup(secret.encode()) is None
    # Revoking the last key leaves keys required: the node does not open up.
    assert current_table().required
    # Again: nothing changes.
    again = client.delete(f"{URL}/{created['id']}").json()
    assert again["revoked_at"] == doc["revoked_at"]
    # A revoked key cannot be changed back.
    assert patch(client, created["id"], {"rpm": 3}).status_code == 409


def test_an_unknown_id_is_404(client: Client) -> None:
    for response in (
        client.get(f"{URL}/999"),
        patch(client, 999, {"rpm": 1}),
        client.delete(f"{URL}/999"),
    ):
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "key_not_found"


def test_on_a_slave_the_routes_do_not_exist(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django.conf import settings

    router = settings.ROUTER
    slave = router.model_copy(
        update={"cluster": router.cluster.model_copy(update={"role": "slave"})}
    )
    monkeypatch.setattr(settings, "ROUTER", slave)
    assert client.get(URL).status_code == 404
    assert post(client, {"name": "alice"}).status_code == 404
    assert not ApiKey.objects.exists()


def test_every_key_write_leaves_one_audit_row_without_the_secret(client: Client) -> None:
    created = post(client, {"name": "alice", "rpm": 5}).json()
    assert patch(client, created["id"], {"rpm": 9}).status_code == 200
    assert client.delete(f"{URL}/{created['id']}").status_code == 200
    # A second revocation and a refused write change nothing, so they record nothing.
    assert client.delete(f"{URL}/{created['id']}").status_code == 200
    assert post(client, {"name": "alice"}).status_code == 400
    rows = list(AuditEntry.objects.order_by("id"))
    assert [(r.action, r.target) for r in rows] == [
        ("api_key.create", "alice"),
        ("api_key.update", "alice"),
        ("api_key.revoke", "alice"),
    ]
    states: list[tuple[Any, Any]] = [(r.before, r.after) for r in rows]
    assert states[0][0] is None and states[0][1]["rpm"] == 5
    assert (states[1][0]["rpm"], states[1][1]["rpm"]) == (5, 9)
    assert states[2][0]["revoked_at"] is None and states[2][1]["revoked_at"] is not None
    stored = orjson.dumps([[r.before, r.after] for r in rows]).decode()
    assert created["key"] not in stored and secret_hash(created["key"]) not in stored
    # The test client carries no key: the node's own config key opened the route.
    assert {r.actor for r in rows} == {"config key"}
