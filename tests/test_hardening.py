"""Smaller hardening on real nodes: a database outage answered and logged sanely, huge model
names not echoed, a secret key of the node's own, and throttled admin logins."""

from __future__ import annotations

import contextlib
import re
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from routerproject.settings import stored_secret_key
from tests.harness import RouterNode, start_node, text_model, wait_for

pytestmark = pytest.mark.integration


def _chat(model: str) -> dict[str, object]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}]}


@contextlib.contextmanager
def _database_down(node: RouterNode) -> Iterator[None]:
    """Make the node's database refuse new connections, and bring it back after."""
    if node.db is not None:
        import psycopg

        with psycopg.connect(node.db.admin_url, autocommit=True) as conn:
            conn.execute(f'ALTER DATABASE "{node.db.name}" ALLOW_CONNECTIONS false')
        try:
            yield
        finally:
            with psycopg.connect(node.db.admin_url, autocommit=True) as conn:
                conn.execute(f'ALTER DATABASE "{node.db.name}" ALLOW_CONNECTIONS true')
        return
    # SQLite: a directory where the file was cannot be opened (root ignores file modes).
    path = node.store / "router.sqlite3"
    aside = node.store / "aside"
    aside.mkdir()
    moved = [p for p in node.store.glob("router.sqlite3*")]
    for p in moved:
        p.rename(aside / p.name)
    path.mkdir()
    try:
        yield
    finally:
        path.rmdir()
        for p in moved:
            (aside / p.name).rename(p)
        shutil.rmtree(aside)


def test_a_database_outage_is_a_json_503_and_one_log_line(tmp_path: Path) -> None:
    node = start_node(tmp_path, [text_model("alpha")])
    try:
        with node.client() as client:
            assert client.post("/v1/chat/completions", json=_chat("alpha")).status_code == 200
            url = "/router/v1/site/analytics"
            wait_for(lambda: client.get(url, params={"kind": "requests"}).json()["records"])
            metrics = "/metrics"
            assert "router_database_available 1.0" in client.get(metrics).text
            with _database_down(node):
                for _ in range(5):
                    answer = client.get(url, params={"kind": "requests"})
                    assert answer.status_code == 503
                    assert answer.headers["content-type"] == "application/json"
                    assert answer.json()["error"]["message"] == "database unavailable"
                    assert answer.json()["error"]["code"] == "database_unavailable"
                # Inference goes on; its record waits for the database.
                during = client.post("/v1/chat/completions", json=_chat("alpha"))
                assert during.status_code == 200
                assert "router_database_available 0.0" in client.get(metrics).text
            wait_for(lambda: any("database available again" in line for line in node.lines))
            records = wait_for(
                lambda: len(client.get(url, params={"kind": "requests"}).json()["records"]) >= 2
            )
            assert records
        down = [line for line in node.lines if "database unavailable" in line]
        assert len(down) == 1, down
        assert not [line for line in node.lines if "Traceback" in line]
    finally:
        node.cleanup()


def test_a_huge_model_name_is_not_echoed_back(tmp_path: Path) -> None:
    node = start_node(tmp_path, [text_model("alpha")])
    name = "m" * 900_000
    try:
        with node.client() as client:
            for path, body in (
                ("/v1/chat/completions", _chat(name)),
                ("/router/v1/load", {"model": name}),
            ):
                answer = client.post(path, json=body)
                assert answer.status_code == 404, path
                message = answer.json()["error"]["message"]
                assert len(message) < 300, path
                assert "(900000 characters)" in message
            ollama = client.post("/api/chat", json=_chat(name))
            assert ollama.status_code == 404
            assert len(ollama.json()["error"]) < 300
    finally:
        node.cleanup()


def test_the_node_makes_its_secret_key_once_and_keeps_it(tmp_path: Path) -> None:
    # An empty DJANGO_SECRET_KEY counts as unset.
    node = start_node(tmp_path, [text_model("alpha")], extra_env={"DJANGO_SECRET_KEY": ""})
    secret = node.store / "secret_key"
    try:
        first = secret.read_text().strip()
        assert len(first) >= 50
        assert stat.S_IMODE(secret.stat().st_mode) == 0o600
        assert str(node.store) not in first
    finally:
        node.stop()
        node.cleanup(drop_db=False)
    again = start_node(
        tmp_path,
        [text_model("alpha")],
        extra_env={"DJANGO_SECRET_KEY": ""},
        port=node.port,
        db=node.db,
        keep_db=True,
    )
    try:
        assert secret.read_text().strip() == first
    finally:
        again.cleanup()


def test_stored_secret_key_makes_a_file_once(tmp_path: Path) -> None:
    path = tmp_path / "secret_key"
    first = stored_secret_key(path)
    assert stored_secret_key(path) == first
    assert stored_secret_key(tmp_path / "other") != first
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    path.write_text("\n")
    with pytest.raises(RuntimeError, match="empty"):
        stored_secret_key(path)


def _login(client: httpx.Client, username: str) -> int:
    page = client.get("/admin/login/")
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
    assert token is not None
    answer = client.post(
        "/admin/login/?next=/admin/",
        data={
            "csrfmiddlewaretoken": token.group(1),
            "username": username,
            "password": "wrong-password",
            "next": "/admin/",
        },
        headers={"Referer": f"{client.base_url}/admin/login/"},
    )
    return answer.status_code


def test_admin_logins_are_throttled_per_user_name_and_address(tmp_path: Path) -> None:
    node = start_node(tmp_path, [text_model("alpha")])
    try:
        with node.client() as client:
            statuses = [_login(client, "admin") for _ in range(6)]
            # Four wrong passwords are answered with the form again; the fifth locks the pair.
            assert statuses[:4] == [200] * 4, statuses
            assert statuses[4:] == [429, 429], statuses
            assert _login(client, "someone-else") == 200
    finally:
        node.cleanup()
