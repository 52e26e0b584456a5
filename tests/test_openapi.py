"""The OpenAPI document at /router/v1/schema: valid, in step with the code, true to real answers."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import orjson
import pytest
import yaml
from asgiref.sync import async_to_sync
from asgiref.testing import ApplicationCommunicator
from django.conf import settings
from django.test import AsyncClient
from django.urls import URLPattern, URLResolver, get_resolver, resolve
from jsonschema import Draft202012Validator
from openapi_spec_validator import OpenAPIV31SpecValidator, validate
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from analytics.tests.factories import RequestRecordFactory
from lending.tests.factories import OffloadDecisionFactory
from proxy.api.schema import OPENAPI_CONTENT_TYPE, openapi_bytes, openapi_document
from proxy.edge.app import ProxyApp
from proxy.edge.routes import ROUTES
from proxy.node import Node, build_node, set_node
from registry import services
from registry.httpclient import close_session
from registry.recipes import Component, Recipe
from routerproject.asgi import application
from routerproject.config import load_config

# The views reach the database through database_sync_to_async, which closes the connection
# around each call: only committed rows (transaction=True) survive that.
pytestmark = pytest.mark.django_db(transaction=True)

SCHEMA_URL = "/router/v1/schema"
DOCS_URL = "/router/v1/docs"
SIDECAR_STATIC = "/static/drf_spectacular_sidecar/swagger-ui-dist/"
ADMIN_KEY = "admin-key-for-openapi-tests"
NODE_ID = "schema-test"
PROBE_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS")
OPENAPI_METHODS = frozenset(m.lower() for m in PROBE_METHODS) | {"trace"}
# Contract §4: the client paths the document must describe.
CLIENT_PATHS = (
    "/v1/models",
    "/v1/models/{model}",
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/images/generations",
    "/v1/audio/transcriptions",
    "/api/chat",
    "/api/generate",
    "/api/tags",
    "/api/ps",
    "/api/v1/generate",
    "/api/v1/model",
    "/api/extra/version",
    "/ping",
)
# Served without any key: the health check and orchestrators' probes.
PUBLIC_PATHS = ("/ping", "/healthz", "/readyz")
MESSAGE_TIMEOUT_SECS = 20.0
SIM_WEIGHTS = {"load_ms": 5, "base_ms": 1, "prompt_ms_per_token": 0, "output_ms_per_token": 1}


# -- fixtures and helpers --------------------------------------------------------------------


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    """A standalone node with a text, a vision and an image model, installed as the node."""
    kcpps, weights = tmp_path / "kcpps", tmp_path / "weights"
    kcpps.mkdir()
    weights.mkdir()
    for name in ("chat", "picture"):
        (weights / f"{name}.sim.json").write_text(json.dumps(SIM_WEIGHTS))
    (weights / "seer.sim.json").write_text(json.dumps({**SIM_WEIGHTS, "vision": True}))
    for name, extra in (("chat", {}), ("seer", {"mmproj": "../weights/seer.sim.json"})):
        text = {"model_param": f"../weights/{name}.sim.json", "contextsize": 4096, "parallel": 1}
        (kcpps / f"{name}.kcpps").write_text(json.dumps({"backend_mode": "sim", **text, **extra}))
    (kcpps / "picture.kcpps").write_text(
        json.dumps({"backend_mode": "sim", "sdmodel": "../weights/picture.sim.json"})
    )
    config_path = tmp_path / "config.yaml"
    config_path.write_text(
        yaml.safe_dump(
            {
                "server": {"bind": "127.0.0.1:18998"},
                "cluster": {"node_id": NODE_ID, "store_dir": str(tmp_path / "store")},
                "models": {"config_dir": str(kcpps)},
                "backend": {"mode": "sim"},
            }
        )
    )
    built = build_node(load_config(config_path, environ={}))
    set_node(built)
    try:
        yield built
    finally:
        set_node(None)
        async_to_sync(built.runtimes.close)()


@pytest.fixture
def admin_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    router = settings.ROUTER
    auth = router.auth.model_copy(update={"admin_keys": [ADMIN_KEY]})
    monkeypatch.setattr(settings, "ROUTER", router.model_copy(update={"auth": auth}))


class EdgeResponse:
    """An answer as a client on the network gets it."""

    def __init__(self, status: int, headers: Iterable[tuple[bytes, bytes]], content: bytes):
        self.status_code = status
        self.headers = {k.decode().lower(): v.decode() for k, v in headers}
        self.content = content

    def __getitem__(self, name: str) -> str:
        return self.headers[name.lower()]

    def json(self) -> Any:
        return orjson.loads(self.content)


class EdgeClient:
    """Requests through the router's whole ASGI application, the proxy's edge first.

    The admin key is checked there, before Django reads the body, so a test of what a client
    without the key gets must come in this way; Django's test client would skip the check.
    """

    def get(self, path: str, data: dict[str, str] | None = None) -> EdgeResponse:
        return self.generic("GET", path, query=urlencode(data or {}))

    def post(
        self, path: str, data: bytes = b"", content_type: str = "application/json"
    ) -> EdgeResponse:
        return self.generic("POST", path, data, content_type)

    def delete(self, path: str) -> EdgeResponse:
        return self.generic("DELETE", path)

    def generic(
        self,
        method: str,
        path: str,
        data: bytes = b"",
        content_type: str = "application/octet-stream",
        *,
        query: str = "",
        headers: dict[str, str] | None = None,
    ) -> EdgeResponse:
        if "?" in path:
            path, query = path.split("?", 1)
        sent = [
            (b"host", b"testserver"),
            (b"content-type", content_type.encode()),
            (b"content-length", str(len(data)).encode()),
        ]
        sent += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
        return async_to_sync(self._call)(method, path, query, data, sent)

    @staticmethod
    async def _call(
        method: str, path: str, query: str, body: bytes, headers: list[tuple[bytes, bytes]]
    ) -> EdgeResponse:
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": method,
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": query.encode(),
            "headers": headers,
            "client": ("127.0.0.1", 50000),
            "server": ("testserver", 80),
        }
        comm = ApplicationCommunicator(application, scope)
        await comm.send_input({"type": "http.request", "body": body, "more_body": False})
        start = await comm.receive_output(MESSAGE_TIMEOUT_SECS)
        chunks: list[bytes] = []
        while True:
            message = await comm.receive_output(MESSAGE_TIMEOUT_SECS)
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        await comm.wait(MESSAGE_TIMEOUT_SECS)
        return EdgeResponse(start["status"], start.get("headers", []), b"".join(chunks))


@pytest.fixture
def client() -> EdgeClient:
    return EdgeClient()


def _closed(node: Any) -> Any:
    """The document with every described object closed to undocumented fields.

    The published document leaves objects open so clients survive new fields; the tests close
    them so that a field a view returns but the document does not name fails here.
    """
    if isinstance(node, dict):
        out = {key: _closed(value) for key, value in node.items()}
        described = out.get("type") == "object" and "properties" in out
        if described and "additionalProperties" not in out:
            out["unevaluatedProperties"] = False
        return out
    if isinstance(node, list):
        return [_closed(item) for item in node]
    return node


def _pointer(*parts: str) -> str:
    return "/".join(p.replace("~", "~0").replace("/", "~1") for p in parts)


def assert_matches(
    path: str,
    method: str,
    status: int,
    body: Any,
    content_type: str = "application/json",
) -> None:
    """`body` validates against the document's schema for that answer (objects closed)."""
    doc = _closed(openapi_document())
    response = doc["paths"][path][method.lower()]["responses"][str(status)]
    base = "#/paths/" + _pointer(path, method.lower(), "responses", str(status))
    if "$ref" in response:
        base = response["$ref"]
        response = doc["components"]["responses"][base.rsplit("/", 1)[1]]
    assert content_type in response["content"], f"{path} {status} has no {content_type}"
    uri = "urn:router-openapi"
    registry: Registry[Any] = Registry().with_resource(
        uri, Resource.from_contents(doc, default_specification=DRAFT202012)
    )
    target = {"$ref": f"{uri}{base}/" + _pointer("content", content_type, "schema")}
    validator = Draft202012Validator(target, registry=registry)
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(body)]
    assert errors == [], f"{method} {path} {status} does not match the document"


def django_routes() -> dict[str, Callable[..., Any]]:
    """Every URL pattern under /router/v1/, in OpenAPI path form, with its view."""
    routes: dict[str, Callable[..., Any]] = {}

    def walk(patterns: list[Any], prefix: str) -> None:
        for pattern in patterns:
            route = prefix + str(pattern.pattern)
            if isinstance(pattern, URLResolver):
                walk(pattern.url_patterns, route)
            elif isinstance(pattern, URLPattern) and route.startswith("router/v1/"):
                routes["/" + re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", route)] = pattern.callback

    walk(get_resolver().url_patterns, "")
    return routes


def described(doc: dict[str, Any], path: str) -> set[str]:
    return {m.upper() for m in doc["paths"][path] if m in OPENAPI_METHODS}


async def client_call(node: Node, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    """One request to the proxy's client API, in process."""

    async def no_fallback(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError(f"{path} fell through to Django")

    app = ProxyApp(no_fallback, node_getter=lambda: node)
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": [(b"content-type", b"application/json")],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 18998),
    }
    comm = ApplicationCommunicator(app, scope)
    data = b"" if body is None else orjson.dumps(body)
    await comm.send_input({"type": "http.request", "body": data, "more_body": False})
    start = await comm.receive_output(MESSAGE_TIMEOUT_SECS)
    chunks: list[bytes] = []
    while True:
        message = await comm.receive_output(MESSAGE_TIMEOUT_SECS)
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    await comm.wait(MESSAGE_TIMEOUT_SECS)
    return start["status"], orjson.loads(b"".join(chunks))


# -- the document ----------------------------------------------------------------------------


def test_the_document_is_valid_openapi_3_1() -> None:
    doc = openapi_document()
    assert doc["openapi"].startswith("3.1.")
    validate(doc, cls=OpenAPIV31SpecValidator)


def test_the_document_carries_the_build_version_and_both_key_schemes() -> None:
    doc = openapi_document()
    assert doc["info"]["version"] == settings.ROUTER_VERSION
    schemes = doc["components"]["securitySchemes"]
    assert {name: (s["type"], s["scheme"]) for name, s in schemes.items()} == {
        "adminKey": ("http", "bearer"),
        "inferenceKey": ("http", "bearer"),
    }


def test_the_error_envelope_is_the_one_the_router_sends() -> None:
    error = openapi_document()["components"]["schemas"]["Error"]
    inner = error["properties"]["error"]
    assert error["required"] == ["error"]
    assert set(inner["properties"]) == {"message", "type", "param", "code"}
    assert set(inner["required"]) == {"message", "type"}


def test_the_schema_route_serves_the_document_without_an_admin_key(
    client: EdgeClient, admin_keys: None
) -> None:
    response = client.get(SCHEMA_URL)
    assert response.status_code == 200
    assert response["Content-Type"] == OPENAPI_CONTENT_TYPE
    assert response.content == openapi_bytes()
    assert orjson.loads(response.content) == openapi_document()


def test_the_schema_route_refuses_other_methods_like_every_management_route(
    client: EdgeClient,
) -> None:
    response = client.post(SCHEMA_URL, b"{}", content_type="application/json")
    assert response.status_code == 404
    assert response.json()["error"]["type"] == "not_found"


def test_swagger_ui_is_served_behind_the_admin_key_with_assets_from_this_node(
    client: EdgeClient, admin_keys: None
) -> None:
    assert client.get(DOCS_URL).status_code == 401
    page = client.generic("GET", DOCS_URL, headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    assert page.status_code == 200
    assert page["Content-Type"].startswith("text/html")
    html = page.content.decode()
    assert SCHEMA_URL in html
    assets = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert f"{SIDECAR_STATIC}swagger-ui-bundle.js" in assets
    # Every script and style comes from this node: no CDN.
    assert all(url.startswith("/static/") for url in assets), assets
    bundle = client.get(f"{SIDECAR_STATIC}swagger-ui-bundle.js")
    assert bundle.status_code == 200
    assert "javascript" in bundle["Content-Type"]
    assert b"SwaggerUIBundle" in bundle.content


async def test_the_admin_key_is_checked_before_the_body_is_read(admin_keys: None) -> None:
    async def django(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError("a request without the admin key reached Django")

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/router/v1/load",
        "query_string": b"",
        "headers": [(b"content-length", b"400000000")],
    }
    comm = ApplicationCommunicator(ProxyApp(django), scope)
    # No body is ever sent: the answer must come without waiting for one.
    start = await comm.receive_output(MESSAGE_TIMEOUT_SECS)
    body = await comm.receive_output(MESSAGE_TIMEOUT_SECS)
    assert start["status"] == 401
    assert orjson.loads(body["body"])["error"]["type"] == "unauthorized"


# -- no drift from the code ------------------------------------------------------------------


def test_every_management_route_is_described_and_every_described_one_exists() -> None:
    doc = openapi_document()
    routes = set(django_routes())
    documented = {p for p in doc["paths"] if p.startswith("/router/v1/")}
    assert sorted(routes - documented) == [], "routes missing from the document"
    assert sorted(documented - routes) == [], "documented paths with no route"


def test_every_described_management_path_resolves() -> None:
    for path in openapi_document()["paths"]:
        if path.startswith("/router/v1/"):
            resolve(re.sub(r"\{\w+\}", "sample", path))


def test_every_management_route_is_described_with_exactly_the_methods_it_serves(
    client: EdgeClient, admin_keys: None
) -> None:
    # With admin keys set and none sent, a route answers a method it serves with 401 (or 200
    # for the public schema) and one it does not serve with 404 (405 from a view that says
    # so), before any view body runs: probing changes nothing.
    doc = openapi_document()
    for path in django_routes():
        served = set()
        for method in PROBE_METHODS:
            status = client.generic(method, path).status_code
            if status not in (404, 405):
                served.add(method)
                expected = 200 if path == SCHEMA_URL else 401
                assert status == expected, f"{method} {path} answered {status} without a key"
        assert path in doc["paths"], f"{path} is not described"
        assert described(doc, path) == served, path


def test_admin_routes_require_the_admin_key_and_the_public_ones_do_not() -> None:
    doc = openapi_document()
    for path, item in doc["paths"].items():
        for method, op in item.items():
            public = path in (SCHEMA_URL, *PUBLIC_PATHS)
            expected: list[dict[str, list[str]]] = [] if public else [{"adminKey": []}]
            if not path.startswith(("/router/v1/", "/metrics")) and not public:
                expected = [{"inferenceKey": []}]
            assert op["security"] == expected, f"{method} {path}"


def test_client_paths_match_the_proxy_route_table() -> None:
    doc = openapi_document()
    client_paths = {p for p in doc["paths"] if not p.startswith("/router/v1/")}
    # Every path the proxy serves is described, and the contract's list is among them.
    assert client_paths == set(ROUTES)
    assert set(CLIENT_PATHS) <= client_paths
    for path in client_paths:
        methods, _, needs_key = ROUTES[path]
        # HEAD rides along with GET on the proxy; the document lists the GET.
        assert described(doc, path) == set(methods) - {"HEAD"}, path
        for op in doc["paths"][path].values():
            # /metrics checks the admin key itself; the route table's flag is the inference key.
            assert bool(op["security"]) == (needs_key or path == "/metrics"), path


def test_the_node_protocol_is_not_described() -> None:
    assert [p for p in openapi_document()["paths"] if p.startswith("/router/v1/node/")] == []


# -- real answers match the document ---------------------------------------------------------


def test_settings_answers_match(client: EdgeClient) -> None:
    url = "/router/v1/site/offload/settings"
    response = client.get(url)
    assert response.status_code == 200
    assert_matches(url, "GET", 200, response.json())
    changed = client.post(
        url, orjson.dumps({"values": {"scheduling_backend_depth": 4}}), "application/json"
    )
    assert changed.status_code == 200
    assert_matches(url, "POST", 200, changed.json())
    refused = client.post(url, orjson.dumps({"values": {"nope": 1}}), "application/json")
    assert refused.status_code == 400
    assert_matches(url, "POST", 400, refused.json())


def test_model_records_and_version_match(client: EdgeClient, node: Node) -> None:
    response = client.get("/router/v1/models")
    assert response.status_code == 200
    records = response.json()["models"]
    assert {r["local_id"] for r in records} == {"chat", "seer", "picture"}
    assert any("image_id" in r for r in records)
    assert_matches("/router/v1/models", "GET", 200, response.json())
    version = client.get("/router/v1/version")
    assert_matches("/router/v1/version", "GET", 200, version.json())


def test_a_bad_link_body_is_a_400_that_matches(client: EdgeClient, node: Node) -> None:
    url = "/router/v1/site/routing-groups"
    response = client.post(url, orjson.dumps({"anchor": {"node_id": NODE_ID}}), "application/json")
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "anchor.model_id"
    assert_matches(url, "POST", 400, response.json())


def test_link_listings_match(client: EdgeClient, node: Node) -> None:
    url = "/router/v1/site/text-routing-groups"
    everything = client.get(url)
    assert everything.json() == {"links": []}
    assert_matches(url, "GET", 200, everything.json())
    anchor = client.get(url, {"node_id": NODE_ID, "model_id": "chat"})
    assert anchor.status_code == 200
    assert anchor.json()["anchor"] == {"node_id": NODE_ID, "model_id": "chat"}
    assert_matches(url, "GET", 200, anchor.json())
    deleted = client.delete(f"{url}?node_id={NODE_ID}&model_id=chat")
    assert deleted.json() == {"deleted": 0}
    assert_matches(url, "DELETE", 200, deleted.json())


def test_decision_and_analytics_rows_match(client: EdgeClient, node: Node) -> None:
    OffloadDecisionFactory(
        recorded_at=1_700_000_000_000,
        node_id=NODE_ID,
        kind="plan",
        lane="text",
        owner_node_id=NODE_ID,
        owner_model_id="chat",
        outcome="lent",
        keep_ms=12.5,
        slots=2,
        router_version=settings.ROUTER_VERSION,
    )
    now = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    RequestRecordFactory(
        node_id=NODE_ID,
        model_id="chat",
        lane="text",
        path="/v1/chat/completions",
        status=200,
        success=True,
        prompt_tokens=3,
        duration_ms=4.5,
        started_at=now,
        finished_at=now,
    )
    decisions = client.get("/router/v1/site/offload/decisions", {"lane": "text"})
    assert [r["outcome"] for r in decisions.json()["records"]] == ["lent"]
    assert_matches("/router/v1/site/offload/decisions", "GET", 200, decisions.json())
    analytics = client.get("/router/v1/site/analytics", {"kind": "requests"})
    assert [r["model_id"] for r in analytics.json()["records"]] == ["chat"]
    assert_matches("/router/v1/site/analytics", "GET", 200, analytics.json())
    refused = client.get("/router/v1/site/analytics", {"limit": "0"})
    assert refused.status_code == 400
    assert_matches("/router/v1/site/analytics", "GET", 400, refused.json())


def test_usage_answers_match(client: EdgeClient, node: Node) -> None:
    now = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    RequestRecordFactory(
        node_id=NODE_ID, model_id="chat", key_name="alice", started_at=now, finished_at=now
    )
    url = "/router/v1/site/usage"
    query = {"since_ms": "0", "group_by": "key,model,node,day"}
    usage = client.get(url, query)
    assert usage.json()["rows"][0]["key_name"] == "alice"
    assert_matches(url, "GET", 200, usage.json())
    refused = client.get(url, {"group_by": "user"})
    assert (refused.status_code, refused.json()["error"]["param"]) == (400, "group_by")
    assert_matches(url, "GET", 400, refused.json())


def test_summary_and_node_state_match(client: EdgeClient, node: Node) -> None:
    summary = client.get("/router/v1/site/offload/summary")
    assert summary.json()["nodes"][0]["node_id"] == NODE_ID
    assert_matches("/router/v1/site/offload/summary", "GET", 200, summary.json())
    state = client.get("/router/v1/site/nodes/state")
    assert {b["id"] for b in state.json()["backends"]} >= {"text-runtime"}
    assert_matches("/router/v1/site/nodes/state", "GET", 200, state.json())
    unknown = client.get("/router/v1/site/nodes/state", {"node_id": "elsewhere"})
    assert unknown.status_code == 404
    assert_matches("/router/v1/site/nodes/state", "GET", 404, unknown.json())


def test_model_state_answers_match(client: EdgeClient, node: Node) -> None:
    url = "/router/v1/site/models/state"
    body = {"node_id": NODE_ID, "local_id": "chat", "enabled": False}
    disabled = client.post(url, orjson.dumps(body), "application/json")
    assert disabled.status_code == 200
    assert [m["disabled"] for m in disabled.json()["models"] if m["local_id"] == "chat"] == [True]
    assert_matches(url, "POST", 200, disabled.json())
    records = client.get("/router/v1/models")
    assert_matches("/router/v1/models", "GET", 200, records.json())
    unknown = client.post(url, orjson.dumps({**body, "local_id": "absent"}), "application/json")
    assert (unknown.status_code, unknown.json()["error"]["param"]) == (404, "local_id")
    assert_matches(url, "POST", 404, unknown.json())
    refused = client.post(url, orjson.dumps({**body, "enabled": "no"}), "application/json")
    assert (refused.status_code, refused.json()["error"]["param"]) == (400, "enabled")
    assert_matches(url, "POST", 400, refused.json())
    enabled = client.post(url, orjson.dumps({**body, "enabled": True}), "application/json")
    assert [m["disabled"] for m in enabled.json()["models"] if m["local_id"] == "chat"] == [False]


def test_inventory_answers_match(client: EdgeClient, node: Node, tmp_path: Path) -> None:
    url = "/router/v1/site/inventory"
    roots = tmp_path / "files"
    (roots / "sub").mkdir(parents=True)
    (roots / "sub" / "weights.gguf").write_bytes(b"w" * 8)
    models = node.config.models.model_copy(update={"file_roots": [roots, tmp_path / "absent"]})
    node.config = node.config.model_copy(update={"models": models})
    text = Component("text", NODE_ID, "chat", "", "chat.kcpps")
    image = Component("image", NODE_ID, "", "picture", "picture.kcpps")
    recipe = Recipe("combo", "combo", "combo-image", {"text": text, "image": image})
    node.recipes = {"combo": recipe, "combo-image": recipe}
    plain = client.get(url)
    assert plain.status_code == 200
    assert [n["files"] for n in plain.json()["nodes"]] == [None]
    assert [r["id"] for r in plain.json()["recipes"]] == ["combo"]
    assert_matches(url, "GET", 200, plain.json())
    listed = client.get(url, {"include_files": "true"})
    files = listed.json()["nodes"][0]["files"]
    assert [f["path"] for f in files["entries"]] == ["sub/weights.gguf"]
    assert [r["note"] for r in files["roots"]] == ["", "not listed: does not exist"]
    assert_matches(url, "GET", 200, listed.json())
    refused = client.get(url, {"include_files": "maybe"})
    assert (refused.status_code, refused.json()["error"]["param"]) == (400, "include_files")
    assert_matches(url, "GET", 400, refused.json())


async def test_runtime_unload_answers_match(node: Node) -> None:
    # Async and in process, so the load and the unload run on this test's loop, where the
    # backend process and its watcher live.
    url = "/router/v1/site/nodes/unload"
    client = AsyncClient()

    async def post(body: Any) -> Any:
        return await client.post(url, orjson.dumps(body), content_type="application/json")

    try:
        await services.model_load_local(node=node, model_id="chat")
        text = next(
            b for b in services.node_state(node=node)["backends"] if b["id"] == "text-runtime"
        )
        generation = text["loaded_models"][0]["generation"]
        loaded = await client.get("/router/v1/site/nodes/state")
        assert [m["model_id"] for b in loaded.json()["backends"] for m in b["loaded_models"]] == [
            "chat"
        ]
        assert_matches("/router/v1/site/nodes/state", "GET", 200, loaded.json())
        body = {"node_id": NODE_ID, "backend_id": "text-runtime", "runtime_id": "text"}
        stale = await post({**body, "expected_generation": generation + 1})
        assert (stale.status_code, stale.json()["error"]["code"]) == (409, "stale_generation")
        assert_matches(url, "POST", 409, stale.json())
        bad = await post({**body, "expected_generation": "1"})
        assert (bad.status_code, bad.json()["error"]["param"]) == (400, "expected_generation")
        assert_matches(url, "POST", 400, bad.json())
        unknown = await post({**body, "node_id": "elsewhere", "expected_generation": generation})
        assert unknown.status_code == 404
        assert_matches(url, "POST", 404, unknown.json())
        done = await post({**body, "expected_generation": generation})
        assert done.status_code == 200
        assert all(not b["loaded_models"] for b in done.json()["backends"])
        assert_matches(url, "POST", 200, done.json())
    finally:
        await node.runtimes.close()
        await close_session()


def test_guardian_answers_match(client: EdgeClient, node: Node) -> None:
    url = "/router/v1/site/guardians"
    current = client.get(url)
    assert current.status_code == 200
    assert_matches(url, "GET", 200, current.json())
    refused = client.post(url, orjson.dumps({"models": {"seer": "chat"}}), "application/json")
    assert refused.status_code == 400
    assert_matches(url, "POST", 400, refused.json())
    saved = client.post(url, orjson.dumps({"models": {"chat": "seer"}}), "application/json")
    assert saved.status_code == 200
    assert saved.json()["effective"] == {"chat": "seer"}
    assert_matches(url, "POST", 200, saved.json())
    cleared = client.delete(f"{url}?scope=model&key=chat")
    assert cleared.json()["models"] == {}
    assert_matches(url, "DELETE", 200, cleared.json())


def test_a_missing_admin_key_is_a_401_that_matches(client: EdgeClient, admin_keys: None) -> None:
    response = client.get("/router/v1/models")
    assert response.status_code == 401
    assert_matches("/router/v1/models", "GET", 401, response.json())


async def test_client_answers_match(node: Node) -> None:
    status, body = await client_call(node, "GET", "/v1/models")
    assert (status, [m["id"] for m in body["data"]]) == (200, ["chat", "seer"])
    assert_matches("/v1/models", "GET", 200, body)
    status, body = await client_call(node, "GET", "/api/tags")
    assert status == 200
    assert_matches("/api/tags", "GET", 200, body)
    status, body = await client_call(node, "GET", "/ping")
    assert status == 200
    assert_matches("/ping", "GET", 200, body)
    status, body = await client_call(node, "POST", "/api/show", {"model": "seer"})
    assert (status, body["capabilities"][:3]) == (200, ["completion", "tools", "vision"])
    assert_matches("/api/show", "POST", 200, body)
    status, body = await client_call(node, "GET", "/v1/models/seer")
    assert (status, body["id"]) == (200, "seer")
    assert_matches("/v1/models/{model}", "GET", 200, body)
    status, body = await client_call(node, "GET", "/v1/models/nope")
    assert status == 404
    assert_matches("/v1/models/{model}", "GET", 404, body)
    for path in ("/api/v1/model", "/api/extra/version"):
        status, body = await client_call(node, "GET", path)
        assert status == 200
        assert_matches(path, "GET", 200, body)
    status, body = await client_call(node, "GET", "/api/version")
    assert status == 200
    assert_matches("/api/version", "GET", 200, body)
    status, body = await client_call(node, "GET", "/sdapi/v1/sd-models")
    assert status == 200
    assert_matches("/sdapi/v1/sd-models", "GET", 200, body)


async def test_client_errors_match_both_envelopes(node: Node) -> None:
    status, body = await client_call(node, "POST", "/v1/chat/completions", {"messages": []})
    assert (status, body["error"]["param"]) == (400, "model")
    assert_matches("/v1/chat/completions", "POST", 400, body)
    status, body = await client_call(node, "POST", "/v1/completions", {"model": "absent"})
    assert (status, body["error"]["code"]) == (404, "model_not_found")
    assert_matches("/v1/completions", "POST", 404, body)
    status, body = await client_call(node, "POST", "/api/chat", {"messages": []})
    assert status == 400
    assert isinstance(body["error"], str)
    assert_matches("/api/chat", "POST", 400, body)


def test_closing_the_document_catches_an_undocumented_field() -> None:
    # The response checks above are only worth something if an extra field fails them.
    with pytest.raises(AssertionError, match="does not match"):
        assert_matches("/ping", "GET", 200, {"status": "healthy", "extra": 1})


def test_changing_one_copy_of_the_document_leaves_the_next_and_the_served_bytes_alone() -> None:
    served = openapi_bytes()
    first = openapi_document()
    first["paths"]["/v1/models"]["get"]["security"].append({"adminKey": []})
    first["paths"]["/router/v1/models"]["get"]["security"].clear()
    second = openapi_document()
    assert second["paths"]["/v1/models"]["get"]["security"] == [{"inferenceKey": []}]
    assert second["paths"]["/router/v1/models"]["get"]["security"] == [{"adminKey": []}]
    assert openapi_bytes() == served == orjson.dumps(second)
