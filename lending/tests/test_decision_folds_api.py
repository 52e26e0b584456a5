"""The folded decision log through the site API: the fan-out to nodes and keyset paging."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from django.test import AsyncClient

from lending.api.views import _fold_place
from lending.decisions import FOLD_SIGNATURE, merge_folds
from proxy.node import Node, build_node, set_node
from registry.nodeclient import AllowList, NodeClient
from routerproject.config import load_config

# The view reads the master's own rows through database_sync_to_async.
pytestmark = pytest.mark.django_db(transaction=True)

URL = "/router/v1/site/offload/decisions/folded"
TOKEN = "cluster-secret-for-fold-tests"
SLAVES = {
    "quick": "http://127.0.0.1:9",
    "silent": "http://127.0.0.2:9",
    "down": "http://127.0.0.3:9",
}
DEADLINE_SECS = 0.5
HANG_GUARD_SECS = 30.0


def fold(node_id: str, last_at: int, owner: str = "big") -> dict[str, Any]:
    doc: dict[str, Any] = dict.fromkeys(FOLD_SIGNATURE, "")
    doc.update(node_id=node_id, kind="dispatch", outcome="lent", owner_model_id=owner)
    doc.update(count=2, first_at=last_at - 5, last_at=last_at, triggers={}, measures={})
    doc.update(router_versions=["1.0"], service_sources=[], request_ids=[], key_names=[])
    return doc


QUICK_FOLDS = [fold("quick", 9000 - i, owner=f"m{i}") for i in range(5)]


@pytest.fixture
async def master(tmp_path: Path) -> AsyncIterator[Node]:
    """A master with three slaves: `quick` answers (and cut its folds), but only once the call
    to `silent` has arrived; `silent` never answers; `down` is not healthy."""
    (tmp_path / "kcpps").mkdir()
    config = {
        "server": {"bind": "127.0.0.1:18995"},
        "cluster": {
            "role": "master",
            "node_id": "master",
            "token": TOKEN,
            "public_url": "http://127.0.0.1:18995",
            "slave_urls": list(SLAVES.values()),
            "store_dir": str(tmp_path / "store"),
            "control_timeout": f"{DEADLINE_SECS}s",
        },
        "models": {"config_dir": str(tmp_path / "kcpps")},
        "backend": {"mode": "sim"},
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    node = build_node(load_config(tmp_path / "config.yaml", environ={}))
    for node_id, url in SLAVES.items():
        node.cluster.apply_poll(url, {"node_id": node_id, "node_url": url, "protocol_version": 2})
    node.cluster.mark_unhealthy(SLAVES["down"], "refused")
    silent_called, never = asyncio.Event(), asyncio.Event()

    async def answer(request: httpx.Request) -> httpx.Response:
        if request.url.host == "127.0.0.2":
            silent_called.set()
            await never.wait()
        # Asked one after the other, `quick` would wait here for a call that never comes (or
        # come after the silent one's deadline): an answer proves both were asked at once.
        await silent_called.wait()
        return httpx.Response(200, json={"folds": QUICK_FOLDS, "rows": 10, "truncated": True})

    node.client = NodeClient(
        token=TOKEN,
        allow=AllowList(list(SLAVES.values())),
        control_timeout=DEADLINE_SECS,
        transport=httpx.MockTransport(answer),
    )
    set_node(node)
    yield node
    set_node(None)
    await node.client.aclose()


async def get(params: dict[str, str]) -> Any:
    response = await asyncio.wait_for(AsyncClient().get(URL, params), HANG_GUARD_SECS)
    assert response.status_code == 200, response.content
    return response.json()


async def test_every_node_is_asked_at_once_and_those_that_did_not_answer_are_named(
    master: Node,
) -> None:
    doc = await get({"limit": "2"})
    assert [f["owner_model_id"] for f in doc["folds"]] == ["m0", "m1"]
    assert (doc["total_folds"], doc["total_rows"]) == (5, 10)
    assert doc["truncated_nodes"] == ["quick"]
    assert doc["node_errors"] == [
        {"node_id": "down", "error": "node is not healthy"},
        {"node_id": "silent", "error": f"no answer within {DEADLINE_SECS:g} s"},
    ]


async def test_pages_by_cursor_cover_every_fold_once_and_the_last_has_none(
    master: Node,
) -> None:
    seen: list[str] = []
    params = {"limit": "2"}
    for _ in range(len(QUICK_FOLDS)):
        doc = await get(params)
        seen += [f["owner_model_id"] for f in doc["folds"]]
        if doc["next_cursor"] is None:
            break
        params = {"limit": "2", "cursor": doc["next_cursor"]}
    assert seen == [f"m{i}" for i in range(5)]


async def test_a_cursor_this_api_did_not_write_is_a_400_naming_cursor(master: Node) -> None:
    response = await AsyncClient().get(URL, {"cursor": "bm90IGEgY3Vyc29y"})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "cursor"


def test_folds_of_one_time_page_in_signature_order_and_a_cursor_neither_repeats_nor_skips() -> None:
    folds = [fold("a", 5000, owner=o) for o in ("z", "b", "m")]
    mine: dict[str, Any] = {"folds": folds, "rows": 6}
    theirs = {"folds": [fold("b", 5000, owner="a")], "rows": 2}
    page = merge_folds({"a": mine, "b": theirs}, offset=0, limit=2)
    assert [(f["node_id"], f["owner_model_id"]) for f in page["folds"]] == [("a", "b"), ("a", "m")]
    # A fold that turns up on top before the next page shifts nothing after the cursor.
    folds.append(fold("a", 9000, owner="new"))
    rest = merge_folds(
        {"a": mine, "b": theirs}, offset=0, limit=5, after=_fold_place(page["next_cursor"])
    )
    assert [(f["node_id"], f["owner_model_id"]) for f in rest["folds"]] == [("a", "z"), ("b", "a")]
    assert rest["next_cursor"] is None
