"""A slave is pushed the links that name it, not the whole set (a publish and a catch-up)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml
from channels.db import database_sync_to_async

from lending import propagate
from lending.links import links_snapshot
from lending.models import ImageLink, TextLink
from lending.propagate import LINKS_PATH, links_by_node, links_publish, node_catch_up
from proxy.node import Node, build_node
from registry.nodeclient import AllowList, NodeClient
from routerproject.config import load_config

pytestmark = pytest.mark.django_db(transaction=True)

TOKEN = "cluster-secret-for-link-push-tests"
SLAVES = {"s1": "http://127.0.0.1:9", "s2": "http://127.0.0.2:9", "s3": "http://127.0.0.3:9"}


@pytest.fixture
async def master(tmp_path: Path) -> AsyncIterator[Node]:
    (tmp_path / "kcpps").mkdir()
    config_path = tmp_path / "config.yaml"
    cluster = {
        "role": "master",
        "node_id": "master",
        "token": TOKEN,
        "public_url": "http://127.0.0.1:18995",
        "slave_urls": list(SLAVES.values()),
        "store_dir": str(tmp_path / "store"),
    }
    config = {
        "server": {"bind": "127.0.0.1:18995"},
        "cluster": cluster,
        "models": {"config_dir": str(tmp_path / "kcpps")},
        "backend": {"mode": "sim"},
    }
    config_path.write_text(yaml.safe_dump(config))
    node = build_node(load_config(config_path, environ={}))
    for node_id, url in SLAVES.items():
        node.cluster.apply_poll(url, {"node_id": node_id, "node_url": url, "protocol_version": 2})
    yield node
    if node.client is not None:
        await node.client.aclose()


def record_pushes(master: Node) -> dict[str, Any]:
    """Install a client whose HTTP seam keeps each slave's last link push (by node)."""
    by_url = {url: node_id for node_id, url in SLAVES.items()}
    pushed: dict[str, Any] = {}

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == LINKS_PATH:
            pushed[by_url[f"{request.url.scheme}://{request.url.host}:{request.url.port}"]] = (
                orjson.loads(request.content)
            )
        return httpx.Response(204)

    master.client = NodeClient(
        token=TOKEN,
        allow=AllowList(list(SLAVES.values())),
        control_timeout=5.0,
        transport=httpx.MockTransport(answer),
    )
    return pushed


def link(owner: str, helper: str) -> dict[str, Any]:
    return {
        "owner_node_id": owner,
        "owner_model_id": "m",
        "helper_node_id": helper,
        "helper_model_id": "m",
    }


def pairs(pushed: dict[str, Any], lane: str) -> list[tuple[str, str]]:
    return [(ln["owner_node_id"], ln["helper_node_id"]) for ln in pushed[lane]]


@database_sync_to_async
def make_links() -> None:
    for owner, helper in (("s1", "s2"), ("s2", "master"), ("master", "absent")):
        TextLink.objects.create(**link(owner, helper))
    ImageLink.objects.create(**link("s3", "s1"))


async def test_a_publish_pushes_each_slave_the_links_naming_it(master: Node) -> None:
    await make_links()
    pushed = record_pushes(master)
    assert await links_publish(master) == {}
    assert pairs(pushed["s1"], "text") == [("s1", "s2")]
    assert pairs(pushed["s1"], "image") == [("s3", "s1")]
    assert pairs(pushed["s2"], "text") == [("s1", "s2"), ("s2", "master")]
    assert (pairs(pushed["s3"], "text"), pairs(pushed["s3"], "image")) == ([], [("s3", "s1")])
    # The master runs the whole set: it plans every link.
    assert len(master.lending.links["text"]) == 3


async def test_a_catch_up_pushes_one_slave_its_own_links(master: Node) -> None:
    await make_links()
    pushed = record_pushes(master)
    await node_catch_up(master, "s2")
    assert list(pushed) == ["s2"]
    assert pairs(pushed["s2"], "text") == [("s1", "s2"), ("s2", "master")]
    assert pushed["s2"]["image"] == []


def test_a_link_from_a_node_to_itself_is_listed_once() -> None:
    own = links_by_node({"text": [link("a", "a"), link("a", "b")], "image": []})
    assert [ln["helper_node_id"] for ln in own["a"]["text"]] == ["a", "b"]
    assert own["b"] == {"text": [link("a", "b")], "image": []}


async def test_catch_ups_at_once_share_one_read_of_the_links(
    master: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    await make_links()
    pushed = record_pushes(master)
    reads: list[int] = []

    def counted() -> dict[str, list[dict[str, Any]]]:
        reads.append(1)
        return links_snapshot()

    monkeypatch.setattr(propagate, "links_snapshot", counted)
    await asyncio.gather(*(node_catch_up(master, node_id) for node_id in SLAVES))
    assert len(reads) == 1
    assert pairs(pushed["s1"], "text") == [("s1", "s2")]
    assert pairs(pushed["s3"], "image") == [("s3", "s1")]
    # A catch-up after that one reads the set again: a later change is seen.
    await database_sync_to_async(TextLink.objects.create)(**link("s3", "s2"))
    await node_catch_up(master, "s3")
    assert len(reads) == 2
    assert pairs(pushed["s3"], "text") == [("s3", "s2")]
