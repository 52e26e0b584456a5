"""The node's TLS over real sockets: an asyncio server listening on 127.0.0.1 with
`ServerTLS.context`, on asyncio's own loop and on uvloop (the node's), and blocking Python ssl
clients in threads. The whole node over HTTPS is in tests/test_tls_cluster.py."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import trustme
import uvloop

from proxy.edge.tls import ServerTLS, _reason, build_context, has_client_cert, is_tls

Run = Callable[[Coroutine[Any, Any, None]], None]
LOOPS: dict[str, Run] = {"asyncio": asyncio.run, "uvloop": uvloop.run}
VERSIONS = [ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3]
GREETING = b"hello\n"


@pytest.fixture(params=sorted(LOOPS))
def run(request: pytest.FixtureRequest) -> Run:
    return LOOPS[request.param]


def _der(leaf: trustme.LeafCert) -> bytes:
    return ssl.PEM_cert_to_DER_cert(leaf.cert_chain_pems[0].bytes().decode())


class Pki:
    """A CA, the node's certificate and key files, and the client CA file."""

    def __init__(self, tmp_path: Path) -> None:
        self.ca = trustme.CA()
        self.cert_file = tmp_path / "cert.pem"
        self.key_file = tmp_path / "key.pem"
        self.ca_file = tmp_path / "client-ca.pem"
        self.ca.cert_pem.write_to_path(str(self.ca_file))
        self.served = self.renew()

    def renew(self) -> bytes:
        """Write a new certificate and key in place, as a renewal tool does; its DER form."""
        leaf = self.ca.issue_cert("127.0.0.1")
        leaf.cert_chain_pems[0].write_to_path(str(self.cert_file))
        leaf.private_key_pem.write_to_path(str(self.key_file))
        return _der(leaf)

    def tls(self, *, client_ca: bool = False) -> ServerTLS:
        return ServerTLS(self.cert_file, self.key_file, self.ca_file if client_ca else None)

    def client(
        self,
        cert: trustme.LeafCert | None = None,
        version: ssl.TLSVersion | None = None,
    ) -> ssl.SSLContext:
        context = ssl.create_default_context()
        self.ca.configure_trust(context)
        if cert is not None:
            cert.configure_cert(context)
        if version is not None:
            context.maximum_version = version
        return context


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return Pki(tmp_path)


@dataclass
class Served:
    """What the server saw: (is_tls, has_client_cert) when each connection was made, and again
    once it was closed."""

    port: int
    made: list[tuple[bool, bool]] = field(default_factory=list)
    lost: list[tuple[bool, bool]] = field(default_factory=list)
    closed: asyncio.Event = field(default_factory=asyncio.Event)


class _Recorder(asyncio.Protocol):
    """Greets each connection (so a client that read the greeting knows `made` is written),
    echoes, and answers a close with a clean TLS close so the session can be resumed."""

    def __init__(self, served: Served) -> None:
        self.served = served
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not subclass asyncio's; they have the same methods.
        self.transport = cast(asyncio.Transport, transport)
        self.served.made.append((is_tls(transport), has_client_cert(transport)))
        self.transport.write(GREETING)

    def data_received(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(data)

    def eof_received(self) -> bool:
        assert self.transport is not None
        self.transport.close()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.served.lost.append((is_tls(self.transport), has_client_cert(self.transport)))
        self.served.closed.set()


@contextlib.asynccontextmanager
async def serving(context: ssl.SSLContext | None) -> AsyncIterator[Served]:
    loop = asyncio.get_running_loop()
    served = Served(port=0)
    server = await loop.create_server(lambda: _Recorder(served), "127.0.0.1", 0, ssl=context)
    served.port = server.sockets[0].getsockname()[1]
    try:
        yield served
    finally:
        server.close()
        await server.wait_closed()


def _read_line(sock: socket.socket) -> bytes:
    line = b""
    while not line.endswith(b"\n"):
        chunk = sock.recv(1024)
        if not chunk:
            break
        line += chunk
    return line


def _connect(
    port: int, context: ssl.SSLContext, session: ssl.SSLSession | None = None
) -> ssl.SSLSocket:
    """A TLS connection the server has made (its greeting read)."""
    raw = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        sock = context.wrap_socket(
            raw, server_hostname="127.0.0.1", session=session, suppress_ragged_eofs=False
        )
    except BaseException:
        raw.close()
        raise
    try:
        assert _read_line(sock) == GREETING
    except BaseException:
        sock.close()
        raise
    return sock


def _visit(
    port: int, context: ssl.SSLContext, session: ssl.SSLSession | None = None
) -> tuple[bytes, bool | None, ssl.SSLSession | None]:
    """Connect, close cleanly; the certificate served, whether the session was resumed, and
    the session to offer next time."""
    sock = _connect(port, context, session)
    with contextlib.closing(sock):
        der = sock.getpeercert(binary_form=True)
        reused, offered = sock.session_reused, sock.session
        sock.unwrap()
    assert der is not None
    return der, reused, offered


def _served_certificate(port: int, context: ssl.SSLContext) -> bytes:
    return _visit(port, context)[0]


def _echo(sock: ssl.SSLSocket, data: bytes) -> bytes:
    sock.sendall(data)
    return _read_line(sock)


def _refused(port: int, context: ssl.SSLContext) -> None:
    """The handshake fails: under TLS 1.3 the client finishes its half first and learns of the
    refusal on its first read, which gets no greeting."""
    with pytest.raises((ssl.SSLError, ConnectionResetError)):
        _connect(port, context).close()


def test_a_connection_is_served_the_certificate_over_tls(run: Run, pki: Pki) -> None:
    tls = pki.tls()

    async def scenario() -> None:
        async with serving(tls.context) as served:
            der = await asyncio.to_thread(_served_certificate, served.port, pki.client())
            await served.closed.wait()
        assert der == pki.served
        assert served.made == [(True, False)]
        # Read on a closed transport too, as the app may after a disconnect.
        assert served.lost == [(True, False)]

    run(scenario())


def test_a_plain_connection_or_none_is_not_tls(run: Run) -> None:
    assert (is_tls(None), has_client_cert(None)) == (False, False)

    async def scenario() -> None:
        async with serving(None) as served:
            with socket.create_connection(("127.0.0.1", served.port), timeout=10) as sock:
                assert await asyncio.to_thread(_read_line, sock) == GREETING
            await served.closed.wait()
        assert served.made == served.lost == [(False, False)]

    run(scenario())


def test_after_a_reload_new_connections_get_the_new_certificate_while_open_ones_go_on(
    run: Run, pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    tls = pki.tls()
    before = pki.served

    async def scenario() -> None:
        async with serving(tls.context) as served:
            old = await asyncio.to_thread(_connect, served.port, pki.client())
            with contextlib.closing(old):
                renewed = pki.renew()
                with caplog.at_level(logging.INFO, logger="router"):
                    assert tls.reload() is True
                new = await asyncio.to_thread(_served_certificate, served.port, pki.client())
                assert new == renewed != before
                assert await asyncio.to_thread(_echo, old, b"still here\n") == b"still here\n"
                assert old.getpeercert(binary_form=True) == before

    run(scenario())
    assert [r.getMessage() for r in caplog.records if r.name == "router"] == [
        f"TLS certificate reloaded from {pki.cert_file}"
    ]


@pytest.mark.parametrize("version", VERSIONS, ids=["tls1.2", "tls1.3"])
def test_a_session_from_before_a_reload_is_not_resumed(
    run: Run, pki: Pki, version: ssl.TLSVersion
) -> None:
    tls = pki.tls()
    client = pki.client(version=version)

    async def scenario() -> None:
        async with serving(tls.context) as served:
            first, _, session = await asyncio.to_thread(_visit, served.port, client)
            again, resumed, session = await asyncio.to_thread(_visit, served.port, client, session)
            # Resumption itself still works between reloads.
            assert resumed is True
            assert first == again == pki.served
            renewed = pki.renew()
            assert tls.reload() is True
            after, resumed, _ = await asyncio.to_thread(_visit, served.port, client, session)
            assert resumed is False
            assert after == renewed

    run(scenario())


@pytest.mark.parametrize(
    ("breakage", "reason"),
    [
        ("new certificate, old key", "key values mismatch"),
        ("key deleted", "No such file or directory"),
        ("certificate not PEM", "not a PEM certificate and key"),
    ],
)
def test_a_reload_that_cannot_load_keeps_the_previous_certificate(
    run: Run, pki: Pki, caplog: pytest.LogCaptureFixture, breakage: str, reason: str
) -> None:
    tls = pki.tls()
    before = pki.served
    if breakage == "new certificate, old key":
        # A renewal half-written.
        pki.ca.issue_cert("127.0.0.1").cert_chain_pems[0].write_to_path(str(pki.cert_file))
    elif breakage == "key deleted":
        pki.key_file.unlink()
    else:
        pki.cert_file.write_text("not a certificate\n")
    with caplog.at_level(logging.INFO, logger="router"):
        assert tls.reload() is False
    [record] = [r for r in caplog.records if r.name == "router"]
    assert record.levelno == logging.ERROR
    message = record.getMessage()
    assert message.startswith("TLS reload failed, still serving the previous certificate: ")
    assert reason in message
    assert "\n" not in message

    async def scenario() -> None:
        async with serving(tls.context) as served:
            der = await asyncio.to_thread(_served_certificate, served.port, pki.client())
            assert der == before
            renewed = pki.renew()
            assert tls.reload() is True
            der = await asyncio.to_thread(_served_certificate, served.port, pki.client())
            assert der == renewed

    run(scenario())


@pytest.mark.parametrize("version", VERSIONS, ids=["tls1.2", "tls1.3"])
def test_with_a_client_ca_a_certificate_is_optional_verified_and_one_of_another_ca_refused(
    run: Run, pki: Pki, version: ssl.TLSVersion
) -> None:
    tls = pki.tls(client_ca=True)
    assert tls.requires_client_cert is True
    signed = pki.ca.issue_cert("node@cluster.test")
    stranger = trustme.CA().issue_cert("node@cluster.test")

    async def scenario() -> None:
        async with serving(tls.context) as served:
            await asyncio.to_thread(_served_certificate, served.port, pki.client(version=version))
            await asyncio.to_thread(
                _served_certificate, served.port, pki.client(signed, version=version)
            )
            await asyncio.to_thread(_refused, served.port, pki.client(stranger, version=version))
        # The refused handshake never became a connection.
        assert served.made == [(True, False), (True, True)]

    run(scenario())


@pytest.mark.parametrize("version", VERSIONS, ids=["tls1.2", "tls1.3"])
def test_a_reloaded_client_ca_verifies_new_connections_and_resumes_no_older_session(
    run: Run, pki: Pki, version: ssl.TLSVersion
) -> None:
    tls = pki.tls(client_ca=True)
    old_ca_cert = pki.ca.issue_cert("node@cluster.test")
    new_ca = trustme.CA()
    new_ca_cert = new_ca.issue_cert("node@cluster.test")
    old_client = pki.client(old_ca_cert, version=version)

    async def scenario() -> None:
        async with serving(tls.context) as served:
            _, _, session = await asyncio.to_thread(_visit, served.port, old_client)
            open_before = await asyncio.to_thread(_connect, served.port, old_client)
            with contextlib.closing(open_before):
                new_ca.cert_pem.write_to_path(str(pki.ca_file))
                assert tls.reload() is True
                # A certificate verified under the old CA does not come back with its session.
                await asyncio.to_thread(_refused, served.port, old_client)
                with pytest.raises((ssl.SSLError, ConnectionResetError)):
                    await asyncio.to_thread(_visit, served.port, old_client, session)
                await asyncio.to_thread(
                    _served_certificate, served.port, pki.client(new_ca_cert, version=version)
                )
                assert await asyncio.to_thread(_echo, open_before, b"on\n") == b"on\n"
        assert served.made == [(True, True), (True, True), (True, True)]

    run(scenario())


def test_the_listening_context_stays_the_same_object_across_reloads(pki: Pki) -> None:
    tls = pki.tls()
    listening = tls.context
    pki.renew()
    assert tls.reload() is True
    assert tls.context is listening


def test_build_context_settings(pki: Pki) -> None:
    plain = build_context(pki.cert_file, pki.key_file, None)
    mutual = build_context(pki.cert_file, pki.key_file, pki.ca_file)
    for context in (plain, mutual):
        assert context.minimum_version == ssl.TLSVersion.TLSv1_2
        assert context.options & ssl.OP_NO_COMPRESSION
        assert context.options & ssl.OP_CIPHER_SERVER_PREFERENCE
    assert plain.verify_mode == ssl.CERT_NONE
    assert mutual.verify_mode == ssl.CERT_OPTIONAL
    assert mutual.cert_store_stats()["x509_ca"] == 1


def test_build_context_refuses_files_that_cannot_serve(pki: Pki, tmp_path: Path) -> None:
    other_key = tmp_path / "other-key.pem"
    pki.ca.issue_cert("127.0.0.1").private_key_pem.write_to_path(str(other_key))
    with pytest.raises(ssl.SSLError) as mismatch:
        build_context(pki.cert_file, other_key, None)
    assert _reason(mismatch.value) == f"{pki.cert_file} with {other_key}: key values mismatch"

    missing = tmp_path / "missing.pem"
    with pytest.raises(OSError) as absent:
        build_context(pki.cert_file, pki.key_file, missing)
    assert _reason(absent.value) == f"{missing}: No such file or directory"

    junk = tmp_path / "junk.pem"
    junk.write_text("not a CA\n")
    with pytest.raises(ssl.SSLError) as not_ca:
        build_context(pki.cert_file, pki.key_file, junk)
    assert _reason(not_ca.value) == f"{junk}: no certificate or crl found"


def test_reason_of_a_handshake_error_is_one_line() -> None:
    exc = ssl.SSLError(1, "[SSL: TLSV1_ALERT_UNKNOWN_CA] tlsv1 alert unknown ca (_ssl.c:2580)")
    assert _reason(exc) == "tlsv1 alert unknown ca"
    assert _reason(ValueError("plain")) == "plain"


def test_from_config(pki: Pki) -> None:
    def server(cert: Path | None, key: Path | None, ca: Path | None) -> Any:
        return SimpleNamespace(tls_cert_file=cert, tls_key_file=key, tls_client_ca_file=ca)

    assert ServerTLS.from_config(server(None, None, None)) is None
    assert ServerTLS.from_config(server(pki.cert_file, None, None)) is None
    plain = ServerTLS.from_config(server(pki.cert_file, pki.key_file, None))
    assert plain is not None and plain.requires_client_cert is False
    mutual = ServerTLS.from_config(server(pki.cert_file, pki.key_file, pki.ca_file))
    assert mutual is not None and mutual.requires_client_cert is True
