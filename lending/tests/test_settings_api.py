"""Site API: /router/v1/site/offload/settings and /router/v1/site/offload/decisions."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import factory
import orjson
import pytest
from django.conf import settings
from django.test import Client

from lending import services
from lending.keys import LENDING_KEYS, default_values, fingerprint
from lending.models import OffloadDecision, OffloadSetting
from lending.settings_store import SettingEntry
from lending.tests.factories import OffloadDecisionFactory, OffloadSettingFactory

# The views reach the database through database_sync_to_async, which closes the connection
# around each call: only committed rows (transaction=True) survive that.
pytestmark = pytest.mark.django_db(transaction=True)

SETTINGS_URL = "/router/v1/site/offload/settings"
DECISIONS_URL = "/router/v1/site/offload/decisions"
DEPTH = "scheduling_backend_depth"
PROBE_IDLE = "offload_probe_idle"


@pytest.fixture
def changes(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, str]]:
    """Every call of the settings-changed hook, as the effective map it was given."""
    calls: list[dict[str, str]] = []

    async def record(*, entries: Sequence[SettingEntry]) -> None:
        calls.append({e.key: e.effective for e in entries})

    monkeypatch.setattr(services, "settings_changed", record)
    return calls


def use_router_config(monkeypatch: pytest.MonkeyPatch, **cluster: Any) -> None:
    router = settings.ROUTER
    monkeypatch.setattr(
        settings,
        "ROUTER",
        router.model_copy(update={"cluster": router.cluster.model_copy(update=cluster)}),
    )


def post(client: Client, body: Any) -> Any:
    raw = body if isinstance(body, bytes) else orjson.dumps(body)
    return client.post(SETTINGS_URL, raw, content_type="application/json")


def entries_by_key(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["key"]: e for e in doc["entries"]}


def error_of(response: Any) -> dict[str, Any]:
    err: dict[str, Any] = response.json()["error"]
    return err


# -- settings --------------------------------------------------------------------------------


def test_get_lists_every_setting_with_the_fingerprint(client: Client) -> None:
    response = client.get(SETTINGS_URL)
    assert response.status_code == 200
    doc = response.json()
    assert [e["key"] for e in doc["entries"]] == [k.name for k in LENDING_KEYS]
    assert doc["fingerprint"] == fingerprint(default_values())
    assert doc["editable"] is True
    assert entries_by_key(doc)[DEPTH] == {
        "key": DEPTH,
        "kind": "integer",
        "description": entries_by_key(doc)[DEPTH]["description"],
        "default": "2",
        "effective": "2",
        "source": "default",
    }


def test_post_stores_overrides_and_answers_like_get(
    client: Client, changes: list[dict[str, str]]
) -> None:
    response = post(client, {"values": {PROBE_IDLE: "2000ms", DEPTH: 4}})
    assert response.status_code == 200
    by_key = entries_by_key(response.json())
    assert (by_key[PROBE_IDLE]["override"], by_key[PROBE_IDLE]["effective"]) == ("2s", "2s")
    assert (by_key[DEPTH]["effective"], by_key[DEPTH]["source"]) == ("4", "db")
    assert dict(OffloadSetting.objects.values_list("key", "value")) == {
        PROBE_IDLE: "2s",
        DEPTH: "4",
    }
    assert response.json() == client.get(SETTINGS_URL).json()
    assert len(changes) == 1
    assert changes[0][DEPTH] == "4"


def test_one_bad_value_is_a_400_naming_the_key_and_changes_nothing(
    client: Client, changes: list[dict[str, str]]
) -> None:
    post(client, {"values": {DEPTH: "4"}})
    response = post(client, {"values": {DEPTH: "5", PROBE_IDLE: "30d"}})
    assert response.status_code == 400
    err = error_of(response)
    assert err["param"] == PROBE_IDLE
    assert PROBE_IDLE in err["message"]
    assert dict(OffloadSetting.objects.values_list("key", "value")) == {DEPTH: "4"}
    assert len(changes) == 1


def test_an_unknown_key_is_a_400(client: Client, changes: list[dict[str, str]]) -> None:
    response = post(client, {"values": {"offload_turbo": "true"}})
    assert response.status_code == 400
    assert "unknown lending setting" in error_of(response)["message"]
    assert changes == []


@pytest.mark.parametrize(
    "body",
    [b"{not json", b"[]", {"value": {DEPTH: "3"}}, {"values": [DEPTH, "3"]}, {"values": "3"}],
)
def test_a_body_without_a_values_object_is_a_400(
    client: Client, changes: list[dict[str, str]], body: Any
) -> None:
    response = post(client, body)
    assert response.status_code == 400
    assert OffloadSetting.objects.count() == 0
    assert changes == []


def test_delete_with_a_key_clears_that_override_only(
    client: Client, changes: list[dict[str, str]]
) -> None:
    post(client, {"values": {DEPTH: "4", PROBE_IDLE: "2s"}})
    response = client.delete(f"{SETTINGS_URL}?key={DEPTH}")
    assert response.status_code == 200
    by_key = entries_by_key(response.json())
    assert (by_key[DEPTH]["source"], by_key[DEPTH]["effective"]) == ("default", "2")
    assert by_key[PROBE_IDLE]["source"] == "db"
    assert changes[-1][DEPTH] == "2"


def test_delete_without_a_key_clears_every_override(
    client: Client, changes: list[dict[str, str]]
) -> None:
    post(client, {"values": {DEPTH: "4", PROBE_IDLE: "2s"}})
    response = client.delete(SETTINGS_URL)
    assert response.status_code == 200
    assert {e["source"] for e in response.json()["entries"]} == {"default"}
    assert OffloadSetting.objects.count() == 0
    assert len(changes) == 2


def test_delete_with_an_unknown_key_is_a_400(client: Client, changes: list[dict[str, str]]) -> None:
    post(client, {"values": {DEPTH: "4"}})
    response = client.delete(f"{SETTINGS_URL}?key=offload_turbo")
    assert response.status_code == 400
    assert error_of(response)["param"] == "offload_turbo"
    assert OffloadSetting.objects.count() == 1


def test_a_stale_override_shows_while_the_config_value_applies(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_router_config(monkeypatch, scheduling_backend_depth="3")
    OffloadSettingFactory(key=DEPTH, value="0", updated_at=1)
    by_key = entries_by_key(client.get(SETTINGS_URL).json())
    assert by_key[DEPTH]["config"] == "3"
    assert by_key[DEPTH]["override"] == "0"
    assert (by_key[DEPTH]["effective"], by_key[DEPTH]["source"]) == ("3", "config")


def test_an_unsupported_method_is_a_404(client: Client) -> None:
    assert client.put(SETTINGS_URL, b"{}", content_type="application/json").status_code == 404


def test_a_slave_does_not_serve_the_site_api(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_router_config(monkeypatch, role="slave")
    assert client.get(SETTINGS_URL).status_code == 404
    assert client.get(DECISIONS_URL).status_code == 404


# -- decisions -------------------------------------------------------------------------------


def make_decisions(count: int, **fields: Any) -> None:
    times = factory.Iterator(range(1000, 1000 + count))
    rows = OffloadDecisionFactory.build_batch(count, recorded_at=times, node_id="test", **fields)
    OffloadDecision.objects.bulk_create(rows)


def test_decisions_come_newest_first_with_the_column_names(client: Client) -> None:
    make_decisions(2, kind="plan", lane="text", outcome="granted", slots=2)
    response = client.get(DECISIONS_URL)
    assert response.status_code == 200
    records = response.json()["records"]
    assert [r["recorded_at"] for r in records] == [1001, 1000]
    assert records[0]["outcome"] == "granted"
    assert records[0]["slots"] == 2
    assert "wait_ms" not in records[0]


def test_decisions_are_filtered_by_the_query_string(client: Client) -> None:
    make_decisions(2, kind="plan", lane="text", outcome="granted")
    make_decisions(1, kind="dispatch", lane="image", outcome="lent")
    records = client.get(f"{DECISIONS_URL}?lane=image&outcome=lent").json()["records"]
    assert [(r["kind"], r["lane"]) for r in records] == [("dispatch", "image")]
    since = client.get(f"{DECISIONS_URL}?since_ms=1001&kind=plan").json()["records"]
    assert [r["recorded_at"] for r in since] == [1001]


def test_decisions_default_to_five_hundred_rows(client: Client) -> None:
    make_decisions(501, kind="plan")
    assert len(client.get(DECISIONS_URL).json()["records"]) == 500
    assert len(client.get(f"{DECISIONS_URL}?limit=9999").json()["records"]) == 501


@pytest.mark.parametrize(("query", "param"), [("limit=0", "limit"), ("since_ms=-5", "since_ms")])
def test_bad_decision_filters_are_a_400(client: Client, query: str, param: str) -> None:
    response = client.get(f"{DECISIONS_URL}?{query}")
    assert response.status_code == 400
    assert error_of(response)["param"] == param
