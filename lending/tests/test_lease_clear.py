"""An owner told that the master cleared its lease (the grant route, `cleared: true`) stops
lending under it at once, instead of refilling until the lease's TTL and having every refill
refused (`no_live_lease`) and run late.

A real slave node (no router process) answers the route through the ASGI app.
"""

from __future__ import annotations

import textwrap
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
from asgiref.testing import ApplicationCommunicator

from lending.planner import Lease
from proxy.edge.app import ProxyApp
from proxy.node import Node, build_node
from registry.httpclient import close_session
from routerproject.config import load_config

TOKEN = "cluster-secret-for-lease-clear-tests"
GRANT = "/router/v1/node/offload/grant"


@dataclass
class Owner:
    node: Node
    rows: list[dict[str, Any]]
    """The node's decision-log rows."""

    def outcomes(self) -> list[str]:
        return [row["outcome"] for row in self.rows]


@pytest.fixture
async def owner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Owner]:
    (tmp_path / "kcpps").mkdir()
    path = tmp_path / "config.yaml"
    path.write_text(
        textwrap.dedent(
            f"""
            cluster:
              role: slave
              node_id: o
              token: {TOKEN}
              master_url: http://127.0.0.1:9
              public_url: http://127.0.0.1:18997
              store_dir: {tmp_path / "store"}
            models: {{config_dir: {tmp_path / "kcpps"}}}
            backend: {{mode: sim}}
            """
        )
    )
    node = build_node(load_config(path, environ={}))
    link = {
        "owner_node_id": "o",
        "owner_model_id": "big",
        "helper_node_id": "h",
        "helper_model_id": "fast",
        "load_if_unloaded": True,
        "restore_after_borrow": False,
    }
    node.lending.set_links({"text": [link], "image": []})
    rows: list[dict[str, Any]] = []
    monkeypatch.setattr(node.decisions, "record", lambda **fields: rows.append(fields))
    try:
        yield Owner(node, rows)
    finally:
        await node.runtimes.close()
        await close_session()


async def post(node: Node, doc: Any) -> tuple[int, dict[str, Any]]:
    async def fallback(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError("node routes never reach Django")

    scope: dict[str, Any] = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": GRANT,
        "raw_path": GRANT.encode(),
        "query_string": b"",
        "headers": [
            (b"authorization", f"Bearer {TOKEN}".encode()),
            (b"content-type", b"application/json"),
        ],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 18997),
    }
    comm = ApplicationCommunicator(ProxyApp(fallback, node_getter=lambda: node), scope)
    await comm.send_input({"type": "http.request", "body": orjson.dumps(doc), "more_body": False})
    start = await comm.receive_output(20)
    body = b""
    while True:
        message = await comm.receive_output(20)
        body += message.get("body", b"")
        if not message.get("more_body", False):
            break
    return start["status"], orjson.loads(body)


def granted() -> dict[str, Any]:
    return Lease(
        lane="text",
        owner_node_id="o",
        owner_model_id="big",
        helper_node_id="h",
        helper_model_id="fast",
        load_helper_model=True,
        restore_helper_model=False,
        helper_slots=2,
        probe=False,
        ttl_ms=30_000,
        owner_job_ms=1000.0,
        helper_switch_ms=0.0,
        helper_service_ms=250.0,
    ).to_wire()


CLEAR = {"lane": "text", "owner_node_id": "o", "owner_model_id": "big", "cleared": True}


async def test_a_cleared_lease_ends_on_the_owner_at_once(owner: Owner) -> None:
    node = owner.node
    assert (await post(node, granted()))[0] == 200
    assert node.owner.live("text", "big") is not None

    status, body = await post(node, CLEAR)

    assert (status, body) == (200, {"lane": "text", "owner_model_id": "big", "cleared": True})
    # Long before its 30 s TTL: nothing more is lent or refilled under it.
    assert node.owner.live("text", "big") is None
    assert owner.outcomes() == ["lease_updated", "lease_cleared"]
    node.owner.refill("text", "big")
    node.owner.lend("text", "big")
    assert owner.outcomes() == ["lease_updated", "lease_cleared"]


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"lane": "audio"}, "lane"),
        ({"owner_model_id": ""}, "owner_model_id"),
        ({"owner_model_id": 7}, "owner_model_id"),
        ({"owner_node_id": "other"}, "owner_node_id"),
    ],
)
async def test_a_bad_clear_is_refused_naming_its_field_and_changes_nothing(
    owner: Owner, change: dict[str, Any], param: str
) -> None:
    node = owner.node
    assert (await post(node, granted()))[0] == 200

    status, body = await post(node, {**CLEAR, **change})

    assert status == 400
    assert body["error"]["param"] == param
    assert node.owner.live("text", "big") is not None
    assert owner.outcomes() == ["lease_updated"]
