"""The front door on real nodes and raw sockets: bodies refused before they are read, the
address allow-list, slow clients, the connection cap and the open-file limit."""

from __future__ import annotations

import contextlib
import resource
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from tests.harness import (
    CLUSTER_TOKEN,
    ModelSpec,
    RouterNode,
    free_port,
    start_node,
    text_model,
    wait_for,
)

pytestmark = pytest.mark.integration

KEY = "frontdoor-inference-key"
ADMIN = "frontdoor-admin-key"
LIMIT = 1 << 20
HUGE = 400_000_000
ANSWER_SECS = 10.0


def _models() -> list[ModelSpec]:
    return [text_model("alpha")]


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RouterNode]:
    node = start_node(
        tmp_path_factory.mktemp("keyed"),
        _models(),
        server={"max_body_bytes": LIMIT},
        auth={"inference_keys": [KEY], "admin_keys": [ADMIN]},
    )
    try:
        yield node
    finally:
        node.cleanup()


def _connect(port: int, host: str = "127.0.0.1") -> socket.socket:
    sock = socket.create_connection((host, port), timeout=ANSWER_SECS)
    return sock


def _head(method: str, path: str, *headers: str, host: str = "127.0.0.1") -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _read_answer(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """Read one answer (the node closes the connection after a refusal)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return status, headers, body


def _refused_at_head(port: int, method: str, path: str, *headers: str) -> tuple[int, Any]:
    """Send only a head announcing a 400 MB body and read the answer without sending it."""
    with _connect(port) as sock:
        sock.sendall(_head(method, path, *headers, f"Content-Length: {HUGE}"))
        status, _, body = _read_answer(sock)
    return status, orjson.loads(body)


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("/v1/chat/completions", "a valid inference key is required"),
        ("/api/chat", "a valid inference key is required"),
        ("/router/v1/load", "a valid admin key is required"),
        ("/router/v1/node/inference/v1/chat/completions", "cluster token is required"),
    ],
)
def test_a_keyless_upload_is_refused_before_its_body(
    keyed: RouterNode, path: str, message: str
) -> None:
    status, body = _refused_at_head(keyed.port, "POST", path, "Content-Type: application/json")
    assert status == 401
    text = body["error"] if path.startswith("/api/") else body["error"]["message"]
    assert text == message


def test_an_oversized_declared_body_gets_413_before_it_is_sent(keyed: RouterNode) -> None:
    for path, auth in (
        ("/v1/chat/completions", f"Authorization: Bearer {KEY}"),
        ("/router/v1/load", f"Authorization: Bearer {ADMIN}"),
        ("/admin/login/", "X-Nothing: 1"),
    ):
        status, body = _refused_at_head(
            keyed.port, "POST", path, auth, "Content-Type: application/json"
        )
        assert status == 413, path
        assert body["error"]["code"] == "body_too_large"
        assert str(LIMIT) in body["error"]["message"]


def test_a_body_declared_at_the_limit_is_still_read(keyed: RouterNode) -> None:
    payload = b'{"model": "alpha", "messages": [], "pad": "' + b"x" * (LIMIT - 100)
    payload += b'"}'.ljust(LIMIT - len(payload), b" ")
    assert len(payload) == LIMIT
    with keyed.client() as client:
        answer = client.post(
            "/v1/chat/completions",
            content=payload,
            headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"},
        )
    assert answer.status_code != 413, answer.text


def test_a_chunked_body_is_cut_once_past_the_limit(keyed: RouterNode) -> None:
    block = b"x" * 65536
    frame = b"%x\r\n" % len(block) + block + b"\r\n"
    with _connect(keyed.port) as sock:
        sock.sendall(
            _head(
                "POST",
                "/v1/chat/completions",
                f"Authorization: Bearer {KEY}",
                "Transfer-Encoding: chunked",
            )
        )
        sent = 0
        # One block past the limit: the node must answer then, not wait for the end.
        while sent <= LIMIT:
            sock.sendall(frame)
            sent += len(block)
        status, _, body = _read_answer(sock)
    assert status == 413
    assert orjson.loads(body)["error"]["code"] == "body_too_large"


def test_a_keyless_chunked_upload_is_refused_at_its_head(keyed: RouterNode) -> None:
    with _connect(keyed.port) as sock:
        sock.sendall(_head("POST", "/v1/chat/completions", "Transfer-Encoding: chunked"))
        status, _, _ = _read_answer(sock)
    assert status == 401


def test_the_node_answers_normally_after_refusals(keyed: RouterNode) -> None:
    _refused_at_head(keyed.port, "POST", "/v1/chat/completions")
    with keyed.client() as client:
        answer = client.post(
            "/v1/chat/completions",
            json={"model": "alpha", "messages": [{"role": "user", "content": "hi"}]},
            headers={"Authorization": f"Bearer {KEY}"},
        )
    assert answer.status_code == 200, answer.text


def test_refusals_are_logged_at_most_once_per_interval(tmp_path: Path) -> None:
    node = start_node(tmp_path, _models(), server={"allowed_cidrs": ["10.0.0.0/8"]})
    try:
        for _ in range(15):
            _refused_at_head(node.port, "POST", "/v1/embeddings")
        wait_for(lambda: any("refused: 403" in line for line in node.lines))
        # All fifteen were refused (above); the log holds one line for them, not fifteen.
        logged = [line for line in node.lines if "refused: 403" in line]
        assert len(logged) == 1, logged
    finally:
        node.cleanup()


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_refusals_are_counted_in_the_metrics(keyed: RouterNode) -> None:
    name = 'router_frontdoor_refusals_total{reason="body_too_large",status="413"}'
    with keyed.client(headers={"Authorization": f"Bearer {ADMIN}"}) as client:
        before = _metric(client.get("/metrics").text, name)
        for _ in range(3):
            _refused_at_head(keyed.port, "POST", "/v1/embeddings", f"Authorization: Bearer {KEY}")
        scraped = client.get("/metrics").text
    assert _metric(scraped, name) == before + 3
    assert _metric(scraped, "router_database_available") == 1.0


# -- server.allowed_cidrs and server.trusted_proxies --------------------------------------------


def _status(node: RouterNode, method: str, path: str, **kwargs: object) -> int:
    with node.client() as client:
        return client.request(method, path, **kwargs).status_code  # type: ignore[arg-type]


def test_an_address_outside_allowed_cidrs_gets_403_on_every_path(tmp_path: Path) -> None:
    node = start_node(
        tmp_path,
        _models(),
        server={"allowed_cidrs": ["10.0.0.0/8", "fd00::/8"]},
        cluster={"role": "master", "token": CLUSTER_TOKEN},
    )
    try:
        for method, path in (
            ("GET", "/v1/models"),
            ("POST", "/v1/chat/completions"),
            ("GET", "/router/v1/site/nodes/state"),
            ("GET", "/router/v1/node/state"),
            ("GET", "/admin/login/"),
            ("GET", "/ui/nodes"),
        ):
            with node.client() as client:
                answer = client.request(method, path)
            assert answer.status_code == 403, path
            assert answer.json()["error"]["code"] == "address_not_allowed"
        # Refused at the head, before a declared 400 MB body.
        status, _ = _refused_at_head(node.port, "POST", "/v1/chat/completions")
        assert status == 403
    finally:
        node.cleanup()


def test_trusted_proxies_name_the_client_with_x_forwarded_for(tmp_path: Path) -> None:
    node = start_node(
        tmp_path,
        _models(),
        server={"allowed_cidrs": ["10.1.2.0/24"], "trusted_proxies": ["127.0.0.1/32"]},
    )
    try:
        assert _status(node, "GET", "/v1/models", headers={"X-Forwarded-For": "10.1.2.3"}) == 200
        # Only the hop the trusted proxy vouches for counts: what the client wrote before it
        # does not.
        spoofed = {"X-Forwarded-For": "10.1.2.3, 192.168.7.7"}
        assert _status(node, "GET", "/v1/models", headers=spoofed) == 403
        assert _status(node, "GET", "/v1/models") == 403
    finally:
        node.cleanup()


def test_x_forwarded_for_is_ignored_without_trusted_proxies(tmp_path: Path) -> None:
    node = start_node(tmp_path, _models(), server={"allowed_cidrs": ["10.1.2.0/24"]})
    try:
        assert _status(node, "GET", "/v1/models", headers={"X-Forwarded-For": "10.1.2.3"}) == 403
    finally:
        node.cleanup()


def _ipv6_loopback() -> bool:
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6) as sock:
            sock.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback on this machine")
def test_allowed_cidrs_apply_to_ipv6_clients(tmp_path: Path) -> None:
    port = free_port()
    node = start_node(
        tmp_path / "v4only",
        _models(),
        server={"bind": f"[::1]:{port}", "allowed_cidrs": ["127.0.0.0/8"]},
        port=port,
    )
    try:
        with httpx.Client(timeout=ANSWER_SECS) as client:
            assert client.get(f"http://[::1]:{port}/v1/models").status_code == 403
    finally:
        node.cleanup()
    port = free_port()
    node = start_node(
        tmp_path / "v6",
        _models(),
        server={"bind": f"[::1]:{port}", "allowed_cidrs": ["::1/128"]},
        port=port,
    )
    try:
        with httpx.Client(timeout=ANSWER_SECS) as client:
            assert client.get(f"http://[::1]:{port}/v1/models").status_code == 200
    finally:
        node.cleanup()


# -- slow clients ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def strict(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RouterNode]:
    node = start_node(
        tmp_path_factory.mktemp("strict"),
        _models(),
        server={
            "header_timeout": "1s",
            "body_timeout": "1s",
            "body_min_rate": 1000,
        },
    )
    try:
        yield node
    finally:
        node.cleanup()


def _trickle_until_closed(sock: socket.socket, data: bytes, every: float) -> bytes:
    """Send one byte of `data` per `every` seconds until the node answers or closes."""
    sock.settimeout(every)
    for index in range(len(data)):
        try:
            sock.sendall(data[index : index + 1])
            answer = sock.recv(65536)
        except TimeoutError:
            continue
        except OSError:
            return b""
        return answer
    return b"never closed"


def test_a_trickled_head_is_answered_408_and_closed(strict: RouterNode) -> None:
    with _connect(strict.port) as sock:
        started = time.monotonic()
        answer = _trickle_until_closed(
            sock, _head("GET", "/v1/models", "X-Pad: " + "p" * 200), every=0.2
        )
        elapsed = time.monotonic() - started
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:80]
    # The deadline is one second; the trickle would have taken 45.
    assert elapsed < 20


def test_a_trickled_body_is_answered_408_and_closed(strict: RouterNode) -> None:
    with _connect(strict.port) as sock:
        sock.sendall(
            _head("POST", "/v1/chat/completions", "Content-Length: 100000", "Content-Type: a/b")
        )
        answer = _trickle_until_closed(sock, b"x" * 500, every=0.1)
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:80]
    assert b"request body not received" in answer


def test_a_silent_connection_is_closed_after_the_head_timeout(strict: RouterNode) -> None:
    with _connect(strict.port) as sock:
        sock.settimeout(ANSWER_SECS)
        answer = sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 408 ")


def test_one_address_cannot_hold_more_than_its_connection_cap(tmp_path: Path) -> None:
    # A head timeout far longer than the test, so the held connections stay open.
    capped = start_node(
        tmp_path, _models(), server={"header_timeout": "5m", "max_connections_per_client": 8}
    )
    try:
        _hold_past_the_cap(capped)
    finally:
        capped.cleanup()


def _hold_past_the_cap(strict: RouterNode) -> None:
    with contextlib.ExitStack() as stack:
        held = [stack.enter_context(_connect(strict.port)) for _ in range(8)]
        with _connect(strict.port) as extra:
            extra.settimeout(ANSWER_SECS)
            answer = extra.recv(65536)
        assert answer.startswith(b"HTTP/1.1 429 "), answer[:80]
        assert b"too_many_connections" in answer
        held[0].close()

        # The node frees the place when it sees the close; poll until a request gets through.
        def served() -> bool:
            try:
                with httpx.Client(base_url=strict.base_url, timeout=ANSWER_SECS) as client:
                    return client.get("/ping").status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(served, timeout=ANSWER_SECS)


def test_the_open_file_limit_is_raised_to_the_hard_limit(tmp_path: Path) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard <= 256:
        pytest.skip("hard limit too low to lower the soft limit under it")
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
    try:
        node = start_node(tmp_path, _models())
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    try:
        limits = Path(f"/proc/{node.proc.pid}/limits").read_text()
        line = next(row for row in limits.splitlines() if row.startswith("Max open files"))
        node_soft, node_hard = line.split()[3:5]
        assert node_soft == node_hard
        assert int(node_soft) > 256
    finally:
        node.cleanup()


# -- browsers: hosts, content types, origins ----------------------------------------------------


@pytest.fixture(scope="module")
def keyless(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RouterNode]:
    node = start_node(tmp_path_factory.mktemp("keyless"), _models())
    try:
        yield node
    finally:
        node.cleanup()


def _listed(node: RouterNode) -> set[str]:
    with node.client() as client:
        return {model["id"] for model in client.get("/v1/models").json()["data"]}


def test_a_cross_site_text_plain_post_changes_nothing(keyless: RouterNode) -> None:
    disable = b'{"node_id": "node-a", "local_id": "alpha", "enabled": false}'
    own = f"http://127.0.0.1:{keyless.port}"
    with keyless.client() as client:
        plain = client.post(
            "/router/v1/site/models/state",
            content=disable,
            headers={"Content-Type": "text/plain", "Origin": "http://evil.example"},
        )
        assert plain.status_code == 415
        assert plain.json()["error"]["param"] == "Content-Type"
        assert "alpha" in _listed(keyless)
        cross = client.post(
            "/router/v1/site/models/state",
            content=disable,
            headers={"Content-Type": "application/json", "Origin": "http://evil.example"},
        )
        assert cross.status_code == 403
        assert cross.json()["error"]["code"] == "cross_origin"
        assert "alpha" in _listed(keyless)
        # The node's own page may write, and so may a client that is no browser.
        same = client.post(
            "/router/v1/site/models/state",
            content=disable,
            headers={"Content-Type": "application/json", "Origin": own},
        )
        assert same.status_code == 200, same.text
        assert "alpha" not in _listed(keyless)
        enable = client.post(
            "/router/v1/site/models/state",
            json={"node_id": "node-a", "local_id": "alpha", "enabled": True},
        )
        assert enable.status_code == 200, enable.text
    assert "alpha" in _listed(keyless)


def test_a_foreign_host_reaches_no_browser_page(keyless: RouterNode) -> None:
    rebound = {"Host": f"attacker.example:{keyless.port}"}
    with keyless.client() as client:
        for path in ("/router/v1/models", "/ui/nodes", "/admin/login/", "/"):
            answer = client.get(path, headers=rebound)
            assert answer.status_code == 400, path
            assert answer.json()["error"]["code"] == "host_not_allowed"
        # Inference and node routes are not for browsers: the Host rule leaves them alone.
        assert client.get("/v1/models", headers=rebound).status_code == 200
        assert client.get("/router/v1/models", headers={"Host": "localhost"}).status_code == 200
