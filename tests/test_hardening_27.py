"""Issue 27's holes, on a real node: client text that reaches the logs cannot forge or hide a
line, the Docker health check passes its own front door, and input validation and the front
door answer what they refuse."""

from __future__ import annotations

import http.server
import json
import logging
import logging.config
import os
import re
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.conf import settings

from proxy.edge.selfcheck import HEALTHCHECK_HEADER, healthcheck_credential
from routerproject.settings import SECRET_KEY_FILENAME, stored_secret_key
from tests.harness import (
    CLUSTER_TOKEN,
    REPO,
    Cluster,
    RouterNode,
    free_port,
    running_node,
    start_cluster,
    start_node,
    text_model,
    wait_for,
)
from tests.test_observability import healthcheck_argv

pytestmark = pytest.mark.integration

# A line a forger would like the operator to read as the node's own.
FORGED = "2026-01-01 00:00:00,000 INFO [-] router.access: GET /admin/ status=200"
HOSTILE = f"evil\n{FORGED}\r\x1b[2J\x00\u202egnp.exe"
READABLE = "modèle-日本語-чат"
CHAT = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RouterNode]:
    root = tmp_path_factory.mktemp("hardening27")
    with running_node(root, [text_model("chat", load_ms=5, base_ms=1)]) as n:
        yield n


def _lines_of(node: RouterNode, request_id: str) -> list[str]:
    return wait_for(
        lambda: [ln for ln in list(node.lines) if f"[{request_id}] router.access:" in ln]
    )


def _assert_clean(text: str) -> None:
    for raw in ("\n", "\r", "\x1b", "\x00", "\u202e"):
        assert raw not in text, repr(text)


# -- log injection (part 4) ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "rid"),
    [("/v1/chat/completions", "inject-openai"), ("/api/chat", "inject-ollama")],
)
def test_a_hostile_model_name_cannot_forge_or_hide_an_access_line(
    node: RouterNode, path: str, rid: str
) -> None:
    body = {"model": HOSTILE, "messages": [{"role": "user", "content": "hi"}], "stream": False}
    with node.client() as client:
        resp = client.post(path, json=body, headers={"X-Request-Id": rid})
    assert resp.status_code == 404, resp.text
    (line,) = _lines_of(node, rid)
    _assert_clean(line)
    # Escaped, not dropped: the operator still sees what the client sent.
    assert "model=evil\\n2026-01-01" in line
    assert "\\r\\x1b[2J\\x00\\u202egnp.exe" in line
    assert not [ln for ln in list(node.lines) if ln.startswith(FORGED)]


def test_a_hostile_path_is_escaped_in_the_refusal_warning(tmp_path: Path) -> None:
    # A refusal quotes the path it refused: a foreign Host is refused on a WebUI path. A node
    # of its own: refusals of one status are logged once per 10 s, and the shared node's other
    # tests are refused with 400 too.
    path = "/hostile-path%0a" + FORGED.replace(" ", "%20") + "%1b%00%e2%80%ae"
    with running_node(tmp_path, [text_model("chat")]) as node, node.client() as client:
        resp = client.get(path, headers={"Host": "evil.example"})
        assert resp.status_code == 400
        line = wait_for(
            lambda: next((ln for ln in list(node.lines) if "/hostile-path" in ln), None)
        )
        _assert_clean(line)
        assert "refused: 400" in line
        assert "/hostile-path\\n2026-01-01" in line
        assert not [ln for ln in list(node.lines) if ln.startswith(FORGED)]


def test_a_utf8_model_name_stays_readable_in_the_access_line(node: RouterNode) -> None:
    body = {"model": READABLE, "messages": [{"role": "user", "content": "hi"}]}
    with node.client() as client:
        client.post("/v1/chat/completions", json=body, headers={"X-Request-Id": "utf8-name"})
    (line,) = _lines_of(node, "utf8-name")
    assert f"model={READABLE} " in line


def _formatted(kind: str, message: str, *args: object, **extra: object) -> str:
    config: dict[str, Any] = settings.LOGGING
    formatter = logging.config.DictConfigurator(config).configure_formatter(
        dict(config["formatters"][kind])
    )
    record = logging.LogRecord("router.access", logging.INFO, __file__, 1, message, args, None)
    record.__dict__.update(extra)
    record.request_id = "rid"
    return str(formatter.format(record))


def test_the_json_format_escapes_client_text_and_keeps_utf8_readable() -> None:
    line = _formatted("json", "POST /v1 model=%s", HOSTILE + READABLE, model=HOSTILE + READABLE)
    _assert_clean(line)
    doc: dict[str, Any] = json.loads(line)
    escaped = "evil\\n" + FORGED + "\\r\\x1b[2J\\x00\\u202egnp.exe" + READABLE
    assert doc["model"] == escaped
    assert doc["message"] == "POST /v1 model=" + escaped
    # Readable as written, not as \\u escapes.
    assert READABLE in line


def test_the_text_format_escapes_every_control_and_bidi_character() -> None:
    hostile = "".join(chr(c) for c in (*range(0x20), 0x7F, 0x85, 0x9B, 0x2028, 0x2029, 0x202E))
    line = _formatted("text", "model=%s", hostile + READABLE)
    assert line.endswith(
        "model=\\x00\\x01\\x02\\x03\\x04\\x05\\x06\\x07\\x08\\t\\n\\x0b\\x0c\\r\\x0e\\x0f"
        "\\x10\\x11\\x12\\x13\\x14\\x15\\x16\\x17\\x18\\x19\\x1a\\x1b\\x1c\\x1d\\x1e\\x1f"
        "\\x7f\\x85\\x9b\\u2028\\u2029\\u202e" + READABLE
    )


# -- the Docker health check behind server.allowed_cidrs (part 5) ------------------------------


def run_healthcheck(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ROUTER_CONFIG": str(config)}
    env.pop("DATABASE_URL", None)
    return subprocess.run(
        [*healthcheck_argv(), *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )


def test_the_dockerfile_healthcheck_passes_when_allowed_cidrs_leave_out_loopback(
    tmp_path: Path,
) -> None:
    with running_node(
        tmp_path, [text_model("chat")], server={"allowed_cidrs": ["10.77.0.0/16"]}
    ) as n:
        ready = run_healthcheck(n.config_path)
        assert ready.returncode == 0, ready.stderr
        assert "/readyz: ok" in ready.stdout
        live = run_healthcheck(n.config_path, "--live")
        assert live.returncode == 0, live.stderr
        # Nothing else opens to a loopback caller the config refuses: not the health routes
        # without the node's own credential, not another route with it, not a forged one.
        own = healthcheck_credential(secret=stored_secret_key(n.store / SECRET_KEY_FILENAME))
        with n.client() as client:
            assert client.get("/readyz").status_code == 403
            forged = {HEALTHCHECK_HEADER.decode(): "0" * len(own)}
            assert client.get("/healthz", headers=forged).status_code == 403
            with_own = {HEALTHCHECK_HEADER.decode(): own}
            assert client.get("/healthz", headers=with_own).status_code == 200
            assert client.get("/v1/models", headers=with_own).status_code == 403
            assert client.get("/metrics", headers=with_own).status_code == 403


# -- input validation answers 400, never a traceback (part 6) ----------------------------------

HUGE = 2**64


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/api/v1/generate", {"prompt": "hi", "sampler_seed": HUGE}, "sampler_seed"),
        (
            "/api/generate",
            {"prompt": "hi", "stream": False, "options": {"seed": HUGE}},
            "options.seed",
        ),
        (
            "/api/chat",
            {"messages": [], "stream": False, "options": {"seed": HUGE + 12345}},
            "options.seed",
        ),
    ],
)
def test_a_seed_past_64_bits_is_a_400_naming_the_field(
    node: RouterNode, path: str, body: dict[str, Any], param: str
) -> None:
    with node.client() as client:
        resp = client.post(path, json={"model": "chat", **body})
    assert resp.status_code == 400, resp.text
    assert param in resp.text
    assert "Traceback" not in "\n".join(node.lines)


def test_the_largest_64_bit_seed_still_runs(node: RouterNode) -> None:
    body = {"model": "chat", "prompt": "hi", "stream": False, "options": {"seed": HUGE - 1}}
    with node.client() as client:
        assert client.post("/api/generate", json=body).status_code == 200


@pytest.mark.parametrize("suffix", ["bind", "substitute"])
@pytest.mark.parametrize("field", ["node_id", "node_url"])
def test_a_node_id_that_is_no_string_is_a_400_naming_it(
    node: RouterNode, suffix: str, field: str
) -> None:
    with node.client() as client:
        resp = client.post(
            f"/router/v1/site/model-assets/{suffix}", json={field: [None, None], "id": "chat"}
        )
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == field
    assert field in error["message"]


# -- what the front door answers (part 6) ------------------------------------------------------


def _raw(node: RouterNode, head: bytes) -> bytes:
    """The whole answer to one raw request head (the connection is closed after it)."""
    with socket.create_connection(("127.0.0.1", node.port), timeout=10) as sock:
        sock.sendall(head)
        chunks = []
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            chunks.append(chunk)
    return b"".join(chunks)


def test_a_front_door_refusal_answers_a_sanitized_request_id(node: RouterNode) -> None:
    hostile = 'abc" onload=x <b>' + "z" * 150
    with node.client() as client:
        refused = client.get(
            "/webui-page", headers={"Host": "evil.example", "X-Request-Id": hostile}
        )
        good = client.get("/webui-page", headers={"Host": "evil.example", "X-Request-Id": "ok-1"})
    assert refused.status_code == 400
    assert re.fullmatch("[0-9a-f]{32}", refused.headers["x-request-id"])
    assert good.headers["x-request-id"] == "ok-1"


def test_an_oversized_uri_is_a_414(node: RouterNode) -> None:
    answer = _raw(node, b"GET /v1/models?" + b"q" * 20000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 414 "), answer[:200]
    assert b'"code":"uri_too_long"' in answer.replace(b" ", b"")


@pytest.mark.parametrize(
    "headers",
    [
        b"X-Big: " + b"h" * 20000 + b"\r\n",
        b"".join(b"X-H%d: %s\r\n" % (i, b"v" * 100) for i in range(300)),
        b"".join(b"X-%d: v\r\n" % i for i in range(600)),
    ],
    ids=["one-long-header", "many-large-headers", "too-many-headers"],
)
def test_an_oversized_head_is_a_431(node: RouterNode, headers: bytes) -> None:
    answer = _raw(node, b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n")
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
    assert b'"code":"headers_too_large"' in answer.replace(b" ", b"")


# -- starting without a database (part 6) ------------------------------------------------------


def test_starting_with_the_database_down_exits_with_one_line_naming_it(tmp_path: Path) -> None:
    url = "postgresql://router@127.0.0.1:1/unreachable_db"
    node = start_node(tmp_path, [text_model("chat")], wait=False, extra_env={"DATABASE_URL": url})
    try:
        assert node.proc.wait(60) == 1
        assert node.ready.get(timeout=10) is False  # its output is over
        output = node.output()
        assert "Traceback" not in output
        (line,) = [ln for ln in node.lines if "unreachable_db" in ln]
        assert "database postgresql 127.0.0.1:1/unreachable_db" in line
        assert "Connection refused" in line
        assert len(line) < 400
    finally:
        node.cleanup()


# -- what a crash can lose of analytics (part 6) -----------------------------------------------


def test_an_answered_request_is_in_the_database_well_within_a_second(node: RouterNode) -> None:
    # A kill -9 loses the rows still buffered: they must be written soon after the answer,
    # not on a one-second tick (which left up to a second of answered requests unrecorded).
    waits = []
    with node.client() as client:
        for n in range(6):
            rid = f"analytics-window-{n}"
            resp = client.post("/v1/chat/completions", json=CHAT, headers={"X-Request-Id": rid})
            assert resp.status_code == 200
            answered = time.monotonic()
            wait_for(
                lambda rid=rid: node.query(
                    "SELECT count(*) FROM analytics_requests WHERE request_id = %s", (rid,)
                )[0][0],
                interval=0.01,
            )
            waits.append(time.monotonic() - answered)
    assert max(waits) < 0.4, waits


# -- a master under SIGTERM ends a forwarded stream with an error event (part 6) ---------------


def test_a_master_under_sigterm_ends_a_forwarded_stream_with_an_error_event(
    tmp_path: Path,
) -> None:
    slow = text_model("slow", load_ms=5, base_ms=1, output_ms_per_token=100)
    cluster = start_cluster(
        tmp_path,
        [],
        {"s1": [slow]},
        master_sections={"server": {"shutdown_grace": "1s"}},
    )
    try:
        body = {
            "model": "slow",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 400,
            "stream": True,
        }
        received = []
        with (
            cluster.master.client() as client,
            client.stream("POST", "/v1/chat/completions", json=body) as resp,
        ):
            assert resp.status_code == 200
            for chunk in resp.iter_text():
                received.append(chunk)
                if len(received) == 1:
                    cluster.master.proc.send_signal(signal.SIGTERM)
        text = "".join(received)
        assert "data: [DONE]" not in text
        last = [ln for ln in text.split("\n") if ln.startswith("data: ")][-1]
        error = json.loads(last.removeprefix("data: "))["error"]
        assert error["message"].startswith("the router is shutting down"), error
        assert error["code"] == "shutting_down"
        assert cluster.master.proc.wait(30) == 0
    finally:
        cluster.cleanup()


# -- a slave's redirect on inference (part 6) --------------------------------------------------


class _RedirectingRelay(http.server.BaseHTTPRequestHandler):
    """In front of a slave: passes the node protocol through, answers inference with 307."""

    target = ""

    def _handle(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length) if length else b""
        if self.path.startswith("/router/v1/node/inference/"):
            self.send_response(307)
            self.send_header("Location", self.target + self.path)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        skip = {"host", "content-length", "connection", "transfer-encoding"}
        headers = {k: v for k, v in self.headers.items() if k.lower() not in skip}
        resp = httpx.request(
            self.command, self.target + self.path, headers=headers, content=body, timeout=30
        )
        self.send_response(resp.status_code)
        for name, value in resp.headers.items():
            if name.lower() not in skip | {"content-encoding"}:
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(resp.content)))
        self.end_headers()
        self.wfile.write(resp.content)

    do_GET = do_POST = do_PUT = do_DELETE = _handle

    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_a_slaves_inference_redirect_is_a_502_saying_so_not_a_bare_307(tmp_path: Path) -> None:
    master_port, slave_port, relay_port = free_port(), free_port(), free_port()
    relay_url = f"http://127.0.0.1:{relay_port}"
    handler = type("Relay", (_RedirectingRelay,), {"target": f"http://127.0.0.1:{slave_port}"})
    relay = http.server.ThreadingHTTPServer(("127.0.0.1", relay_port), handler)
    threading.Thread(target=relay.serve_forever, daemon=True).start()
    master_url = f"http://127.0.0.1:{master_port}"
    common = {"token": CLUSTER_TOKEN, "sync_interval": "1s"}
    master = start_node(
        tmp_path / "master",
        [],
        port=master_port,
        cluster={
            **common,
            "role": "master",
            "node_id": "master",
            "public_url": master_url,
            "slave_urls": [relay_url],
            "health_interval": "1s",
        },
    )
    slave = start_node(
        tmp_path / "s1",
        [text_model("far")],
        port=slave_port,
        cluster={
            **common,
            "role": "slave",
            "node_id": "s1",
            "public_url": relay_url,
            "master_url": master_url,
        },
    )
    cluster = Cluster(master, {"s1": slave}, tmp_path)
    try:
        cluster.wait_healthy("s1")
        with master.client() as client:
            resp = client.post("/v1/chat/completions", json={**CHAT, "model": "far"})
        assert resp.status_code == 502, resp.text
        error = resp.json()["error"]
        assert error["code"] == "node_redirected"
        assert "307" in error["message"] and "s1" in error["message"]
        # Where it pointed is for the operator, in the log, not for the client.
        assert str(slave_port) not in resp.text
        assert wait_for(lambda: [ln for ln in master.lines if f":{slave_port}/" in ln])
    finally:
        cluster.cleanup()
        relay.shutdown()
        relay.server_close()
