"""An `https://` upstream server: verified against the system's store, or against the model
config's own `upstream_tls_ca_file` (a private CA), hostname checked; a wrong CA file is that
config's error."""

from __future__ import annotations

import json
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import trustme
from aiohttp import web

from proxy.runtimes.backends import build_launch
from registry.hashing import FileHasher
from registry.httpclient import close_session, get_session
from registry.kcpps import ModelConfig, ModelConfigError, load_model_config
from routerproject.config import RouterConfig


def _load(tmp_path: Path, raw: dict[str, object]) -> ModelConfig:
    path = tmp_path / "remote.kcpps"
    path.write_text(json.dumps(raw))
    return load_model_config(path, default_backend_mode="sim", hasher=FileHasher(None))


@pytest.fixture
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
async def https_upstream(ca: trustme.CA) -> AsyncIterator[int]:
    """A loopback HTTPS server answering `/v1/models`, its certificate from `ca`."""

    async def models(_request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "remote"}]})

    app = web.Application()
    app.router.add_get("/v1/models", models)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield port
    finally:
        await close_session()
        await runner.cleanup()


async def test_an_upstream_of_a_private_ca_is_reached_with_its_config_ca_file_only(
    tmp_path: Path, ca: trustme.CA, https_upstream: int
) -> None:
    ca.cert_pem.write_to_path(str(tmp_path / "upstream-ca.pem"))
    url = f"https://127.0.0.1:{https_upstream}"
    trusted = _load(
        tmp_path,
        {
            "backend_mode": "upstream",
            "upstream_url": url,
            "upstream_tls_ca_file": "upstream-ca.pem",
        },
    )
    assert trusted.upstream_tls_ca_file == tmp_path / "upstream-ca.pem"
    plain = _load(tmp_path, {"backend_mode": "upstream", "upstream_url": url})
    config = RouterConfig.model_validate({"models": {"config_dir": str(tmp_path)}})

    launch = build_launch(trusted, "text", config=config, port=0)
    async with get_session().get(launch.base_url + "/v1/models", ssl=launch.tls) as resp:
        assert resp.status == 200
    # Without the config's CA the system's store does not know the private CA: refused.
    default = build_launch(plain, "text", config=config, port=0)
    assert default.tls is True
    with pytest.raises(aiohttp.ClientConnectorCertificateError):
        async with get_session().get(default.base_url + "/v1/models", ssl=default.tls):
            pass


async def test_the_upstream_certificate_must_name_the_host_of_the_url(
    tmp_path: Path, ca: trustme.CA, https_upstream: int
) -> None:
    ca.cert_pem.write_to_path(str(tmp_path / "upstream-ca.pem"))
    # The certificate names 127.0.0.1; "localhost" reaches the same server under another name.
    cfg = _load(
        tmp_path,
        {
            "backend_mode": "upstream",
            "upstream_url": f"https://localhost:{https_upstream}",
            "upstream_tls_ca_file": "upstream-ca.pem",
        },
    )
    config = RouterConfig.model_validate({"models": {"config_dir": str(tmp_path)}})
    launch = build_launch(cfg, "text", config=config, port=0)
    with pytest.raises(aiohttp.ClientConnectorCertificateError):
        async with get_session().get(launch.base_url + "/v1/models", ssl=launch.tls):
            pass


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"upstream_tls_ca_file": "missing.pem"}, "cannot be read"),
        ({"upstream_tls_ca_file": "junk.pem"}, "holds no PEM CA certificate"),
        ({"upstream_tls_ca_file": 3}, "must be a file path"),
    ],
)
def test_a_wrong_upstream_ca_file_is_the_configs_error(
    tmp_path: Path, extra: dict[str, object], message: str
) -> None:
    (tmp_path / "junk.pem").write_text("not a certificate\n")
    raw = {"backend_mode": "upstream", "upstream_url": "https://127.0.0.1:9", **extra}
    with pytest.raises(ModelConfigError, match=message) as info:
        _load(tmp_path, raw)
    assert info.value.key == "upstream_tls_ca_file"


def test_an_upstream_ca_file_needs_the_upstream_mode(tmp_path: Path, ca: trustme.CA) -> None:
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    (tmp_path / "w.sim.json").write_text("{}")
    raw: dict[str, object] = {"model_param": "w.sim.json", "upstream_tls_ca_file": "ca.pem"}
    with pytest.raises(ModelConfigError, match="only allowed with backend_mode upstream"):
        _load(tmp_path, raw)
