"""A `/v1/realtime` session cannot pin its lane without limit (issue 27 part 2), on a real node:
no frames either way for `server.realtime_idle_timeout` closes it with 1001, while a session
that talks stays open; a request for another model on the lane a session holds gets a 503
`lane_held_by_session` after `cluster.control_timeout` instead of waiting without end."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from tests.harness import ModelSpec, RouterNode, running_node, sim_weights, text_model, wait_for

pytestmark = pytest.mark.integration

# Long enough that a loaded machine (the whole suite on two cores) cannot stall the talking
# client a whole idle period between its frames.
IDLE_SECS = 3.0
CONTROL_SECS = 0.5
RECV_SECS = 10.0


def talker(**costs: Any) -> ModelSpec:
    return ModelSpec(
        "talk",
        {"contextsize": 4096, "parallel": 1},
        {"model_param": sim_weights(**costs), "ttsmodel": sim_weights(**costs)},
    )


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RouterNode]:
    root = tmp_path_factory.mktemp("realtime-idle")
    with running_node(
        root,
        [talker(base_ms=5), text_model("other", load_ms=5, base_ms=1)],
        server={"realtime_idle_timeout": f"{IDLE_SECS}s"},
        cluster={"control_timeout": f"{CONTROL_SECS}s"},
    ) as n:
        yield n


def session(node: RouterNode) -> ClientConnection:
    url = node.base_url.replace("http://", "ws://") + "/v1/realtime?model=talk"
    # The client answers pings (as browsers do): they must not count as the session talking.
    return connect(url, open_timeout=30, ping_interval=0.2)


def _ended(node: RouterNode) -> int:
    return sum("realtime session for talk" in ln and "ended after" in ln for ln in list(node.lines))


def test_an_idle_session_is_closed_with_1001_and_frees_its_backend(node: RouterNode) -> None:
    ended = _ended(node)
    with session(node) as ws:
        ws.send('{"type": "ping-me"}')
        ws.recv(timeout=RECV_SECS)
        quiet_from = time.monotonic()
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                ws.recv(timeout=RECV_SECS)
        waited = time.monotonic() - quiet_from
    assert closed.value.rcvd is not None
    assert closed.value.rcvd.code == 1001
    assert "idle" in closed.value.rcvd.reason
    assert IDLE_SECS * 0.9 <= waited < IDLE_SECS + 5
    # The relay ended, and with it the backend's socket and the runtime it held.
    wait_for(lambda: _ended(node) > ended)
    assert [ln for ln in node.lines if f"idle for {IDLE_SECS:g}s: closed" in ln]


def test_a_session_that_talks_stays_open_past_the_idle_limit(node: RouterNode) -> None:
    with session(node) as ws:
        started = time.monotonic()
        while time.monotonic() - started < IDLE_SECS * 2:
            ws.send('{"type": "still-here"}')
            ws.recv(timeout=RECV_SECS)
            time.sleep(IDLE_SECS / 4)  # the client's own pace between frames, not a wait
        ws.send('{"type": "last"}')
        assert ws.recv(timeout=RECV_SECS)


def test_another_model_on_the_lane_a_session_holds_gets_a_503_not_a_wait(node: RouterNode) -> None:
    chat = {"model": "other", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    with session(node) as ws, node.client(timeout=IDLE_SECS * 0.9) as client:
        ws.send('{"type": "hold"}')
        ws.recv(timeout=RECV_SECS)
        asked = time.monotonic()
        resp = client.post("/v1/chat/completions", json=chat)
        waited = time.monotonic() - asked
        assert resp.status_code == 503, resp.text
        error = resp.json()["error"]
        assert error["code"] == "lane_held_by_session"
        assert "talk" in error["message"]
        assert int(resp.headers["retry-after"]) >= 1
        assert waited >= CONTROL_SECS * 0.9
        # The session is untouched by the refusal.
        ws.send('{"type": "still-mine"}')
        assert ws.recv(timeout=RECV_SECS)
    # Once the session is gone, the other model loads as usual.
    with node.client() as client:
        assert client.post("/v1/chat/completions", json=chat).status_code == 200
