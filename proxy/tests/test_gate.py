"""The front-door rules (`proxy.edge.gate`) and the front door's bookkeeping, without sockets."""

from __future__ import annotations

import logging
import textwrap
from pathlib import Path
from typing import Any

import pytest

from proxy.edge import gate as gate_module
from proxy.edge.caps import FrontDoor, RefusalLog
from proxy.edge.gate import Gate, host_name, parse_address
from routerproject.config import RouterConfig, load_config


def _config(tmp_path: Path, text: str) -> RouterConfig:
    (tmp_path / "kcpps").mkdir(exist_ok=True)
    path = tmp_path / "config.yaml"
    path.write_text(textwrap.dedent(text))
    return load_config(path, environ={})


def _headers(**values: str) -> Any:
    table = {name.replace("_", "-").lower().encode(): v.encode() for name, v in values.items()}
    return table.get


def test_allowed_hosts_default_to_loopback_the_bind_host_and_the_public_url(
    tmp_path: Path,
) -> None:
    cfg = _config(
        tmp_path,
        """
        server: {bind: "10.0.0.5:8080"}
        security: {profile: trusted_lan}
        cluster: {public_url: "http://router.lan:8080"}
        """,
    )
    assert cfg.server.browser_hosts(cfg.cluster.public_url) == (
        "localhost",
        "127.0.0.1",
        "::1",
        "10.0.0.5",
        "router.lan",
    )


@pytest.mark.parametrize("bind", ["0.0.0.0:8080", ":8080", "[::]:8080"])
def test_a_wildcard_bind_allows_any_host(tmp_path: Path, bind: str) -> None:
    cfg = _config(tmp_path, f'server: {{bind: "{bind}"}}\nsecurity: {{profile: trusted_lan}}\n')
    assert cfg.server.browser_hosts() is None


def test_listed_allowed_hosts_replace_the_defaults(tmp_path: Path) -> None:
    cfg = _config(tmp_path, "server: {allowed_hosts: [Router.Example, '[::1]']}\n")
    assert cfg.server.browser_hosts() == ("router.example", "::1")
    star = _config(tmp_path, "server: {allowed_hosts: ['*']}\n")
    assert star.server.browser_hosts() is None


def test_an_allowed_host_with_a_port_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(Exception, match=r"server.allowed_hosts\[0\]"):
        _config(tmp_path, "server: {allowed_hosts: ['example.com:80']}\n")


def test_front_door_settings_have_documented_defaults(tmp_path: Path) -> None:
    server = _config(tmp_path, "").server
    assert (server.header_timeout, server.body_timeout, server.idle_timeout) == (10.0, 30.0, 120.0)
    assert server.body_min_rate == 4096
    assert server.max_connections_per_client == 1024
    assert server.trusted_proxies == [] and server.allowed_hosts == []


@pytest.mark.parametrize(
    ("header", "name"),
    [
        (b"Example.com:8080", "example.com"),
        (b"example.com", "example.com"),
        (b"[::1]:8080", "::1"),
        (b"127.0.0.1:80", "127.0.0.1"),
    ],
)
def test_host_name_drops_the_port(header: bytes, name: str) -> None:
    assert host_name(header) == name


def test_an_ipv4_mapped_peer_is_matched_as_ipv4() -> None:
    assert str(parse_address("::ffff:10.1.2.3")) == "10.1.2.3"
    assert parse_address("not an address") is None


def test_only_a_trusted_proxy_names_the_client(tmp_path: Path) -> None:
    gate = Gate(
        _config(
            tmp_path,
            "server: {allowed_cidrs: [10.0.0.0/8], trusted_proxies: [192.168.1.0/24]}\n",
        )
    )
    proxy, stranger = parse_address("192.168.1.9"), parse_address("172.16.0.1")
    forwarded = _headers(x_forwarded_for="10.9.9.9")
    assert gate.address_refusal(proxy, forwarded) is None
    refusal = gate.address_refusal(stranger, forwarded)
    assert refusal is not None and refusal.status == 403
    # Two proxies in a row: the walk goes past both to the client.
    chain = _headers(x_forwarded_for="10.9.9.9, 192.168.1.7")
    assert gate.address_refusal(proxy, chain) is None
    # A client putting an allowed address before its own gains nothing.
    spoofed = _headers(x_forwarded_for="10.9.9.9, 172.16.0.1")
    assert gate.address_refusal(proxy, spoofed) is not None
    garbage = _headers(x_forwarded_for="nonsense")
    assert gate.address_refusal(proxy, garbage) is not None


@pytest.mark.parametrize("junk", ["junk", "", "1.2.3.4/8", "\xff", "[::1"])
def test_a_junk_hop_between_trusted_proxies_is_refused_with_403(tmp_path: Path, junk: str) -> None:
    gate = Gate(
        _config(
            tmp_path,
            "server: {allowed_cidrs: [10.0.0.0/8], trusted_proxies: [192.168.1.0/24]}\n",
        )
    )
    proxy = parse_address("192.168.1.9")
    chain = {b"x-forwarded-for": b"10.9.9.9, " + junk.encode("latin-1") + b", 192.168.1.7"}

    refusal = gate.address_refusal(proxy, chain.get)

    assert refusal is not None
    assert (refusal.status, refusal.type, refusal.code) == (403, "forbidden", "address_not_allowed")
    assert refusal.message == "client address unknown is not in server.allowed_cidrs"


def test_a_junk_hop_beyond_the_first_untrusted_one_is_never_read(tmp_path: Path) -> None:
    gate = Gate(
        _config(
            tmp_path,
            "server: {allowed_cidrs: [10.0.0.0/8], trusted_proxies: [192.168.1.0/24]}\n",
        )
    )
    chain = _headers(x_forwarded_for="junk, 10.9.9.9, 192.168.1.7")

    assert gate.address_refusal(parse_address("192.168.1.9"), chain) is None


def test_no_allowed_cidrs_means_every_address(tmp_path: Path) -> None:
    gate = Gate(_config(tmp_path, ""))
    assert gate.address_refusal(parse_address("203.0.113.9"), _headers()) is None


def test_allowed_hosts_apply_to_browser_paths_only(tmp_path: Path) -> None:
    gate = Gate(_config(tmp_path, ""))
    evil = _headers(host="evil.example:8080")
    for path in ("/router/v1/models", "/ui/nodes", "/admin/", "/"):
        refusal = gate.host_refusal(path, evil)
        assert refusal is not None and refusal.status == 400 and refusal.param == "Host", path
    for path in ("/v1/models", "/api/chat", "/router/v1/node/state"):
        assert gate.host_refusal(path, evil) is None, path
    assert gate.host_refusal("/router/v1/models", _headers(host="localhost:8080")) is None


def test_a_management_write_needs_a_json_content_type(tmp_path: Path) -> None:
    gate = Gate(_config(tmp_path, ""))
    plain = _headers(host="127.0.0.1:8080", content_type="text/plain", content_length="20")
    refusal = gate.write_refusal("POST", "/router/v1/load", plain)
    assert refusal is not None and refusal.status == 415 and refusal.param == "Content-Type"
    untyped_body = _headers(host="127.0.0.1:8080", content_length="20")
    assert gate.write_refusal("POST", "/router/v1/load", untyped_body) is not None
    for ok in ("application/json", "application/json; charset=utf-8", "application/merge+json"):
        headers = _headers(host="127.0.0.1:8080", content_type=ok, content_length="20")
        assert gate.write_refusal("POST", "/router/v1/load", headers) is None, ok
    assert gate.write_refusal("POST", "/router/v1/load", _headers(host="127.0.0.1")) is None
    # No body, nothing to misread: a DELETE from a client that labels everything.
    empty = _headers(host="127.0.0.1", content_type="application/octet-stream", content_length="0")
    assert gate.write_refusal("DELETE", "/router/v1/load", empty) is None
    assert gate.write_refusal("GET", "/router/v1/load", plain) is None
    # Inference, node and admin paths have their own rules.
    for path in ("/v1/chat/completions", "/router/v1/node/state", "/admin/login/"):
        assert gate.write_refusal("POST", path, plain) is None, path


def test_without_admin_keys_a_write_must_come_from_the_same_origin(tmp_path: Path) -> None:
    gate = Gate(_config(tmp_path, ""))

    def check(**values: str) -> Any:
        return gate.write_refusal(
            "POST",
            "/router/v1/load",
            _headers(host="127.0.0.1:8080", content_type="application/json", **values),
        )

    assert check(origin="http://127.0.0.1:8080") is None
    assert check(referer="http://127.0.0.1:8080/ui/nodes") is None
    assert check() is None  # no browser: curl, scripts
    for values in (
        {"origin": "http://evil.example"},
        {"origin": "null"},
        {"origin": "http://127.0.0.1:9999"},
        {"referer": "http://evil.example/page"},
    ):
        refusal = check(**values)
        assert refusal is not None and refusal.status == 403, values


def test_with_admin_keys_the_key_is_what_counts(tmp_path: Path) -> None:
    gate = Gate(_config(tmp_path, "auth: {admin_keys: [an-admin-key-123]}\n"))
    headers = _headers(
        host="127.0.0.1:8080", content_type="application/json", origin="http://evil.example"
    )
    assert gate.write_refusal("POST", "/router/v1/load", headers) is None


def test_the_head_refusal_follows_the_apps_order(tmp_path: Path) -> None:
    gate = Gate(
        _config(
            tmp_path,
            """
            server: {max_body_bytes: 100}
            auth: {inference_keys: [an-inference-key-1], admin_keys: [an-admin-key-123]}
            """,
        )
    )
    big = _headers(host="127.0.0.1", content_length="101")
    _, refusal = gate.head_refusal("POST", b"/v1/chat/completions", big, None)
    assert refusal is not None and refusal.status == 401
    bearer = "Bearer an-inference-key-1"
    keyed = _headers(host="127.0.0.1", content_length="101", authorization=bearer)
    _, refusal = gate.head_refusal("POST", b"/v1/chat/completions?x=1", keyed, None)
    assert refusal is not None and refusal.status == 413
    at_limit = _headers(host="127.0.0.1", content_length="100", authorization=bearer)
    assert gate.head_refusal("POST", b"/v1/chat/completions", at_limit, None)[1] is None
    _, refusal = gate.head_refusal("GET", b"/v1/chat/completions", keyed, None)
    assert refusal is not None and refusal.status == 405
    assert dict(refusal.headers)[b"allow"] == b"POST"
    path, refusal = gate.head_refusal("GET", b"/api/chat", _headers(), None)
    assert path == "/api/chat" and refusal is not None
    assert refusal.body(path).startswith(b'{"error":"')  # Ollama's envelope on its paths


def test_the_refusal_log_holds_back_repeats_within_the_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [100.0]
    log = RefusalLog(logging.getLogger("test.refusals"), interval=10.0, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="test.refusals"):
        assert log.note("a", "first")
        assert not log.note("a", "second")
        assert log.note("b", "other kind")
        now[0] += 9.99
        assert not log.note("a", "third")
        now[0] += 0.02
        assert log.note("a", "fourth")
    messages = [record.getMessage() for record in caplog.records]
    assert messages == [
        "refused: first",
        "refused: other kind",
        "refused: fourth (2 more like it since the last line)",
    ]


def test_the_connection_cap_counts_per_address_and_exempts_trusted_proxies(
    tmp_path: Path,
) -> None:
    door = FrontDoor(
        _config(
            tmp_path, "server: {max_connections_per_client: 2, trusted_proxies: [10.0.0.1/32]}\n"
        )
    )
    one, two = parse_address("127.0.0.1"), parse_address("127.0.0.2")
    first, second = door.acquire(one), door.acquire(one)
    assert first == second == "127.0.0.1"
    assert door.acquire(one) is False
    assert door.acquire(two) == "127.0.0.2"
    door.release("127.0.0.1")
    assert door.acquire(one) == "127.0.0.1"
    proxy = parse_address("10.0.0.1")
    assert all(door.acquire(proxy) is None for _ in range(5))


def test_a_body_gets_one_more_second_per_min_rate_bytes(tmp_path: Path) -> None:
    door = FrontDoor(_config(tmp_path, "server: {body_timeout: 30s, body_min_rate: 1000}\n"))
    assert door.body_allowance(0) == 30.0
    assert door.body_allowance(5000) == 35.0
    flat = FrontDoor(_config(tmp_path, "server: {body_timeout: 30s, body_min_rate: 0}\n"))
    assert flat.body_allowance(10**9) == 30.0


def test_each_address_is_parsed_once_and_the_4096_last_used_are_kept() -> None:
    gate_module._parse_address.cache_clear()
    first = parse_address("198.51.100.7")
    assert parse_address("198.51.100.7") is first
    others = [f"10.{i // 256}.{i % 256}.1" for i in range(4096)]
    for text in others[:-1]:
        parse_address(text)
    assert parse_address("198.51.100.7") is first  # 4,096 kept, this one among them
    for text in others[:-1]:
        parse_address(text)  # now the least recently used
    parse_address(others[-1])
    again = parse_address("198.51.100.7")
    assert again == first and again is not first
