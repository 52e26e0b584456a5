"""Fair share on a real node (`auth.fair_share: true`): the router queue in front of every model.

One node, one simulated model with `parallel` 1. The first tests hold without stored keys
(requests with a config key are one tenant): the backend never gets more than `parallel`
requests, the rest wait in the router where `site/nodes/state` and `/metrics` show them, and
a client that gives up while waiting leaves at once without reaching the backend.

The last test uses stored keys (issue 25, `POST /router/v1/site/api-keys`): two keys, one
flooding, one sending a single request that goes ahead of the flood (skipped on a build
without stored keys).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.harness import ModelSpec, RouterNode, sim_weights, start_node, wait_for

pytestmark = pytest.mark.integration

ADMIN_KEY = "fair-share-admin-key-0123456789abcdef"
INFERENCE_KEY = "fair-share-inference-key-0123456789ab"
MODEL = "chat"
# A request with max_tokens n takes 100 + 10 n ms in the sim.
BASE_MS = 100
MS_PER_TOKEN = 10


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RouterNode]:
    root: Path = tmp_path_factory.mktemp("fair-share")
    spec = ModelSpec(
        MODEL,
        {"contextsize": 4096, "parallel": 1},
        {"model_param": sim_weights(load_ms=0, base_ms=BASE_MS, output_ms_per_token=MS_PER_TOKEN)},
    )
    n = start_node(
        root,
        [spec],
        auth={"admin_keys": [ADMIN_KEY], "inference_keys": [INFERENCE_KEY], "fair_share": True},
    )
    try:
        yield n
    finally:
        n.cleanup()


@pytest.fixture
def admin(node: RouterNode) -> Iterator[httpx.Client]:
    with node.client(headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as c:
        yield c


def chat(max_tokens: int) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": max_tokens,
    }


def send(node: RouterNode, secret: str, max_tokens: int, out: list[Any], **kwargs: Any) -> None:
    """POST one chat request; append its status (or the exception) and when it finished."""
    try:
        with node.client(**kwargs) as c:
            resp = c.post(
                "/v1/chat/completions",
                json=chat(max_tokens),
                headers={"Authorization": f"Bearer {secret}"},
            )
            out.append((resp.status_code, time.monotonic()))
    except httpx.HTTPError as exc:
        out.append((exc, time.monotonic()))


def in_thread(*args: Any, **kwargs: Any) -> threading.Thread:
    thread = threading.Thread(target=send, args=args, kwargs=kwargs, daemon=True)
    thread.start()
    return thread


def sim_stats(admin: httpx.Client) -> dict[str, Any]:
    state = admin.get("/router/v1/site/nodes/state").json()
    backend = next(b for b in state["backends"] if b["id"] == "text-runtime")
    return httpx.get(backend["base_url"] + "/sim/stats").json()


def waiting(admin: httpx.Client, key: str | None = None) -> int:
    rows = admin.get("/router/v1/site/nodes/state").json()["waiting_by_key"]
    return sum(r["waiting"] for r in rows if r["model_id"] == MODEL and r["key"] == key)


def warm(node: RouterNode) -> None:
    out: list[Any] = []
    send(node, INFERENCE_KEY, 1, out)
    assert out[0][0] == 200


def test_the_backend_gets_at_most_parallel_and_the_rest_wait_in_the_router(
    node: RouterNode, admin: httpx.Client
) -> None:
    warm(node)
    out: list[Any] = []
    # The first holds the backend for 3 s, so the three after it are all waiting while the test
    # looks, however loaded the machine.
    threads = [in_thread(node, INFERENCE_KEY, 290, out)]
    wait_for(lambda: sim_stats(admin)["active"] == 1)
    threads += [in_thread(node, INFERENCE_KEY, 20, out) for _ in range(3)]
    # They wait in the router queue, under no stored key.
    wait_for(lambda: waiting(admin) == 3)
    stats = sim_stats(admin)
    assert (stats["active"], stats["waiting"]) == (1, 0)
    metrics = admin.get("/metrics").text
    assert threads[0].is_alive()
    assert f'router_queue_waiting_by_key{{key="",lane="text",model="{MODEL}"}} 3.0' in metrics
    while any(t.is_alive() for t in threads):
        # The backend never holds more than one, all the way down.
        assert sim_stats(admin)["waiting"] == 0
        time.sleep(0.05)
    assert [status for status, _ in out] == [200] * 4
    assert waiting(admin) == 0
    assert "key=-" in node.output()


def test_a_client_that_gives_up_while_waiting_leaves_at_once_and_never_runs(
    node: RouterNode, admin: httpx.Client
) -> None:
    warm(node)
    before = sim_stats(admin)
    long_out: list[Any] = []
    long = in_thread(node, INFERENCE_KEY, 150, long_out)  # 1.6 s
    wait_for(lambda: sim_stats(admin)["active"] == 1)
    gone: list[Any] = []
    quitter = in_thread(node, INFERENCE_KEY, 1, gone, timeout=0.4)
    wait_for(lambda: waiting(admin) == 1)
    quitter.join(5)
    assert isinstance(gone[0][0], httpx.TimeoutException)
    # Its place is free while the long request still runs.
    wait_for(lambda: waiting(admin) == 0, timeout=1.0)
    assert long.is_alive()
    after_out: list[Any] = []
    in_thread(node, INFERENCE_KEY, 1, after_out).join(10)
    long.join(10)
    assert [s for s, _ in long_out + after_out] == [200, 200]
    # The backend ran the long request and the one after; the one that left never reached it.
    after = sim_stats(admin)
    assert after["completed"] - before["completed"] == 2
    assert after["cancelled"] == before["cancelled"]


def test_a_trickle_key_goes_ahead_of_a_flood_key(node: RouterNode, admin: httpx.Client) -> None:
    """Needs stored keys (issue 25): skipped on a build without `site/api-keys`."""
    secrets: dict[str, str] = {}
    for name in ("flood", "trickle"):
        resp = admin.post(
            "/router/v1/site/api-keys",
            json={"name": f"fair-{name}", "role": "inference", "share": 1},
        )
        if resp.status_code in (404, 405):
            pytest.skip("needs stored keys (issue 25: POST /router/v1/site/api-keys)")
        assert resp.status_code == 201, resp.text
        secrets[name] = resp.json()["key"]
    warm(node)
    flood: list[Any] = []
    # The flood's first request holds the backend (3 s), so its nine others are all waiting
    # when the trickle's one comes, however slowly the machine starts their threads.
    threads = [in_thread(node, secrets["flood"], 290, flood)]
    wait_for(lambda: sim_stats(admin)["active"] == 1)
    threads += [in_thread(node, secrets["flood"], 1, flood) for _ in range(9)]
    wait_for(lambda: waiting(admin, "fair-flood") == 9)
    assert threads[0].is_alive()
    trickle: list[Any] = []
    in_thread(node, secrets["trickle"], 1, trickle).join(20)
    for thread in threads:
        thread.join(20)
    assert [s for s, _ in flood + trickle] == [200] * 11
    # The trickle's request runs next, ahead of all nine that waited: first come, first served
    # would have put it behind them.
    behind = sum(1 for _, done in flood if done > trickle[0][1])
    assert behind == 9
    assert "key=fair-trickle" in node.output()
