"""A master and two slaves over HTTPS with mutual TLS on node routes, mid-way through a token
rollout: requests served and lent across nodes, node routes closed to a token without the
cluster's client certificate, a node of another CA refused, plain HTTP to a TLS port closed,
and a renewed certificate taken on SIGHUP while a stream on an old connection goes on."""

from __future__ import annotations

import contextlib
import json
import re
import signal
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trustme

from tests.harness import (
    Cluster,
    ModelSpec,
    sim_weights,
    start_cluster,
    start_node,
    text_model,
    wait_for,
)

pytestmark = pytest.mark.integration

OLD_TOKEN = "old-cluster-token-0123456789"
NEW_TOKEN = "new-cluster-token-0123456789"
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
# A model that takes /v1/realtime sessions (the sim echoes frames).
TALKER = ModelSpec(
    "talk",
    {"contextsize": 4096, "parallel": 1},
    {"model_param": sim_weights(base_ms=5), "ttsmodel": sim_weights(base_ms=5)},
)


class Pki:
    """The cluster's CA, and files for each node's server and client certificates."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.ca = trustme.CA()
        self.ca_file = root / "ca.pem"
        self.ca.cert_pem.write_to_path(str(self.ca_file))

    def issue(self, name: str, ca: trustme.CA | None = None) -> tuple[Path, Path]:
        leaf = (ca or self.ca).issue_cert("127.0.0.1", "localhost", f"{name}.nodes.test")
        cert, key = self.root / f"{name}-cert.pem", self.root / f"{name}-key.pem"
        leaf.cert_chain_pems[0].write_to_path(str(cert))
        leaf.private_key_pem.write_to_path(str(key))
        return cert, key

    def sections(self, name: str, ca: trustme.CA | None = None) -> dict[str, dict[str, Any]]:
        """A node's TLS keys: serve HTTPS, ask node routes for this CA's client certificate,
        trust only this CA for other nodes and show them a client certificate."""
        cert, key = self.issue(name, ca)
        return {
            "server": {
                "tls_cert_file": str(cert),
                "tls_key_file": str(key),
                "tls_client_ca_file": str(self.ca_file),
            },
            "cluster": {
                "tls_ca_file": str(self.ca_file),
                "tls_client_cert_file": str(cert),
                "tls_client_key_file": str(key),
            },
        }


def _merge(*parts: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for part in parts:
        for section, values in part.items():
            out.setdefault(section, {}).update(values)
    return out


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[Cluster]:
    """Owner o lends to helper h through the master. Mid-rollout: the master and h send the new
    token (the master still accepts the old one), o still sends the old one and already accepts
    the new one; h accepts only the new one, so the master must be sending it."""
    c = start_cluster(
        tmp_path_factory.mktemp("tlscluster"),
        [TALKER],
        {
            "o": [text_model("big", load_ms=50, base_ms=5, output_ms_per_token=40)],
            "h": [text_model("fast", load_ms=50, base_ms=5, output_ms_per_token=2)],
        },
        scheme="https",
        master_sections=_merge(
            pki.sections("master"),
            {
                "cluster": {
                    "token": NEW_TOKEN,
                    "previous_tokens": [OLD_TOKEN],
                    "offload_probe_idle": "100ms",
                    "offload_probe_helper_slots": 2,
                }
            },
        ),
        per_slave_sections={
            "o": _merge(
                pki.sections("o"),
                {"cluster": {"token": OLD_TOKEN, "previous_tokens": [NEW_TOKEN]}},
            ),
            "h": _merge(pki.sections("h"), {"cluster": {"token": NEW_TOKEN}}),
        },
    )
    try:
        with c.master.client() as client:
            link = {
                "anchor": {"node_id": "o", "model_id": "big"},
                "lends_to": [{"node_id": "h", "model_id": "fast"}],
                "acknowledge_different_weights": True,
            }
            assert client.post("/router/v1/site/text-routing-groups", json=link).status_code == 200
            assert client.post("/router/v1/load", json={"model": "fast"}).status_code == 200
        yield c
    finally:
        c.cleanup()


def _completed(c: Cluster, node: str) -> int:
    with c.master.client() as client:
        state = client.get("/router/v1/site/nodes/state", params={"node_id": node}).json()
    backend = next(b for b in state["backends"] if b["id"] == "text-runtime")
    # The sim backend is plain HTTP on loopback: only the router speaks TLS.
    return int(httpx.get(backend["base_url"] + "/sim/stats").json()["completed"])


def test_the_master_serves_every_slaves_model_over_https(cluster: Cluster) -> None:
    assert cluster.master.base_url.startswith("https://")
    with cluster.master.client() as client:
        models = {m["id"] for m in client.get("/v1/models").json()["data"]}
        assert {"big", "fast"} <= models
        resp = client.post("/v1/chat/completions", json={"model": "fast", **CHAT})
    assert resp.status_code == 200, resp.text
    assert resp.json()["model"] == "fast"


def test_held_requests_are_lent_to_the_helper_through_the_master_over_mtls(
    cluster: Cluster,
) -> None:
    before = _completed(cluster, "h")
    results: list[int] = []
    lock = threading.Lock()

    def call() -> None:
        with cluster.slaves["o"].client(timeout=120) as client:
            resp = client.post(
                "/v1/chat/completions", json={"model": "big", **CHAT, "max_tokens": 10}
            )
        with lock:
            results.append(resp.status_code)

    threads = [threading.Thread(target=call) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [200] * 8
    assert _completed(cluster, "h") > before


def test_node_routes_need_the_client_certificate_as_well_as_the_token(
    cluster: Cluster, pki: Pki
) -> None:
    no_cert = ssl.create_default_context(cafile=str(pki.ca_file))
    auth = {"Authorization": f"Bearer {NEW_TOKEN}"}
    with cluster.master.client(verify=no_cert) as client:
        # A stolen token alone opens nothing.
        refused = client.get("/router/v1/node/runtime-status", headers=auth)
        # Client paths take no client certificate.
        models = client.get("/v1/models")
    assert refused.status_code == 403, refused.text
    assert refused.json()["error"]["code"] == "client_certificate_required"
    assert models.status_code == 200


def test_during_a_token_rollout_the_old_and_new_tokens_open_node_routes(
    cluster: Cluster,
) -> None:
    # Every node registered and stays healthy although o sends the old token and h accepts
    # only the new one: the master accepts the old one and sends the new one.
    cluster.wait_healthy("o", "h")
    with cluster.master.client() as client:
        codes = {
            token: client.get(
                "/router/v1/node/runtime-status", headers={"Authorization": f"Bearer {token}"}
            ).status_code
            for token in (OLD_TOKEN, NEW_TOKEN, "not-a-cluster-token-0123")
        }
    assert codes == {OLD_TOKEN: 200, NEW_TOKEN: 200, "not-a-cluster-token-0123": 401}
    with cluster.slaves["h"].client() as client:
        old = client.get(
            "/router/v1/node/runtime-status", headers={"Authorization": f"Bearer {OLD_TOKEN}"}
        )
    assert old.status_code == 401


def test_a_client_certificate_of_another_ca_fails_the_handshake(cluster: Cluster, pki: Pki) -> None:
    cert, key = pki.issue("intruder", trustme.CA())
    context = ssl.create_default_context(cafile=str(pki.ca_file))
    context.load_cert_chain(str(cert), str(key))
    with (
        cluster.master.client(verify=context) as client,
        pytest.raises((httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError)),
    ):
        client.get(
            "/router/v1/node/runtime-status", headers={"Authorization": f"Bearer {NEW_TOKEN}"}
        )


def test_a_slave_with_a_certificate_of_another_ca_is_refused(
    cluster: Cluster, pki: Pki, tmp_path: Path
) -> None:
    stranger = trustme.CA()
    sections: dict[str, Any] = _merge(
        pki.sections("stranger", stranger),
        {
            "cluster": {
                "role": "slave",
                "node_id": "stranger",
                "token": NEW_TOKEN,
                "master_url": cluster.master.base_url,
                "public_url": "https://127.0.0.1:1",
                "sync_interval": "1s",
            }
        },
    )
    node = start_node(tmp_path, [text_model("sneaky")], wait=False, **sections)
    try:
        # The master's handshake turns its certificate down, registration after registration
        # (the server drops the handshake without an alert: the slave sees the connection end).
        wait_for(lambda: node.output().count("registration with the master failed") >= 2)
        with cluster.master.client() as client:
            models = {m["id"] for m in client.get("/v1/models").json()["data"]}
            nodes = client.get("/router/v1/site/nodes/state").json()["cluster"]["nodes"]
        assert "sneaky" not in models
        assert "stranger" not in {n["node_id"] for n in nodes}
    finally:
        node.cleanup()


def test_plain_http_to_the_tls_port_is_closed_without_a_hang_or_a_traceback(
    cluster: Cluster,
) -> None:
    node = cluster.slaves["h"]
    with socket.create_connection(("127.0.0.1", node.port), timeout=10) as sock:
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        received = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := sock.recv(4096):
                received += chunk
    assert b"HTTP/1.1 200" not in received
    with node.client() as client:
        assert client.get("/v1/models").status_code == 200
    assert "Traceback" not in node.output()


def _served_certificate(port: int, ca_file: Path) -> bytes:
    context = ssl.create_default_context(cafile=str(ca_file))
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return der


def test_a_renewed_certificate_is_served_after_sighup_while_an_old_stream_finishes(
    cluster: Cluster, pki: Pki
) -> None:
    node = cluster.slaves["o"]
    before = _served_certificate(node.port, pki.ca_file)
    lines: list[str] = []
    started = threading.Event()

    def stream() -> None:
        # About four seconds of tokens: the reload happens while it streams.
        body = {"model": "big", **CHAT, "max_tokens": 100, "stream": True}
        with (
            node.client(timeout=120) as client,
            client.stream("POST", "/v1/chat/completions", json=body) as resp,
        ):
            for line in resp.iter_lines():
                if line:
                    lines.append(line)
                    started.set()

    reader = threading.Thread(target=stream)
    reader.start()
    try:
        assert started.wait(30)
        # Renewed by the same CA and written in place, as a renewal tool does.
        config = _section(node, "server")
        renewed = pki.ca.issue_cert("127.0.0.1", "localhost", "o-renewed.nodes.test")
        renewed.cert_chain_pems[0].write_to_path(config["tls_cert_file"])
        renewed.private_key_pem.write_to_path(config["tls_key_file"])
        node.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: _served_certificate(node.port, pki.ca_file) != before, timeout=20)
        assert not lines or lines[-1] != "data: [DONE]", "the stream ended before the reload"
    finally:
        reader.join(60)
    assert lines[-1] == "data: [DONE]"
    assert node.proc.poll() is None
    assert "TLS certificate reloaded" in node.output()


def _section(node: Any, name: str) -> dict[str, Any]:
    import yaml

    config: dict[str, Any] = yaml.safe_load(node.config_path.read_text())
    return dict(config[name])


def test_the_time_of_a_refused_handshake_is_bounded(cluster: Cluster) -> None:
    # A TLS client that never finishes its handshake is closed by the head deadline like a
    # slow plain client (the front door sits under TLS).
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", cluster.master.port), timeout=30) as sock:
        sock.sendall(b"\x16\x03\x01")
        with contextlib.suppress(ConnectionResetError):
            while sock.recv(4096):
                pass
    assert time.monotonic() - started < 25


def test_the_dockerfile_healthcheck_asks_a_tls_node_over_https(cluster: Cluster) -> None:
    from tests.test_observability import run_healthcheck

    done = run_healthcheck(cluster.slaves["h"].config_path)
    assert done.returncode == 0, done.stderr
    assert "https://127.0.0.1:" in done.stdout


def test_a_realtime_session_runs_over_wss(cluster: Cluster, pki: Pki) -> None:
    from websockets.sync.client import connect

    context = ssl.create_default_context(cafile=str(pki.ca_file))
    url = cluster.master.base_url.replace("https://", "wss://") + "/v1/realtime?model=talk"
    with connect(url, ssl=context, open_timeout=30) as ws:
        ws.send("hello")
        frame = ws.recv(timeout=10)
    assert isinstance(frame, str)
    assert json.loads(frame) == {"model": "talk", "echo": "hello"}


def test_a_browser_form_over_https_passes_djangos_origin_check(cluster: Cluster) -> None:
    # Django compares the browser's Origin with the scheme the app was told: a request over
    # TLS taken for plain HTTP would fail every form post with 403.
    node = cluster.master
    with node.client() as client:
        page = client.get("/admin/login/")
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
        assert token is not None
        resp = client.post(
            "/admin/login/",
            data={"csrfmiddlewaretoken": token.group(1), "username": "x", "password": "y"},
            headers={"Origin": node.base_url, "Referer": node.base_url + "/admin/login/"},
        )
    assert resp.status_code == 200, resp.text[:300]
    assert "CSRF" not in resp.text
