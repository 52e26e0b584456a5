"""Hub origins of portable configs, against a small hub served by the test on 127.0.0.1.

The router reaches the hub through huggingface_hub with HF_ENDPOINT pointing here: the model
info of a repository at a commit (with each file's LFS hash) and the file downloads.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.harness import ModelSpec, RouterNode, start_node

pytestmark = pytest.mark.integration

SITE = "/router/v1/site/model-assets"
REPO = "acme/tiny-models"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def weights(size: int, fill: bytes = b" ") -> bytes:
    text = json.dumps({"load_ms": 20, "base_ms": 5, "output_ms_per_token": 1}).encode()
    return text + fill * (size - len(text))


class Hub:
    """Serves REPO at COMMIT: `files` maps a path to (bytes, the LFS hash the hub reports)."""

    def __init__(self, files: dict[str, tuple[bytes, str]]) -> None:
        self.files = files
        self.downloads: list[str] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, status: int, body: bytes, kind: str = "application/json") -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                info = f"/api/models/{REPO}/revision/"
                resolve = f"/{REPO}/resolve/{COMMIT}/"
                if path.startswith(info):
                    revision = path[len(info) :]
                    if revision not in (COMMIT, "main"):
                        self._send(404, b'{"error": "revision not found"}')
                        return
                    siblings = [
                        {
                            "rfilename": name,
                            "size": len(data),
                            "lfs": {"sha256": lfs, "size": len(data), "pointerSize": 134},
                        }
                        for name, (data, lfs) in hub.files.items()
                    ]
                    doc = {"id": REPO, "sha": COMMIT, "siblings": siblings}
                    self._send(200, json.dumps(doc).encode())
                elif path.startswith(resolve) and path[len(resolve) :] in hub.files:
                    hub.downloads.append(path[len(resolve) :])
                    data = hub.files[path[len(resolve) :]][0]
                    self._send(200, data, "application/octet-stream")
                else:
                    self._send(404, b'{"error": "not found"}')

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


GOOD = weights(300_000)
GOOD_SHA = hashlib.sha256(GOOD).hexdigest()
LIAR = weights(200_000)  # the hub claims another file's hash for it
OTHER = weights(100_000, b"\n")
OTHER_SHA = hashlib.sha256(OTHER).hexdigest()


def portable(sha: str, filename: str, hf: str | None = None) -> ModelSpec:
    kcpps: dict[str, Any] = {
        "contextsize": 4096,
        "model_param_hash": sha,
        "model_param_filename": filename,
    }
    if hf is not None:
        kcpps["model_param_hf"] = hf
    return ModelSpec(filename.split(".")[0], kcpps)


@pytest.fixture
def hub_and_node(tmp_path: Path) -> Iterator[tuple[Hub, RouterNode]]:
    hub = Hub(
        {
            "text/good.sim.json": (GOOD, GOOD_SHA),
            "text/liar.sim.json": (LIAR, OTHER_SHA),
            "text/other.sim.json": (OTHER, OTHER_SHA),
        }
    )
    models = [
        portable(GOOD_SHA, "good.sim.json", f"hf://{REPO}@{COMMIT}/text/good.sim.json"),
        portable(OTHER_SHA, "liar.sim.json", f"hf://{REPO}@{COMMIT}/text/liar.sim.json"),
        portable(OTHER_SHA, "later.sim.json"),
    ]
    node = start_node(tmp_path, models, extra_env={"HF_ENDPOINT": hub.url})
    try:
        yield hub, node
    finally:
        node.cleanup()
        hub.close()


HUB_TOKEN = "hf_auditNeverKeepsThisToken0123"
AUDIT = "/router/v1/site/audit"


def audit(client: Any, action: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = client.get(AUDIT, params={"action": action}).json()["rows"]
    return rows


def node_id(client: Any) -> str:
    return str(client.get("/router/v1/site/nodes/state").json()["node_id"])


def shared(node: RouterNode, sha: str, name: str) -> Path:
    return node.store / "model-assets" / "sha256" / sha[:2] / sha / name


def chat(model: str) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}]}


def test_a_pinned_hub_origin_is_downloaded_verified_and_served(
    hub_and_node: tuple[Hub, RouterNode],
) -> None:
    hub, node = hub_and_node
    with node.client() as client:
        answer = client.post("/v1/chat/completions", json=chat("good"))
        assert answer.status_code == 200, answer.text
        assert shared(node, GOOD_SHA, "good.sim.json").read_bytes() == GOOD
        (job,) = client.get(f"{SITE}/jobs").json()["jobs"]
        assert job["fields"][0]["source"] == "hf_lfs_sha256"
        assert hub.downloads == ["text/good.sim.json"]


def test_a_hub_file_whose_bytes_differ_from_its_claimed_hash_is_refused(
    hub_and_node: tuple[Hub, RouterNode],
) -> None:
    hub, node = hub_and_node
    with node.client() as client:
        answer = client.post("/v1/chat/completions", json=chat("liar"))
    assert answer.status_code == 503, answer.text
    assert answer.json()["error"]["code"] == "model_assets_unresolved"
    assert hub.downloads == ["text/liar.sim.json"]
    directory = shared(node, OTHER_SHA, "x").parent
    assert not directory.exists() or list(directory.iterdir()) == []


def test_a_bound_origin_resolves_a_reference_without_one(
    hub_and_node: tuple[Hub, RouterNode],
) -> None:
    hub, node = hub_and_node
    bind = {
        "sha256": OTHER_SHA,
        "repository": REPO,
        "repository_path": "text/other.sim.json",
        "commit": COMMIT,
    }
    with node.client() as client:
        first = client.post(f"{SITE}/resolve", json={"id": "later", "wait": True})
        assert first.json()["state"] == "failed", first.text
        cases: list[tuple[dict[str, Any], str, str | None]] = [
            ({"sha256": GOOD_SHA}, "sha256", "model_asset_mismatch"),
            ({"repository_path": "text/good.sim.json"}, "sha256", "model_asset_mismatch"),
            ({"commit": "f" * 40}, "sha256", "model_asset_mismatch"),
            ({"commit": "abc"}, "commit", None),
            ({"repository_path": "../x"}, "repository_path", None),
            ({"repository": "no-owner"}, "repository", None),
            ({"sha256": "AB" * 32}, "sha256", None),
            ({"extra": 1}, "extra", None),
        ]
        for change, param, code in cases:
            refused = client.post(f"{SITE}/bind", json={**bind, **change})
            assert refused.status_code == 400, (change, refused.text)
            error = refused.json()["error"]
            assert (error["param"], error.get("code")) == (param, code), change
        assert hub.downloads == []

        assert audit(client, "asset.bind") == []  # the refusals above wrote nothing
        # A hub token goes with the bind; it must not reach the audit log.
        bound = client.post(f"{SITE}/bind", json={**bind, "token": HUB_TOKEN})
        assert bound.status_code == 200, bound.text
        assert bound.json() == {
            "sha256": OTHER_SHA,
            "hf": f"hf://{REPO}@{COMMIT}/text/other.sim.json",
        }
        (row,) = audit(client, "asset.bind")
        assert row["target"] == f"{node_id(client)} sha256 {OTHER_SHA}"
        assert row["after"] == bound.json()
        assert HUB_TOKEN not in json.dumps(client.get(AUDIT).json())
        assert HUB_TOKEN not in node.output()
        second = client.post(f"{SITE}/resolve", json={"id": "later", "wait": True})
        assert second.json()["state"] == "done", second.text
        assert second.json()["fields"][0]["source"] == "hf_lfs_sha256"
        assert shared(node, OTHER_SHA, "later.sim.json").read_bytes() == OTHER
        answer = client.post("/v1/chat/completions", json=chat("later"))
        assert answer.status_code == 200, answer.text


def test_substitute_rewrites_one_reference_only_while_it_still_holds_the_expected_hash(
    hub_and_node: tuple[Hub, RouterNode],
) -> None:
    hub, node = hub_and_node
    config_path = node.store / "kcpps" / "later.kcpps"
    body = {
        "id": "later",
        "field": "model_param",
        "expected_sha256": OTHER_SHA,
        "sha256": GOOD_SHA,
        "repository": REPO,
        "repository_path": "text/good.sim.json",
        "commit": COMMIT,
        "confirm": True,
    }
    with node.client() as client:
        original = config_path.read_bytes()
        cases: list[tuple[dict[str, Any], int, str, str | None]] = [
            ({"sha256": OTHER_SHA}, 400, "sha256", "model_asset_mismatch"),
            ({"confirm": False}, 400, "confirm", None),
            ({"field": "nothing"}, 400, "field", None),
            ({"expected_sha256": GOOD_SHA}, 409, "field", "model_asset_conflict"),
        ]
        for change, status, param, code in cases:
            refused = client.post(f"{SITE}/substitute", json={**body, **change})
            assert refused.status_code == status, (change, refused.text)
            error = refused.json()["error"]
            assert (error["param"], error.get("code")) == (param, code), change
            assert config_path.read_bytes() == original

        assert audit(client, "asset.substitute") == []  # the refusals above wrote nothing
        done = client.post(f"{SITE}/substitute", json=body)
        assert done.status_code == 200, done.text
        (row,) = audit(client, "asset.substitute")
        assert row["target"] == f"{node_id(client)}/later model_param"
        assert (row["before"], row["after"]) == ({"sha256": OTHER_SHA}, done.json())
        assert done.json() == {"sha256": GOOD_SHA, "hf": f"hf://{REPO}@{COMMIT}/text/good.sim.json"}
        rewritten = json.loads(config_path.read_text())
        assert rewritten["model_param_hash"] == GOOD_SHA
        assert rewritten["model_param_filename"] == "good.sim.json"
        assert rewritten["model_param_hf"] == done.json()["hf"]
        assert rewritten["contextsize"] == 4096
        again = client.post(f"{SITE}/substitute", json=body)
        assert again.status_code == 409 and again.json()["error"]["code"] == "model_asset_conflict"

        records = client.get("/router/v1/models").json()["models"]
        later = next(r for r in records if r["local_id"] == "later")
        good = next(r for r in records if r["local_id"] == "good")
        assert later["model_hash"] == good["model_hash"]
        answer = client.post("/v1/chat/completions", json=chat("later"))
        assert answer.status_code == 200, answer.text
        assert shared(node, GOOD_SHA, "good.sim.json").read_bytes() == GOOD
        assert hub.downloads == ["text/good.sim.json"]  # fetched from the substituted origin
