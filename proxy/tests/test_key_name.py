"""Which key a request's usage counts against, and how that name travels between nodes."""

from __future__ import annotations

from typing import Any, cast

from asgiref.sync import async_to_sync

from access.identity import CALLER_SCOPE_KEY, CONFIG, STORED, Caller
from access.keyheader import KEY_NAME_HEADER, key_name_from_header, key_name_header
from lending.master import MasterLending
from lending.planner import Lease
from proxy.edge import nodeapi
from proxy.forwarding.remote import _node_headers
from proxy.request import Ctx

NAME = "ops team/ünï"


def ctx(caller: Caller | None = None, headers: list[tuple[bytes, bytes]] | None = None) -> Ctx:
    scope: dict[str, Any] = {"headers": headers or []}
    if caller is not None:
        scope[CALLER_SCOPE_KEY] = caller

    async def receive() -> dict[str, Any]:
        return {}

    async def send(message: dict[str, Any]) -> None:
        return None

    return Ctx(scope, receive, send, "/v1/chat/completions", "POST")


def test_a_stored_keys_name_is_the_usage_key_and_a_config_key_has_none() -> None:
    assert ctx(Caller(kind=STORED, name=NAME)).key_name == NAME
    assert ctx(Caller(kind=CONFIG, name="whatever")).key_name is None
    assert ctx().key_name is None


def test_the_caller_is_read_when_asked_not_when_the_request_began() -> None:
    # The edge authorizes (and records the caller) after it made the context.
    request = ctx()
    request.scope[CALLER_SCOPE_KEY] = Caller(kind=STORED, name=NAME)
    assert request.key_name == NAME


def test_the_name_survives_the_header_whatever_it_holds() -> None:
    (header, value), *_ = key_name_header(NAME).items()
    assert header == KEY_NAME_HEADER
    assert value.isascii() and "\n" not in value
    assert key_name_from_header(value.encode("latin-1")) == NAME
    assert key_name_header(None) == {}
    assert key_name_from_header(None) is None


def test_a_forward_to_the_serving_node_names_the_callers_key() -> None:
    keyed = _node_headers(ctx(Caller(kind=STORED, name=NAME)), "Bearer t", b"a/b", False, None)
    assert key_name_from_header(keyed[KEY_NAME_HEADER].encode()) == NAME
    assert KEY_NAME_HEADER not in _node_headers(ctx(), "Bearer t", b"a/b", False, None)


def test_a_relay_to_the_helper_names_the_owners_key() -> None:
    lease = Lease(
        lane="text",
        owner_node_id="o",
        owner_model_id="big",
        helper_node_id="h",
        helper_model_id="fast",
        load_helper_model=False,
        restore_helper_model=False,
        helper_slots=1,
        probe=True,
        ttl_ms=1000,
        owner_job_ms=None,
        helper_switch_ms=None,
        helper_service_ms=None,
    )
    headers = MasterLending._relay_headers(lease, "Bearer t", "application/json", "r1", NAME)
    assert key_name_from_header(headers[KEY_NAME_HEADER].encode()) == NAME
    unkeyed = MasterLending._relay_headers(lease, "Bearer t", "application/json", "r1", None)
    assert KEY_NAME_HEADER not in unkeyed


def test_only_the_node_protocol_reads_the_header() -> None:
    header = [(KEY_NAME_HEADER.lower().encode(), b"mallory")]
    seen: list[str | None] = []

    async def handler(request: Ctx, node: Any) -> None:
        seen.append(request.key_name)

    # A client path's handler runs on the context the edge made: the header is just a header.
    async_to_sync(handler)(ctx(headers=header), None)
    inner = nodeapi._inner(handler, "/v1/chat/completions")
    async_to_sync(inner)(ctx(headers=header), cast(Any, None))
    assert seen == [None, "mallory"]
