"""Usage under a real stored key (contract §8) on a master and a slave: a request through the
master and one sent to the slave directly both count under the key's name, on the slave that
answered, in `site/usage` and in the slave's `/metrics`.

Needs the stored keys (`/router/v1/site/api-keys` and the front door recording the caller);
tests/test_usage.py covers the rest of usage without them.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.harness import Cluster, start_cluster, text_model, wait_for

pytestmark = pytest.mark.integration
THROUGH_MASTER = 3
DIRECT = 2


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = start_cluster(tmp_path_factory.mktemp("usage-keys"), [], {"s": [text_model("chat")]})
    try:
        yield c
    finally:
        c.cleanup()


def chat(base_url: str, secret: str) -> httpx.Response:
    body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    headers = {"Authorization": f"Bearer {secret}"}
    return httpx.post(base_url + "/v1/chat/completions", json=body, headers=headers, timeout=60)


def test_a_stored_keys_requests_count_under_its_name_wherever_they_enter(
    cluster: Cluster,
) -> None:
    name = f"team-{uuid.uuid4().hex[:6]}"
    since_ms = int(time.time() * 1000)
    with cluster.master.client() as client:
        made = client.post(
            "/router/v1/site/api-keys", json={"name": name, "role": "inference", "models": None}
        )
    assert made.status_code == 201, made.text
    secret = made.json()["key"]
    for _ in range(THROUGH_MASTER):
        assert chat(cluster.master.base_url, secret).status_code == 200
    slave = cluster.slaves["s"].base_url
    # The key reaches the slave within 5 s (contract §8); every answer after that counts.
    wait_for(lambda: chat(slave, secret).status_code == 200, timeout=5, interval=0.1)
    for _ in range(DIRECT - 1):
        assert chat(slave, secret).status_code == 200

    def rows() -> list[dict[str, Any]]:
        with cluster.master.client() as client:
            doc = client.get(
                "/router/v1/site/usage",
                params={"since_ms": str(since_ms), "group_by": "key,node"},
            ).json()
        return [r for r in doc["rows"] if r["key_name"] == name]

    got = wait_for(
        lambda: (r := rows()) and r[0]["requests"] >= THROUGH_MASTER + DIRECT and r,
        timeout=10,
        interval=0.2,
    )
    assert [(r["node_id"], r["requests"]) for r in got] == [("s", THROUGH_MASTER + DIRECT)]
    assert got[0]["prompt_tokens"] > 0 and got[0]["completion_tokens"] > 0
    text = httpx.get(slave + "/metrics").text
    line = rf'router_key_requests_total\{{key="{re.escape(name)}",outcome="ok"\}} (\S+)'
    counted = re.search(line, text)
    assert counted and float(counted.group(1)) == THROUGH_MASTER + DIRECT
