"""The TLS keys and `cluster.previous_tokens` at start: a pair that cannot serve, a file that
cannot be read or a reused secret is a config error naming its key."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import trustme

from routerproject.config import ConfigError, config_to_dict, load_config


def _files(tmp_path: Path) -> dict[str, Path]:
    ca = trustme.CA()
    other = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1", "localhost")
    stranger = other.issue_cert("127.0.0.1")
    paths = {
        "ca": tmp_path / "ca.pem",
        "cert": tmp_path / "cert.pem",
        "key": tmp_path / "key.pem",
        "other_key": tmp_path / "other-key.pem",
        "junk": tmp_path / "junk.pem",
    }
    ca.cert_pem.write_to_path(str(paths["ca"]))
    leaf.cert_chain_pems[0].write_to_path(str(paths["cert"]))
    leaf.private_key_pem.write_to_path(str(paths["key"]))
    stranger.private_key_pem.write_to_path(str(paths["other_key"]))
    paths["junk"].write_text("not a pem file\n")
    return paths


def _load(tmp_path: Path, text: str) -> object:
    (tmp_path / "kcpps").mkdir(exist_ok=True)
    path = tmp_path / "config.yaml"
    path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return load_config(path, environ={})


def _error(tmp_path: Path, text: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        _load(tmp_path, text)
    return info.value


def _keys(error: ConfigError) -> list[str]:
    return [str(problem.key) for problem in error.problems]


def test_a_matching_pair_and_cas_load(tmp_path: Path) -> None:
    f = _files(tmp_path)
    cfg = _load(
        tmp_path,
        f"""
        server:
          tls_cert_file: {f["cert"]}
          tls_key_file: {f["key"]}
          tls_client_ca_file: {f["ca"]}
        cluster:
          tls_ca_file: {f["ca"]}
          tls_client_cert_file: {f["cert"]}
          tls_client_key_file: {f["key"]}
        """,
    )
    assert cfg.server.tls_cert_file == f["cert"]  # type: ignore[attr-defined]
    assert cfg.cluster.tls_client_key_file == f["key"]  # type: ignore[attr-defined]


def test_unset_tls_keys_are_none(tmp_path: Path) -> None:
    cfg = _load(tmp_path, "server:\n  tls_cert_file: ''\n")
    assert cfg.server.tls_cert_file is None  # type: ignore[attr-defined]
    assert cfg.server.tls_key_file is None  # type: ignore[attr-defined]
    assert cfg.cluster.previous_tokens == []  # type: ignore[attr-defined]


def test_a_key_of_another_certificate_is_an_error_on_the_key(tmp_path: Path) -> None:
    f = _files(tmp_path)
    error = _error(
        tmp_path,
        f"server:\n  tls_cert_file: {f['cert']}\n  tls_key_file: {f['other_key']}\n",
    )
    assert _keys(error) == ["server.tls_key_file"]
    assert "does not match" in str(error)


def test_a_missing_key_file_is_an_error_on_the_key(tmp_path: Path) -> None:
    f = _files(tmp_path)
    error = _error(
        tmp_path,
        f"server:\n  tls_cert_file: {f['cert']}\n  tls_key_file: {tmp_path / 'gone.pem'}\n",
    )
    assert _keys(error) == ["server.tls_key_file"]
    assert "cannot be read" in str(error)


@pytest.mark.parametrize(
    ("given", "missing"),
    [("tls_cert_file", "server.tls_key_file"), ("tls_key_file", "server.tls_cert_file")],
)
def test_one_of_the_pair_alone_is_an_error_naming_the_other(
    tmp_path: Path, given: str, missing: str
) -> None:
    f = _files(tmp_path)
    path = f["cert"] if given == "tls_cert_file" else f["key"]
    error = _error(tmp_path, f"server:\n  {given}: {path}\n")
    assert _keys(error) == [missing]


def test_a_file_that_is_no_certificate_is_an_error_on_the_certificate(tmp_path: Path) -> None:
    f = _files(tmp_path)
    error = _error(tmp_path, f"server:\n  tls_cert_file: {f['junk']}\n  tls_key_file: {f['key']}\n")
    assert _keys(error) == ["server.tls_cert_file"]


def test_a_client_ca_without_a_server_certificate_is_an_error(tmp_path: Path) -> None:
    f = _files(tmp_path)
    error = _error(tmp_path, f"server:\n  tls_client_ca_file: {f['ca']}\n")
    assert _keys(error) == ["server.tls_client_ca_file"]


def test_a_cluster_ca_file_without_a_certificate_is_an_error(tmp_path: Path) -> None:
    f = _files(tmp_path)
    error = _error(tmp_path, f"cluster:\n  tls_ca_file: {f['junk']}\n")
    assert _keys(error) == ["cluster.tls_ca_file"]


def test_a_mismatched_cluster_client_pair_is_an_error_on_its_key(tmp_path: Path) -> None:
    f = _files(tmp_path)
    error = _error(
        tmp_path,
        f"cluster:\n  tls_client_cert_file: {f['cert']}\n  tls_client_key_file: {f['other_key']}\n",
    )
    assert _keys(error) == ["cluster.tls_client_key_file"]


def test_previous_tokens_are_redacted_and_may_not_reuse_an_auth_key(tmp_path: Path) -> None:
    cfg = _load(
        tmp_path,
        """
        cluster:
          role: master
          token: new-token-0123456789
          previous_tokens: [old-token-0123456789]
        """,
    )
    dumped = config_to_dict(cfg)  # type: ignore[arg-type]
    assert dumped["cluster"]["previous_tokens"] == ["***"]
    assert "old-token" not in str(dumped)
    error = _error(
        tmp_path,
        """
        auth:
          inference_keys: [shared-secret-0123456789]
        cluster:
          previous_tokens: [shared-secret-0123456789]
        """,
    )
    assert _keys(error) == ["cluster.previous_tokens[0]"]
    assert "shared-secret" not in str(error)
