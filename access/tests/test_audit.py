"""The audit log: what a row keeps, who it names, how it is read back a page at a time."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, cast

import pytest
from django.conf import settings
from django.contrib import admin
from django.contrib.auth.models import Group, User
from django.db.models import QuerySet, Value
from django.db.models.functions import Concat
from django.http import HttpRequest
from django.test import Client, RequestFactory

from access.audit import (
    Cursor,
    aaudit_request,
    audit_query,
    audited_write,
    is_secret_name,
    merge_rows,
    record,
    scrub,
)
from access.audit_admin import AuditedGroupAdmin
from access.identity import CALLER_SCOPE_KEY, CONFIG, MASTER, STORED, Caller
from access.models import AuditEntry
from routerproject import request_ids

AUDIT_URL = "/router/v1/site/audit"
T0_MS = 1_760_000_000_000


# -- secrets ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "key",
        "api_key",
        "key_hash",
        "token",
        "hfToken",
        "secret",
        "password",
        "hash",
        "Authorization",
    ],
)
def test_a_field_named_like_a_secret_is_a_secret(name: str) -> None:
    assert is_secret_name(name)


@pytest.mark.parametrize(
    "name", ["name", "guardian_id", "scheduling_backend_depth", "sha256", "monkey", "hashtag"]
)
def test_a_field_that_only_contains_such_letters_is_not(name: str) -> None:
    assert not is_secret_name(name)


def test_scrub_drops_secret_fields_at_any_depth_and_keeps_the_rest() -> None:
    doc = {
        "name": "ci",
        "key": "rk-abcdef",
        "nested": [{"token": "hf_x", "repository": "acme/m"}, {"password": "pw"}],
        "key_hash": "00ff",
    }
    assert scrub(doc) == {"name": "ci", "nested": [{"repository": "acme/m"}, {}]}


def test_scrub_writes_times_as_iso_and_other_objects_as_their_text() -> None:
    moment = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert scrub({"at": moment, "who": Caller(kind=CONFIG)}) == {
        "at": "2026-01-02T03:04:05Z",
        "who": str(Caller(kind=CONFIG)),
    }


@pytest.mark.django_db
def test_a_row_never_holds_a_secret_field_in_before_or_after() -> None:
    entry = record(
        actor="ops",
        action="api_key.create",
        target="ci",
        before=None,
        after={"name": "ci", "key": "rk-supersecretvalue", "key_prefix": "rk-sup"},
    )
    entry.refresh_from_db()
    assert entry.after == {"name": "ci"}
    assert "rk-supersecretvalue" not in str(AuditEntry.objects.values().get(pk=entry.pk))


# -- recording ------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_row_carries_the_node_and_the_request_being_served() -> None:
    token = request_ids.bind("req-123")
    try:
        entry = record(actor="ops", action="link.create", target="text a/b", after={"links": []})
    finally:
        request_ids.unbind(token)
    assert entry.node_id == settings.ROUTER.cluster.node_id
    assert entry.request_id == "req-123"
    assert entry.at.microsecond % 1000 == 0  # whole milliseconds: a cursor finds it again


class _Scoped:
    """A request as the front door leaves it: only the ASGI scope matters here."""

    def __init__(self, caller: Caller | None) -> None:
        self.scope: dict[str, Any] = {} if caller is None else {CALLER_SCOPE_KEY: caller}
        self.headers: dict[str, str] = {"X-Request-Id": "from-header"}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("caller", "actor"),
    [
        (Caller(kind=STORED, name="ci-bot", role="admin"), "ci-bot"),
        (Caller(kind=CONFIG, role="admin"), "config key"),
        (Caller(kind=MASTER), "master"),
        (None, "config key"),
    ],
)
async def test_the_actor_is_the_caller_the_front_door_recorded(
    caller: Caller | None, actor: str
) -> None:
    entry = await aaudit_request(_Scoped(caller), "settings.update", "lending settings", {}, {})
    assert (entry.actor, entry.request_id) == (actor, "from-header")


@pytest.mark.django_db
def test_a_failed_write_records_nothing() -> None:
    def refuse() -> None:
        raise ValueError("refused")

    with pytest.raises(ValueError):
        audited_write(actor="ops", action="x.update", target="t", read=dict, write=refuse)
    assert not AuditEntry.objects.exists()


@pytest.mark.django_db
def test_a_write_stands_only_with_its_row() -> None:
    # The write and its row share a transaction: when the state after cannot be read (so no
    # row can be written), the write is undone too.
    reads = iter([{"n": 0}])

    def read() -> dict[str, int]:
        return next(reads)

    def write() -> None:
        record(actor="ops", action="inner.write", target="t")

    with pytest.raises(StopIteration):
        audited_write(actor="ops", action="x.update", target="t", read=read, write=write)
    assert not AuditEntry.objects.exists()


@pytest.mark.django_db
def test_the_action_may_depend_on_the_state_before() -> None:
    entry_count = audited_write(
        actor="ops",
        action=lambda before: "x.update" if before["n"] else "x.create",
        target="t",
        read=lambda: {"n": AuditEntry.objects.count()},
        write=lambda: 1,
    )
    assert entry_count == 1
    (row,) = AuditEntry.objects.all()
    assert (row.action, row.before, row.after) == ("x.create", {"n": 0}, {"n": 0})


# -- reading --------------------------------------------------------------------------------------


def _rows(n: int, *, at_ms: int = T0_MS, node_id: str = "test") -> list[AuditEntry]:
    return [
        record(
            actor="ops" if i % 2 else "ci",
            action="link.create" if i % 3 else "settings.update",
            target=f"t{i}",
            at_ms=at_ms + (i // 2),  # pairs share a millisecond: the cursor must split ties
            node_id=node_id,
        )
        for i in range(n)
    ]


@pytest.mark.django_db
def test_pages_follow_each_other_without_gaps_or_repeats() -> None:
    _rows(9)
    seen: list[str] = []
    cursor: Cursor | None = None
    while True:
        page = audit_query(before=cursor, limit=2)
        seen.extend(r["target"] for r in page)
        if len(page) < 2:
            break
        cursor = Cursor(at_ms=page[-1]["at_ms"], row_id=page[-1]["id"], node_id="test")
    assert sorted(seen) == sorted(f"t{i}" for i in range(9))
    assert len(seen) == 9


@pytest.mark.django_db
def test_filters_pick_rows_by_actor_action_and_time() -> None:
    _rows(6)
    assert {r["actor"] for r in audit_query(actor="ops", limit=100)} == {"ops"}
    assert {r["action"] for r in audit_query(action="settings.update", limit=100)} == {
        "settings.update"
    }
    assert [r["target"] for r in audit_query(since_ms=T0_MS + 2, limit=100)] == ["t5", "t4"]


def test_merged_rows_are_newest_first_across_nodes_and_skip_malformed_ones() -> None:
    a = [{"at_ms": 5, "id": 1, "node_id": "a"}, {"at_ms": 1, "id": 2, "node_id": "a"}]
    b = [{"at_ms": 5, "id": 9, "node_id": "b"}, {"at_ms": "x", "id": 3, "node_id": "b"}]
    merged = merge_rows({"a": a, "b": b}, limit=10)
    assert [(r["node_id"], r["id"]) for r in merged] == [("b", 9), ("a", 1), ("a", 2)]


# -- the site route -------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_route_answers_a_page_and_the_cursor_of_the_next(client: Client) -> None:
    _rows(5)
    first = client.get(AUDIT_URL, {"limit": 3})
    assert first.status_code == 200, first.content
    doc = first.json()
    assert [r["target"] for r in doc["rows"]] == ["t4", "t3", "t2"]
    assert set(doc["rows"][0]) >= {
        "at_ms",
        "actor",
        "action",
        "target",
        "before",
        "after",
        "node_id",
        "request_id",
    }
    rest = client.get(AUDIT_URL, {"limit": 3, "before": doc["next_before"]}).json()
    assert [r["target"] for r in rest["rows"]] == ["t1", "t0"]
    assert rest["next_before"] is None


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("query", "param"),
    [
        ({"limit": "0"}, "limit"),
        ({"limit": "1001"}, "limit"),
        ({"limit": "ten"}, "limit"),
        ({"since_ms": "-5"}, "since_ms"),
        ({"before": "yesterday"}, "before"),
        ({"actor": "x" * 151}, "actor"),
    ],
)
def test_a_bad_parameter_is_refused_naming_it(
    client: Client, query: dict[str, str], param: str
) -> None:
    answer = client.get(AUDIT_URL, query)
    assert answer.status_code == 400
    assert answer.json()["error"]["param"] == param


@pytest.mark.django_db(transaction=True)
def test_a_slave_does_not_serve_the_route(client: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    router = settings.ROUTER
    slave = router.model_copy(
        update={"cluster": router.cluster.model_copy(update={"role": "slave"})}
    )
    monkeypatch.setattr(settings, "ROUTER", slave)
    assert client.get(AUDIT_URL).status_code == 404


# -- the admin ------------------------------------------------------------------------------------


@pytest.fixture
def admin_client() -> Client:
    user = User.objects.create_superuser("auditor", "auditor@example.invalid", "pw")
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.django_db
def test_the_admin_lists_rows_and_offers_no_way_to_change_them(admin_client: Client) -> None:
    entry = record(actor="ops", action="link.create", target="text a/b")
    listing = admin_client.get("/admin/access/auditentry/?actor=ops")
    assert listing.status_code == 200
    assert b"text a/b" in listing.content
    assert admin_client.get("/admin/access/auditentry/?q=a/b").status_code == 200
    assert admin_client.get("/admin/access/auditentry/add/").status_code == 403
    assert admin_client.post(f"/admin/access/auditentry/{entry.pk}/delete/").status_code == 403
    admin_client.post(f"/admin/access/auditentry/{entry.pk}/change/", {"actor": "someone"})
    entry.refresh_from_db()
    assert entry.actor == "ops"


@pytest.mark.django_db
def test_user_and_group_pages_of_the_admin_are_audited_without_the_password(
    admin_client: Client,
) -> None:
    added = admin_client.post("/admin/auth/group/add/", {"name": "operators"})
    assert added.status_code == 302
    (group_row,) = AuditEntry.objects.filter(action="group.create")
    made: dict[str, Any] = cast(dict[str, Any], group_row.after)
    assert group_row.actor == "auditor"
    assert made == {"id": made["id"], "name": "operators", "permissions": []}

    doomed = User.objects.create_user("leaver", password="a-password-nobody-keeps-1")
    gone = admin_client.post(
        "/admin/auth/user/",
        {"action": "delete_selected", "_selected_action": [doomed.pk], "post": "yes"},
    )
    assert gone.status_code == 302
    (row,) = AuditEntry.objects.filter(action="user.delete")
    before: dict[str, Any] = cast(dict[str, Any], row.before)
    assert row.actor == "auditor" and before["username"] == "leaver"
    assert "password" not in before
    assert doomed.password not in str(AuditEntry.objects.values().get(pk=row.pk))


class _RenamingGroupAdmin(AuditedGroupAdmin):
    actions = ["add_suffix"]

    @admin.action(description="Add a suffix to the names")
    def add_suffix(self, request: HttpRequest, queryset: QuerySet[Group]) -> None:
        queryset.filter(name__startswith="a").update(name=Concat("name", Value("-x")))


@pytest.mark.django_db
def test_any_other_bulk_action_records_each_object_it_changed() -> None:
    user = User.objects.create_superuser("bulk", "bulk@example.invalid", "pw")
    Group.objects.create(name="alpha")
    Group.objects.create(name="beta")
    model_admin = _RenamingGroupAdmin(Group, admin.site)
    request = RequestFactory().post("/admin/auth/group/")
    request.user = user
    action = model_admin.get_actions(request)["add_suffix"][0]
    action(model_admin, request, Group.objects.all())
    (row,) = AuditEntry.objects.all()  # beta did not change: no row
    assert (row.actor, row.action) == ("bulk", "group.add_suffix")
    was: dict[str, Any] = cast(dict[str, Any], row.before)
    assert (was, row.after) == (
        {"id": was["id"], "name": "alpha", "permissions": []},
        {"id": was["id"], "name": "alpha-x", "permissions": []},
    )
