# ruff: noqa: F811
"""How slaves learn the key table: the master's answer to a pull, the slave's pull (which holds
when pushes fail), and the node route a push arrives on."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from access.keys import (
    KeyRecord,
    KeyTable,
    current_table,
    install_table,
    reset_for_tests,
    secret_hash,
)
from proxy.edge.app import ProxyApp

# The node fixture of the ASGI app's tests, shared: each test's `make_node` argument is it.
from proxy.tests.test_app import Fallback, NodeFactory, make_node, request  # noqa: F401
from registry.keysync import KEYS_PATH, KeySync, keys_answer, keys_file, keys_restore
from registry.nodeclient import AllowList, NodeClient

MASTER_URL = "http://127.0.0.1:18998"
TOKEN = "cluster-token-keysync"
ALICE = "rk-" + "A" * 43
CONDITION_TIMEOUT_SECS = 5.0

WITH_ALICE = KeyTable([KeyRecord(name="alice", key_hash=secret_hash(ALICE))])
# What the master holds once alice is revoked: no usable key, keys still required.
REVOKED = KeyTable([], required=True)


@pytest.fixture(autouse=True)
def _fresh_table() -> Iterator[None]:
    reset_for_tests()
    yield
    reset_for_tests()


class Master:
    """The master at the HTTP seam: answers pulls from `table`, or is unreachable."""

    def __init__(self, table: KeyTable) -> None:
        self.table = table
        self.reachable = True
        self.asked: list[str] = []

    def __call__(self, req: httpx.Request) -> httpx.Response:
        if not self.reachable:
            raise httpx.ConnectError("connection refused", request=req)
        assert req.url.path == KEYS_PATH and req.method == "GET"
        assert req.headers["authorization"] == f"Bearer {TOKEN}"
        mine = req.url.params.get("fingerprint")
        self.asked.append(mine or "")
        if mine == self.table.fingerprint:
            return httpx.Response(200, json={"fingerprint": mine})
        return httpx.Response(200, json=self.table.to_wire())


def slave(make_node: NodeFactory, master: Master) -> Any:
    node = make_node(
        cluster={
            "node_id": "s1",
            "role": "slave",
            "token": TOKEN,
            "master_url": MASTER_URL,
            "public_url": "http://127.0.0.1:18999",
        }
    )
    node.client = NodeClient(
        token=TOKEN,
        allow=AllowList([MASTER_URL]),
        control_timeout=2.0,
        transport=httpx.MockTransport(master),
    )
    return node


async def test_a_pull_takes_the_masters_table_when_the_fingerprints_differ(
    make_node: NodeFactory,
) -> None:
    install_table(WITH_ALICE)
    master = Master(REVOKED)
    sync = KeySync(slave(make_node, master))
    assert await sync.pull_once()
    assert master.asked == [WITH_ALICE.fingerprint]
    assert current_table().fingerprint == REVOKED.fingerprint
    assert current_table().lookup(ALICE.encode()) is None


async def test_a_slave_that_missed_every_push_stops_a_revoked_key_within_its_pull_interval(
    make_node: NodeFactory,
) -> None:
    # No push reaches this slave at all: only its own pull loop can learn of the revocation.
    install_table(WITH_ALICE)
    master = Master(WITH_ALICE)
    sync = KeySync(slave(make_node, master), interval=0.05)
    sync.start()
    try:
        loop = asyncio.get_running_loop()
        master.table = REVOKED
        deadline = loop.time() + CONDITION_TIMEOUT_SECS
        while current_table().lookup(ALICE.encode()) is not None:
            assert loop.time() < deadline, "the revoked key still works"
            await asyncio.sleep(0.01)
    finally:
        await sync.stop()


async def test_an_unchanged_table_is_not_sent_again(make_node: NodeFactory) -> None:
    install_table(WITH_ALICE)
    sync = KeySync(slave(make_node, Master(WITH_ALICE)))
    assert await sync.pull_once()
    assert current_table() is WITH_ALICE


async def test_an_unreachable_master_leaves_the_table_as_it_is(make_node: NodeFactory) -> None:
    install_table(WITH_ALICE)
    master = Master(REVOKED)
    master.reachable = False
    sync = KeySync(slave(make_node, master))
    assert not await sync.pull_once()
    assert current_table() is WITH_ALICE
    assert sync.last_error


def test_the_master_answers_a_pull_with_its_fingerprint_or_its_table() -> None:
    install_table(WITH_ALICE)
    assert keys_answer(WITH_ALICE.fingerprint) == {"fingerprint": WITH_ALICE.fingerprint}
    full = keys_answer("stale")
    assert full["fingerprint"] == WITH_ALICE.fingerprint and len(full["keys"]) == 1  # type: ignore[arg-type]


async def test_a_push_replaces_a_slaves_table_and_a_malformed_one_changes_nothing(
    make_node: NodeFactory,
) -> None:
    node = slave(make_node, Master(REVOKED))
    app = ProxyApp(Fallback(), node_getter=lambda: node)
    auth = [(b"authorization", f"Bearer {TOKEN}".encode())]
    bad = await request(app, "POST", KEYS_PATH, {"keys": [{"name": "x"}]}, headers=auth)
    assert bad.status == 400
    assert current_table().fingerprint != WITH_ALICE.fingerprint
    ok = await request(app, "POST", KEYS_PATH, orjson.dumps(WITH_ALICE.to_wire()), headers=auth)
    assert ok.status == 204
    assert current_table().lookup(ALICE.encode()) is not None
    # Without the cluster token nobody pushes keys.
    assert (await request(app, "POST", KEYS_PATH, WITH_ALICE.to_wire())).status == 401


async def test_only_a_slave_takes_a_push(make_node: NodeFactory) -> None:
    node = make_node(cluster={"node_id": "m", "role": "master", "token": TOKEN})
    app = ProxyApp(Fallback(), node_getter=lambda: node)
    auth = [(b"authorization", f"Bearer {TOKEN}".encode())]
    answer = await request(app, "POST", KEYS_PATH, WITH_ALICE.to_wire(), headers=auth)
    assert answer.status == 409
    assert current_table().lookup(ALICE.encode()) is None


@pytest.mark.django_db(transaction=True)
async def test_the_master_publishes_a_row_written_elsewhere_once(make_node: NodeFactory) -> None:
    from channels.db import database_sync_to_async
    from django.utils import timezone

    from access.services import api_key_create

    node = make_node(cluster={"node_id": "m", "role": "master", "token": TOKEN})
    sync = KeySync(node)
    assert not await sync.watch_once()  # no rows: the empty table in force is theirs
    # What `manage.py create_api_key` or the admin does, in another process or thread.
    write = await database_sync_to_async(api_key_create)(name="scripted", now=timezone.now())
    assert write.secret is not None
    assert await sync.watch_once()
    assert current_table().lookup(write.secret.encode()) is not None
    assert not await sync.watch_once()


async def test_a_slave_keeps_the_masters_table_for_its_next_start(make_node: NodeFactory) -> None:
    node = slave(make_node, Master(WITH_ALICE))
    assert not await keys_restore(node)  # nothing kept yet: starts as before
    assert await KeySync(node).pull_once()
    kept = keys_file(node).read_text()
    assert ALICE not in kept and secret_hash(ALICE) in kept
    # A restart while the master is unreachable: the kept table, not an open node.
    reset_for_tests()
    assert await keys_restore(node)
    assert current_table().fingerprint == WITH_ALICE.fingerprint
    assert current_table().lookup(ALICE.encode()) is not None


async def test_an_unreadable_kept_table_is_ignored(make_node: NodeFactory) -> None:
    node = slave(make_node, Master(WITH_ALICE))
    keys_file(node).parent.mkdir(parents=True, exist_ok=True)
    keys_file(node).write_text("{not json")
    assert not await keys_restore(node)
    assert current_table().fingerprint != WITH_ALICE.fingerprint
