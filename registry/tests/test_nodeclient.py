from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
import orjson
import pytest
from aiohttp import web

from registry.nodeclient import AllowList, NodeCallError, NodeClient, normalize_base_url
from tests.harness import free_port

TOKEN = "cluster-secret"
SLAVE = "http://slave:8080"
BEARER = f"Bearer {TOKEN}"

Handler = Callable[[httpx.Request], Awaitable[httpx.Response]]


class Recorder:
    """An async MockTransport handler that records every request it receives."""

    def __init__(self, respond: Handler) -> None:
        self.requests: list[httpx.Request] = []
        self._respond = respond

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return await self._respond(request)

    @property
    def hosts(self) -> list[str]:
        return [request.url.host for request in self.requests]


def json_reply(status: int, payload: object) -> Handler:
    async def respond(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, json=payload)

    return respond


def make_client(
    recorder: Recorder,
    *,
    allow: tuple[str, ...] = (SLAVE,),
    max_body_bytes: int = 8 * 1024 * 1024,
    control_timeout: float = 5.0,
) -> NodeClient:
    return NodeClient(
        token=TOKEN,
        allow=AllowList(allow),
        control_timeout=control_timeout,
        max_body_bytes=max_body_bytes,
        transport=httpx.MockTransport(recorder),
    )


# --- URL normalization and the allow-list ------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("HTTP://Slave:80/", "http://slave"),
        ("https://Node.Example:443/", "https://node.example"),
        ("https://node:8443/api/", "https://node:8443/api"),
        ("http://node:443", "http://node:443"),
        ("https://node:80", "https://node:80"),
        ("http://node/x/?q=1#frag", "http://node/x"),
        ("  http://node/  ", "http://node"),
        ("http://[::1]:80/", "http://[::1]"),
        ("http://[0:0:0:0:0:0:0:1]:9000", "http://[::1]:9000"),
        ("http://10.0.0.5:5001/Path", "http://10.0.0.5:5001/Path"),
    ],
)
def test_it_normalizes_base_urls(raw: str, expected: str) -> None:
    assert normalize_base_url(raw) == expected


@pytest.mark.parametrize(
    "raw",
    [
        "http://user:pass@slave",
        "http://user@slave",
        "ftp://slave",
        "file:///etc/passwd",
        "slave:8080",
        "http://",
        "http:///path",
        "http://sla ve",
        "http://slave\n.evil",
        "http://slave:99999",
        "http://slave/a/../b",
        "http://bad\\host",
    ],
)
def test_it_rejects_urls_that_cannot_be_a_node_base(raw: str) -> None:
    with pytest.raises(ValueError):
        normalize_base_url(raw)


def test_the_allow_list_matches_by_normalized_base() -> None:
    allow = AllowList(["HTTP://Slave:80/"])
    assert "http://slave" in allow
    assert "http://slave:80/" in allow
    assert "https://slave" not in allow
    assert "http://user@slave" not in allow
    allow.add("https://other:443/")
    assert "https://other" in allow
    allow.discard("HTTPS://OTHER")
    assert "https://other" not in allow
    allow.discard("ftp://never-added")  # an invalid URL is simply not present


def test_base_for_matches_on_a_path_segment_boundary_only() -> None:
    allow = AllowList(["http://a/x"])
    assert allow.base_for("http://a/x") == "http://a/x"
    assert allow.base_for("http://a/x/") == "http://a/x"
    assert allow.base_for("http://a/x/y") == "http://a/x"
    assert allow.base_for("HTTP://A:80/x/y?z=1") == "http://a/x"
    assert allow.base_for("http://a/xy") is None
    assert allow.base_for("http://a/") is None
    assert allow.base_for("http://a/x/../admin") is None
    assert allow.base_for("http://a/x/%2e%2e/admin") is None
    assert allow.base_for("http://ab/x/y") is None
    assert allow.base_for("https://a/x/y") is None
    assert allow.base_for("http://a:8080/x/y") is None


def test_a_root_base_allows_every_path_on_that_origin_only() -> None:
    allow = AllowList(["http://a"])
    assert allow.base_for("http://a/anything/below") == "http://a"
    assert allow.base_for("http://a.evil/anything") is None


def test_base_for_takes_the_longest_base_and_follows_adds_and_discards() -> None:
    allow = AllowList([f"http://127.0.0.1:{port}" for port in range(20000, 21000)])
    allow.add("http://127.0.0.1:20500/deep")
    allow.add("http://127.0.0.1:20500/deep")  # twice: still one base
    assert allow.base_for("http://127.0.0.1:20500/deep/x") == "http://127.0.0.1:20500/deep"
    assert allow.base_for("http://127.0.0.1:20500/deeper") == "http://127.0.0.1:20500"
    assert allow.base_for("http://127.0.0.1:20999/v1") == "http://127.0.0.1:20999"
    assert allow.base_for("http://127.0.0.1:21000/v1") is None
    allow.discard("http://127.0.0.1:20500/deep/")
    assert allow.base_for("http://127.0.0.1:20500/deep/x") == "http://127.0.0.1:20500"
    allow.discard("http://127.0.0.1:20500")
    assert allow.base_for("http://127.0.0.1:20500/deep/x") is None
    assert "http://127.0.0.1:20500" not in allow
    assert len(allow.bases) == 999


# --- control calls -------------------------------------------------------------


async def test_it_sends_the_token_on_every_call() -> None:
    recorder = Recorder(json_reply(200, {"ok": True}))
    client = make_client(recorder)
    try:
        assert await client.call_json("GET", SLAVE, "/router/v1/node/models") == (200, {"ok": True})
        assert await client.call_ok("POST", SLAVE, "/router/v1/node/load", json={"model": "m"}) == {
            "ok": True
        }
    finally:
        await client.aclose()
    assert [r.headers["authorization"] for r in recorder.requests] == [BEARER, BEARER]
    get, post = recorder.requests
    assert str(get.url) == "http://slave:8080/router/v1/node/models"
    assert "content-type" not in get.headers
    assert post.headers["content-type"] == "application/json"
    assert orjson.loads(post.content) == {"model": "m"}


async def test_it_returns_any_status_with_its_json_body() -> None:
    recorder = Recorder(json_reply(409, {"error": {"code": "duplicate_node"}}))
    client = make_client(recorder)
    try:
        status, body = await client.call_json("POST", SLAVE, "/router/v1/node/register", json={})
    finally:
        await client.aclose()
    assert status == 409
    assert body == {"error": {"code": "duplicate_node"}}


async def test_call_ok_raises_a_status_error_even_for_a_plain_text_body() -> None:
    async def unauthorized(request: httpx.Request) -> httpx.Response:
        return httpx.Response(401, text="unauthorized")

    client = make_client(Recorder(unauthorized))
    try:
        with pytest.raises(NodeCallError) as caught:
            await client.call_ok("GET", SLAVE, "/router/v1/node/models")
    finally:
        await client.aclose()
    assert caught.value.kind == "status"
    assert caught.value.status == 401
    assert caught.value.body == b"unauthorized"


@pytest.mark.parametrize(
    ("base", "path"),
    [
        ("http://elsewhere:8080", "/router/v1/node/models"),
        ("https://slave:8080", "/router/v1/node/models"),
        ("http://user:pw@slave:8080", "/router/v1/node/models"),
        ("ftp://slave:8080", "/router/v1/node/models"),
    ],
)
async def test_a_base_that_is_not_allowed_fails_without_sending(base: str, path: str) -> None:
    recorder = Recorder(json_reply(200, {}))
    client = make_client(recorder)
    try:
        with pytest.raises(NodeCallError) as caught:
            await client.call_json("GET", base, path)
    finally:
        await client.aclose()
    assert caught.value.kind == "not_allowed"
    assert recorder.requests == []


async def test_a_path_that_climbs_out_of_the_allowed_base_fails_without_sending() -> None:
    recorder = Recorder(json_reply(200, {}))
    client = make_client(recorder, allow=("http://a/node",))
    try:
        with pytest.raises(NodeCallError) as caught:
            await client.call_json("GET", "http://a/node", "/../admin")
    finally:
        await client.aclose()
    assert caught.value.kind == "not_allowed"
    assert recorder.requests == []


async def test_a_url_added_later_becomes_reachable() -> None:
    recorder = Recorder(json_reply(200, {}))
    client = make_client(recorder, allow=())
    try:
        with pytest.raises(NodeCallError):
            await client.call_json("GET", SLAVE, "/router/v1/node/models")
        client.allow.add(SLAVE)
        assert await client.call_json("GET", SLAVE, "/router/v1/node/models") == (200, {})
    finally:
        await client.aclose()
    assert len(recorder.requests) == 1


async def test_a_request_body_over_the_cap_fails_before_sending() -> None:
    recorder = Recorder(json_reply(200, {}))
    client = make_client(recorder, max_body_bytes=64)
    try:
        with pytest.raises(NodeCallError) as caught:
            await client.call_json("POST", SLAVE, "/router/v1/node/register", json={"x": "y" * 64})
        # A body just at the cap is fine.
        payload = {"x": "y" * (64 - len(orjson.dumps({"x": ""})))}
        assert len(orjson.dumps(payload)) == 64
        assert await client.call_json("POST", SLAVE, "/p", json=payload) == (200, {})
    finally:
        await client.aclose()
    assert caught.value.kind == "too_large"
    assert len(recorder.requests) == 1


async def test_a_streamed_response_over_the_cap_is_cut_off_while_reading() -> None:
    chunk_bytes = 1024
    total_chunks = 100
    produced: list[int] = []

    async def chunks() -> AsyncIterator[bytes]:
        for index in range(total_chunks):
            produced.append(index)
            yield b" " * chunk_bytes

    async def respond(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=chunks())

    client = make_client(Recorder(respond), max_body_bytes=4 * chunk_bytes)
    try:
        with pytest.raises(NodeCallError) as caught:
            await client.call_json("GET", SLAVE, "/router/v1/node/models")
    finally:
        await client.aclose()
    assert caught.value.kind == "too_large"
    # Reading stopped right after the cap was crossed instead of draining the body.
    assert len(produced) == 5


async def test_a_declared_content_length_over_the_cap_is_refused() -> None:
    async def respond(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=b"[" + b"1," * 100 + b"1]")

    client = make_client(Recorder(respond), max_body_bytes=50)
    try:
        with pytest.raises(NodeCallError) as caught:
            await client.call_json("GET", SLAVE, "/router/v1/node/models")
    finally:
        await client.aclose()
    assert caught.value.kind == "too_large"


async def test_a_body_that_is_not_json_is_reported_with_its_status() -> None:
    async def respond(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text="<html>not json</html>")

    client = make_client(Recorder(respond))
    try:
        with pytest.raises(NodeCallError) as caught:
            await client.call_json("GET", SLAVE, "/router/v1/node/models")
    finally:
        await client.aclose()
    assert caught.value.kind == "invalid_json"
    assert caught.value.status == 200
    assert caught.value.body == b"<html>not json</html>"


async def test_a_204_reply_decodes_to_none() -> None:
    async def respond(request: httpx.Request) -> httpx.Response:
        return httpx.Response(204)

    client = make_client(Recorder(respond))
    try:
        assert await client.call_json("POST", SLAVE, "/router/v1/node/unload", json={}) == (
            204,
            None,
        )
    finally:
        await client.aclose()


async def test_a_peer_that_never_answers_times_out() -> None:
    never = asyncio.Event()

    async def respond(request: httpx.Request) -> httpx.Response:
        await never.wait()
        return httpx.Response(200, json={})

    client = make_client(Recorder(respond))
    try:
        with pytest.raises(NodeCallError) as caught:
            await asyncio.wait_for(
                client.call_json("GET", SLAVE, "/router/v1/node/models", timeout=0.05), 2
            )
    finally:
        await client.aclose()
    assert caught.value.kind == "timeout"


async def test_the_control_timeout_also_bounds_reading_the_body() -> None:
    never = asyncio.Event()

    async def stalled_body() -> AsyncIterator[bytes]:
        yield b'{"partial":'
        await never.wait()
        yield b"1}"

    async def respond(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=stalled_body())

    client = make_client(Recorder(respond), control_timeout=0.05)
    try:
        with pytest.raises(NodeCallError) as caught:
            await asyncio.wait_for(client.call_json("GET", SLAVE, "/router/v1/node/models"), 2)
    finally:
        await client.aclose()
    assert caught.value.kind == "timeout"


async def test_a_transport_failure_is_reported_as_transport() -> None:
    async def respond(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    client = make_client(Recorder(respond))
    try:
        with pytest.raises(NodeCallError) as caught:
            await client.call_json("GET", SLAVE, "/router/v1/node/models")
    finally:
        await client.aclose()
    assert caught.value.kind == "transport"


async def test_a_closed_client_refuses_further_calls() -> None:
    recorder = Recorder(json_reply(200, {}))
    client = make_client(recorder)
    await client.aclose()
    with pytest.raises(NodeCallError) as caught:
        await client.call_json("GET", SLAVE, "/router/v1/node/models")
    assert caught.value.kind == "transport"
    assert recorder.requests == []


def test_a_client_used_on_a_second_event_loop_fails_loudly() -> None:
    client = make_client(Recorder(json_reply(200, {})))
    assert asyncio.run(client.call_json("GET", SLAVE, "/p")) == (200, {})
    with pytest.raises(RuntimeError, match="event loop"):
        asyncio.run(client.call_json("GET", SLAVE, "/p"))
    asyncio.run(client.aclose())


# --- redirects -----------------------------------------------------------------


def redirecting(hops: dict[str, tuple[int, str]]) -> Handler:
    """Redirect each listed path to its target; answer everything else with JSON."""

    async def respond(request: httpx.Request) -> httpx.Response:
        hop = hops.get(request.url.path)
        if hop is not None:
            return httpx.Response(hop[0], headers={"Location": hop[1]})
        return httpx.Response(
            200,
            json={
                "method": request.method,
                "path": request.url.path,
                "body": request.content.decode(),
            },
        )

    return respond


async def test_a_redirect_within_the_base_is_followed_with_the_token() -> None:
    recorder = Recorder(
        redirecting(
            {
                "/node/old": (301, "/node/mid"),
                "/node/mid": (307, "http://SLAVE:8080/node/new"),
            }
        )
    )
    client = make_client(recorder, allow=("http://slave:8080/node",))
    try:
        body = await client.call_ok("GET", "http://slave:8080/node", "/old")
    finally:
        await client.aclose()
    assert body["path"] == "/node/new"
    assert [r.url.path for r in recorder.requests] == ["/node/old", "/node/mid", "/node/new"]
    assert all(r.headers["authorization"] == BEARER for r in recorder.requests)


async def test_a_redirect_to_another_host_is_refused_and_the_token_never_goes_there() -> None:
    recorder = Recorder(redirecting({"/router/v1/node/models": (302, "http://evil:8080/steal")}))
    client = make_client(recorder)
    try:
        with pytest.raises(NodeCallError) as caught:
            await client.call_json("GET", SLAVE, "/router/v1/node/models")
    finally:
        await client.aclose()
    assert caught.value.kind == "redirect"
    assert recorder.hosts == ["slave"]


@pytest.mark.parametrize(
    "location",
    [
        "https://slave:8080/node/x",  # other scheme
        "http://slave:9090/node/x",  # other port
        "http://slave:8080/admin",  # same origin, outside the base path
        "http://slave:8080/nodeevil",  # prefix but not on a segment boundary
        "/node/%2e%2e/admin",  # encoded climb out of the base
        "http://user:pw@slave:8080/node/x",  # userinfo
    ],
)
async def test_a_redirect_outside_the_allowed_base_is_refused(location: str) -> None:
    recorder = Recorder(redirecting({"/node/start": (308, location)}))
    client = make_client(recorder, allow=("http://slave:8080/node",))
    try:
        with pytest.raises(NodeCallError) as caught:
            await client.call_json("POST", "http://slave:8080/node", "/start", json={"a": 1})
    finally:
        await client.aclose()
    assert caught.value.kind == "redirect"
    assert [r.url.path for r in recorder.requests] == ["/node/start"]


@pytest.mark.parametrize(
    ("status", "method", "expected_method", "expected_body"),
    [
        (303, "POST", "GET", ""),
        (303, "PUT", "GET", ""),
        (301, "POST", "GET", ""),
        (302, "POST", "GET", ""),
        (302, "PUT", "PUT", '{"a":1}'),
        (307, "POST", "POST", '{"a":1}'),
        (308, "POST", "POST", '{"a":1}'),
    ],
)
async def test_redirects_switch_method_and_body_by_status(
    status: int, method: str, expected_method: str, expected_body: str
) -> None:
    recorder = Recorder(redirecting({"/router/v1/node/a": (status, "/router/v1/node/b")}))
    client = make_client(recorder)
    try:
        body = await client.call_ok(method, SLAVE, "/router/v1/node/a", json={"a": 1})
    finally:
        await client.aclose()
    assert body == {"method": expected_method, "path": "/router/v1/node/b", "body": expected_body}
    final = recorder.requests[-1]
    assert final.headers["authorization"] == BEARER
    assert ("content-type" in final.headers) == bool(expected_body)


async def test_more_than_ten_redirects_are_refused() -> None:
    hops = {f"/r/{index}": (302, f"/r/{index + 1}") for index in range(20)}
    recorder = Recorder(redirecting(hops))
    client = make_client(recorder)
    try:
        with pytest.raises(NodeCallError) as caught:
            await client.call_json("GET", SLAVE, "/r/0")
    finally:
        await client.aclose()
    assert caught.value.kind == "redirect"
    # The original request plus ten followed redirects.
    assert len(recorder.requests) == 11


async def test_exactly_ten_redirects_are_followed() -> None:
    hops = {f"/r/{index}": (302, f"/r/{index + 1}") for index in range(10)}
    recorder = Recorder(redirecting(hops))
    client = make_client(recorder)
    try:
        body = await client.call_ok("GET", SLAVE, "/r/0")
    finally:
        await client.aclose()
    assert body["path"] == "/r/10"


# --- streaming -----------------------------------------------------------------


async def test_stream_replaces_the_incoming_authorization_and_yields_raw_chunks() -> None:
    parts = [b"data: one\n\n", b"data: two\n\n", b"data: [DONE]\n\n"]

    async def events() -> AsyncIterator[bytes]:
        for part in parts:
            yield part

    async def respond(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=events(), headers={"content-type": "text/event-stream"})

    recorder = Recorder(respond)
    client = make_client(recorder)
    incoming = {
        "Authorization": "Bearer user-inference-key",
        "Content-Type": "application/json",
        "Host": "router.public",
        "Content-Length": "999",
        "Proxy-Authorization": "Basic abc",
        "X-Request-Id": "r-1",
    }
    try:
        async with client.stream(
            "POST",
            SLAVE,
            "/router/v1/node/inference/v1/chat/completions",
            content=b'{"model":"m","stream":true}',
            headers=incoming,
            params={"trace": "1"},
        ) as response:
            received = [chunk async for chunk in response.aiter_raw()]
    finally:
        await client.aclose()
    assert received == parts
    (sent,) = recorder.requests
    assert sent.headers.get_list("authorization") == [BEARER]
    assert sent.headers["host"] == "slave:8080"
    assert sent.headers["content-length"] == str(len(b'{"model":"m","stream":true}'))
    assert "proxy-authorization" not in sent.headers
    assert sent.headers["x-request-id"] == "r-1"
    assert sent.url.params["trace"] == "1"
    assert sent.content == b'{"model":"m","stream":true}'


async def test_stream_to_a_base_that_is_not_allowed_never_sends() -> None:
    recorder = Recorder(json_reply(200, {}))
    client = make_client(recorder)
    try:
        with pytest.raises(NodeCallError) as caught:
            async with client.stream(
                "POST", "http://elsewhere", "/v1/chat/completions", content=b"{}", headers={}
            ):
                pass
    finally:
        await client.aclose()
    assert caught.value.kind == "not_allowed"
    assert recorder.requests == []


# --- the default aiohttp transport against a real server -----------------------


@pytest.fixture
async def real_node() -> AsyncIterator[str]:
    async def models(request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != BEARER:
            return web.Response(status=401, text="unauthorized")
        return web.json_response({"node_id": "slave-a", "models": []})

    async def moved(request: web.Request) -> web.Response:
        raise web.HTTPTemporaryRedirect("/router/v1/node/models")

    async def generate(request: web.Request) -> web.StreamResponse:
        if request.headers.get("Authorization") != BEARER:
            return web.Response(status=401, text="unauthorized")
        prompt = await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for index in range(3):
            await response.write(b"data: " + prompt + b" " + str(index).encode() + b"\n\n")
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_get("/router/v1/node/models", models)
    app.router.add_get("/router/v1/node/moved", moved)
    app.router.add_post("/router/v1/node/inference/v1/completions", generate)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()


async def test_the_default_aiohttp_transport_talks_to_a_real_node(real_node: str) -> None:
    client = NodeClient(token=TOKEN, allow=AllowList([real_node]), control_timeout=5.0)
    try:
        snapshot = await client.call_ok("GET", real_node, "/router/v1/node/models")
        redirected = await client.call_ok("GET", real_node, "/router/v1/node/moved")
        async with client.stream(
            "POST",
            real_node,
            "/router/v1/node/inference/v1/completions",
            content=b"hi",
            headers={"Authorization": "Bearer someone-else", "Content-Type": "text/plain"},
        ) as response:
            status = response.status_code
            streamed = b"".join([chunk async for chunk in response.aiter_raw()])
    finally:
        await client.aclose()
    assert snapshot == {"node_id": "slave-a", "models": []}
    assert redirected == snapshot
    assert status == 200
    assert streamed == b"data: hi 0\n\ndata: hi 1\n\ndata: hi 2\n\n"


async def test_the_default_transport_reports_a_refused_connection_as_transport() -> None:
    base = f"http://127.0.0.1:{free_port()}"
    client = NodeClient(token=TOKEN, allow=AllowList([base]), control_timeout=5.0)
    try:
        with pytest.raises(NodeCallError) as caught:
            await client.call_json("GET", base, "/router/v1/node/models")
    finally:
        await client.aclose()
    assert caught.value.kind == "transport"
