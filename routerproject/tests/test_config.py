from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from pydantic import ValidationError

from routerproject.config import (
    ClusterConfig,
    ConfigError,
    RouterConfig,
    config_to_dict,
    load_config,
    resolve_config_path,
)

REPO_DIR = Path(__file__).resolve().parents[2]


def write_config(directory: Path, text: str, *, kcpps: bool = True) -> Path:
    """Write ``text`` (dedented; its first line is line 1) as ``directory/config.yaml``."""
    if kcpps:
        (directory / "kcpps").mkdir(exist_ok=True)
    path = directory / "config.yaml"
    path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return path


def load(directory: Path, text: str, environ: dict[str, str] | None = None) -> RouterConfig:
    return load_config(write_config(directory, text), environ=environ or {})


def load_error(directory: Path, text: str, environ: dict[str, str] | None = None) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load(directory, text, environ)
    return info.value


def problem(error: ConfigError, key: str) -> ConfigError:
    matches = [p for p in error.problems if p.key == key]
    assert matches, f"no problem for {key}; got:\n{error}"
    return matches[0]


def assert_only_problem(error: ConfigError, key: str, line: int | None) -> ConfigError:
    assert [(p.key, p.line) for p in error.problems] == [(key, line)], str(error)
    return error


# ---------------------------------------------------------------------- defaults


def test_an_empty_file_gives_every_default(tmp_path: Path) -> None:
    cfg = load(tmp_path, "")

    assert cfg.server.bind == "127.0.0.1:8080"
    assert (cfg.server.host, cfg.server.port) == ("127.0.0.1", 8080)
    assert cfg.server.allowed_cidrs == []
    assert cfg.server.max_body_bytes == 33554432
    assert cfg.server.shutdown_grace == 10.0
    assert cfg.auth.inference_keys == [] and cfg.auth.admin_keys == []
    assert cfg.security.profile == "secure"
    assert cfg.cluster.role == "standalone"
    assert cfg.cluster.node_id == "local"
    assert cfg.cluster.token == ""
    assert (cfg.cluster.public_url, cfg.cluster.master_url) == ("", "")
    assert cfg.cluster.slave_urls == []
    assert cfg.cluster.store_dir == (tmp_path / "router-store").resolve()
    assert cfg.cluster.sync_interval == 60.0
    assert cfg.cluster.health_interval == 15.0
    assert cfg.cluster.control_timeout == 30.0
    assert cfg.cluster.health_timeout == 3.0
    assert cfg.cluster.sync_concurrency == 4
    assert cfg.cluster.routing_cache_affinity is False
    assert cfg.cluster.routing_affinity_entries == 10000
    assert cfg.cluster.routing_affinity_ttl == 600.0
    assert cfg.cluster.lending_status_timeout == 0.5
    assert cfg.cluster.lending_reprobe_interval == 1.0
    assert cfg.cluster.lending_reprobe_timeout == 10.0
    assert cfg.cluster.lending_stall_check_interval == 5.0
    assert cfg.cluster.lending_event_timeout == 10.0
    assert cfg.cluster.lending_event_poll == "all"
    assert cfg.cluster.lending_file_values() == {}
    assert cfg.models.config_dir == (tmp_path / "kcpps").resolve()
    assert cfg.models.startup_model == "" and cfg.models.shared_dir == ""
    assert (cfg.models.hash_workers, cfg.models.concurrent_asset_transfers) == (1, 2)
    assert cfg.models.file_roots == []
    assert cfg.backend.mode == "kobold"
    assert (cfg.backend.load_timeout, cfg.backend.request_timeout) == (600.0, 1800.0)
    assert cfg.backend.host == "127.0.0.1"
    for family in (cfg.llama, cfg.sdcpp, cfg.whispercpp, cfg.kobold, cfg.vllm):
        assert (family.binary_path, family.backend_url, family.extra_args) == ("", "", [])
    assert cfg.database.url == ""
    assert cfg.analytics.enabled is True
    assert cfg.analytics.retention == 720 * 3600.0
    assert cfg.source_path == tmp_path / "config.yaml"


def test_empty_sections_and_empty_values_mean_defaults(tmp_path: Path) -> None:
    cfg = load(
        tmp_path,
        """
        server:
        cluster:
          token:
          node_id:
        analytics: {}
        """,
    )
    assert cfg.server.bind == "127.0.0.1:8080"
    assert cfg.cluster.token == "" and cfg.cluster.node_id == "local"
    assert cfg.analytics.enabled is True


def test_the_built_in_default_is_a_standalone_sim_node_on_loopback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = load_config(None, environ={})
    assert cfg.source_path is None
    assert cfg.cluster.role == "standalone"
    assert cfg.backend.mode == "sim"
    assert (cfg.server.host, cfg.server.port) == ("127.0.0.1", 8080)
    assert cfg.models.config_dir == REPO_DIR / "demo" / "kcpps"
    assert cfg.cluster.store_dir == (tmp_path / "router-store").resolve()


def test_the_demo_standalone_config_loads(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = load_config(REPO_DIR / "demo" / "config.standalone.yaml", environ={})
    assert cfg.cluster.role == "standalone"
    assert cfg.backend.mode == "sim"
    assert cfg.server.bind == "127.0.0.1:8080"
    assert cfg.models.config_dir == REPO_DIR / "demo" / "kcpps"
    assert cfg.cluster.store_dir == REPO_DIR / "router-store"


def test_the_model_is_frozen(tmp_path: Path) -> None:
    cfg = load(tmp_path, "")
    with pytest.raises(ValidationError):
        cfg.cluster.role = "master"


# ------------------------------------------------------------------ file handling


def test_relative_paths_resolve_against_the_config_files_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf_dir = tmp_path / "etc"
    conf_dir.mkdir()
    (tmp_path / "models-conf").mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    path = write_config(
        conf_dir,
        """
        cluster:
          store_dir: ../state
        models:
          config_dir: ../models-conf
          shared_dir: shared
          file_roots: [weights, /abs/weights]
        database:
          url: sqlite:///db/router.sqlite3
        """,
        kcpps=False,
    )
    cfg = load_config(path, environ={})
    assert cfg.cluster.store_dir == (tmp_path / "state").resolve()
    assert cfg.models.config_dir == (tmp_path / "models-conf").resolve()
    assert cfg.models.shared_dir == str((conf_dir / "shared").resolve())
    assert cfg.models.file_roots == [(conf_dir / "weights").resolve(), Path("/abs/weights")]
    assert cfg.database.url == f"sqlite:///{(conf_dir / 'db' / 'router.sqlite3').resolve()}"


def test_the_shared_dir_defaults_to_model_assets_in_the_store(tmp_path: Path) -> None:
    cfg = load(tmp_path, "")
    assert cfg.shared_dir_path == cfg.cluster.store_dir / "model-assets"


def test_a_missing_config_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml", environ={})


def test_a_yaml_syntax_error_names_its_line(tmp_path: Path) -> None:
    error = load_error(
        tmp_path,
        """
        server:
          bind: 127.0.0.1:8080
          allowed_cidrs: [10.0.0.0/8
        cluster:
          role: master
        """,
    )
    assert error.message.startswith("invalid YAML")
    assert error.line == 4
    assert str(error).startswith(f"{tmp_path / 'config.yaml'}:4: invalid YAML")


def test_a_bad_indentation_names_its_line(tmp_path: Path) -> None:
    error = load_error(tmp_path, "server:\n  bind: 127.0.0.1:8080\n    port: 2\n")
    assert error.message.startswith("invalid YAML")
    assert error.line == 3


def test_a_top_level_that_is_not_a_mapping_is_an_error(tmp_path: Path) -> None:
    error = load_error(tmp_path, "- server\n- cluster\n")
    assert "mapping" in error.message
    assert error.line == 1


def test_a_duplicated_key_is_an_error_at_its_second_line(tmp_path: Path) -> None:
    error = load_error(tmp_path, "cluster:\n  role: master\n  role: slave\n")
    assert (error.key, error.line) == ("cluster.role", 3)
    assert "duplicate" in error.message


def test_an_unknown_top_level_key_is_an_error(tmp_path: Path) -> None:
    error = load_error(tmp_path, "server: {}\nbackendd:\n  mode: sim\n")
    assert_only_problem(error, "backendd", 2)
    assert "unknown key" in error.message
    assert "'backend'" in error.message


def test_source_path_is_not_a_yaml_key(tmp_path: Path) -> None:
    error = load_error(tmp_path, "source_path: /etc/x.yaml\n")
    assert_only_problem(error, "source_path", 1)


def test_an_unknown_nested_key_is_an_error(tmp_path: Path) -> None:
    error = load_error(tmp_path, "llama:\n  binary_path: /bin/llama\n  threads: 8\n")
    assert_only_problem(error, "llama.threads", 3)
    assert error.message.startswith("unknown key")


def test_a_section_that_is_not_a_mapping_is_an_error(tmp_path: Path) -> None:
    error = load_error(tmp_path, "server: 5\n")
    assert_only_problem(error, "server", 1)
    assert "mapping" in error.message


@pytest.mark.parametrize(
    ("text", "key", "fragment"),
    [
        ("server:\n  max_body_bytes: '1024'\n", "server.max_body_bytes", "whole number"),
        ("server:\n  max_body_bytes: true\n", "server.max_body_bytes", "whole number"),
        ("cluster:\n  node_id: 5\n", "cluster.node_id", "string"),
        ("cluster:\n  slave_urls: http://10.0.0.2:8080\n", "cluster.slave_urls", "list"),
        ("analytics:\n  enabled: 'maybe'\n", "analytics.enabled", "true or false"),
        ("auth:\n  admin_keys: [[a]]\n", "auth.admin_keys[0]", "string"),
        ("cluster:\n  routing_cache_affinity: 'yes'\n", "cluster.routing_cache_affinity", "true"),
        ("cluster:\n  routing_affinity_entries: 0\n", "cluster.routing_affinity_entries", "1"),
        ("cluster:\n  routing_affinity_ttl: 0s\n", "cluster.routing_affinity_ttl", "greater"),
        ("cluster:\n  lending_event_timeout: 0s\n", "cluster.lending_event_timeout", "greater"),
        (
            "cluster:\n  lending_event_poll: some\n",
            "cluster.lending_event_poll",
            "must be one of all, linked (got 'some')",
        ),
    ],
)
def test_a_wrong_type_is_an_error(tmp_path: Path, text: str, key: str, fragment: str) -> None:
    error = load_error(tmp_path, text)
    assert_only_problem(error, key, 2)
    assert fragment in error.message


def test_every_problem_is_reported_in_file_order_one_per_line(tmp_path: Path) -> None:
    error = load_error(
        tmp_path,
        """
        cluster:
          sync_concurrency: 0
          role: boss
        server:
          bind: nonsense
        """,
    )
    assert [(p.key, p.line) for p in error.problems] == [
        ("cluster.sync_concurrency", 2),
        ("cluster.role", 3),
        ("server.bind", 5),
    ]
    assert (error.key, error.line) == ("cluster.sync_concurrency", 2)
    assert len(str(error).splitlines()) == 3


def test_the_message_names_file_line_key_and_value(tmp_path: Path) -> None:
    error = load_error(tmp_path, "cluster:\n  node_id: n1\n  role: boss\n")
    assert str(error) == (
        f"{tmp_path / 'config.yaml'}:3: cluster.role: "
        "must be one of standalone, master, slave (got 'boss')"
    )


def test_config_error_formats_with_and_without_a_location() -> None:
    assert str(ConfigError("bad", key="a.b", line=7, path=Path("config.yaml"))) == (
        "config.yaml:7: a.b: bad"
    )
    assert str(ConfigError("bad", key="a.b", path=Path("config.yaml"))) == "config.yaml: a.b: bad"
    assert str(ConfigError("bad", key="a.b")) == "a.b: bad"
    assert str(ConfigError("bad")) == "bad"


# ------------------------------------------------------------------------ server


def test_a_bracketed_ipv6_bind_is_split_into_host_and_port(tmp_path: Path) -> None:
    cfg = load(tmp_path, "server:\n  bind: '[::1]:9000'\n")
    assert (cfg.server.host, cfg.server.port) == ("::1", 9000)


@pytest.mark.parametrize(
    "bind",
    [
        "localhost",
        "127.0.0.1",
        "127.0.0.1:0",
        "127.0.0.1:65536",
        "127.0.0.1:http",
        "::1:8080",
        "[nothost]:80",
        "[::1]8080",
        "bad host:80",
        "",
    ],
)
def test_a_bind_that_is_not_host_and_port_is_an_error(tmp_path: Path, bind: str) -> None:
    error = load_error(tmp_path, f"server:\n  bind: '{bind}'\n")
    assert_only_problem(error, "server.bind", 2)


def test_allowed_cidrs_must_each_be_a_cidr(tmp_path: Path) -> None:
    error = load_error(
        tmp_path,
        """
        server:
          allowed_cidrs:
            - 10.0.0.0/8
            - 192.168.1.7
            - fd00::/8
            - 10.0.0.0/33
        """,
    )
    assert [(p.key, p.line) for p in error.problems] == [
        ("server.allowed_cidrs[1]", 4),
        ("server.allowed_cidrs[3]", 6),
    ]


def test_allowed_cidrs_are_exposed_as_networks(tmp_path: Path) -> None:
    cfg = load(tmp_path, "server:\n  allowed_cidrs: [10.1.2.3/8, 'fd00::/8']\n")
    assert [str(n) for n in cfg.server.allowed_networks] == ["10.0.0.0/8", "fd00::/8"]


@pytest.mark.parametrize(
    ("value", "ok"), [(0, False), (1, True), (2**31, True), (2**31 + 1, False)]
)
def test_max_body_bytes_is_between_one_and_two_gibibytes(
    tmp_path: Path, value: int, ok: bool
) -> None:
    text = f"server:\n  max_body_bytes: {value}\n"
    if ok:
        assert load(tmp_path, text).server.max_body_bytes == value
    else:
        assert_only_problem(load_error(tmp_path, text), "server.max_body_bytes", 2)


def test_shutdown_grace_may_be_zero_but_not_a_bare_number(tmp_path: Path) -> None:
    assert load(tmp_path, "server:\n  shutdown_grace: 0s\n").server.shutdown_grace == 0.0
    error = load_error(tmp_path, "server:\n  shutdown_grace: 5\n")
    assert_only_problem(error, "server.shutdown_grace", 2)


# -------------------------------------------------------------- auth and security


@pytest.mark.parametrize(
    "value", ["change-me", " Change-Me ", "CHANGEME", "replace-me", "Replace_Me"]
)
def test_a_placeholder_key_is_an_error(tmp_path: Path, value: str) -> None:
    error = load_error(tmp_path, f"auth:\n  inference_keys:\n    - real-key\n    - '{value}'\n")
    assert_only_problem(error, "auth.inference_keys[1]", 4)
    assert "placeholder" in error.message


def test_a_blank_key_is_an_error(tmp_path: Path) -> None:
    error = load_error(tmp_path, "auth:\n  admin_keys: ['  ']\n")
    assert_only_problem(error, "auth.admin_keys[0]", 2)


def test_a_duplicate_key_is_an_error_at_the_second_occurrence(tmp_path: Path) -> None:
    error = load_error(tmp_path, "auth:\n  admin_keys:\n    - k1\n    - k1\n")
    assert_only_problem(error, "auth.admin_keys[1]", 4)
    assert "duplicate of auth.admin_keys[0]" in error.message


def test_one_key_in_both_roles_is_an_error(tmp_path: Path) -> None:
    error = load_error(tmp_path, "auth:\n  inference_keys: [shared]\n  admin_keys: [shared]\n")
    assert_only_problem(error, "auth.admin_keys[0]", 3)


def test_the_secure_profile_needs_both_key_lists_off_loopback(tmp_path: Path) -> None:
    error = load_error(
        tmp_path,
        """
        server:
          bind: 0.0.0.0:8080
        auth:
          inference_keys: []
        """,
    )
    # admin_keys is absent, so it is reported at its section's line.
    assert [(p.key, p.line) for p in error.problems] == [
        ("auth.admin_keys", 3),
        ("auth.inference_keys", 4),
    ]
    assert "trusted_lan" in problem(error, "auth.admin_keys").message


def test_the_secure_profile_error_has_no_line_without_an_auth_section(tmp_path: Path) -> None:
    error = load_error(tmp_path, "server:\n  bind: 10.0.0.5:8080\n")
    assert {(p.key, p.line) for p in error.problems} == {
        ("auth.inference_keys", None),
        ("auth.admin_keys", None),
    }


@pytest.mark.parametrize("bind", ["127.0.0.1:8080", "127.9.9.9:80", "localhost:8080", "[::1]:80"])
def test_loopback_binds_need_no_keys(tmp_path: Path, bind: str) -> None:
    assert load(tmp_path, f"server:\n  bind: '{bind}'\n").server.bind == bind


def test_a_non_loopback_bind_is_fine_with_keys_or_the_trusted_lan_profile(tmp_path: Path) -> None:
    with_keys = load(
        tmp_path,
        "server:\n  bind: 0.0.0.0:8080\nauth:\n  inference_keys: [i1]\n  admin_keys: [a1]\n",
    )
    assert with_keys.server.host == "0.0.0.0"
    trusted = load(tmp_path, "server:\n  bind: 0.0.0.0:8080\nsecurity:\n  profile: trusted_lan\n")
    assert trusted.security.profile == "trusted_lan"


def test_an_unknown_security_profile_is_an_error(tmp_path: Path) -> None:
    error = load_error(tmp_path, "security:\n  profile: open\n")
    assert_only_problem(error, "security.profile", 2)
    assert "secure, trusted_lan" in error.message


# ----------------------------------------------------------------------- cluster


def test_a_master_with_a_token_loads(tmp_path: Path) -> None:
    cfg = load(
        tmp_path,
        """
        cluster:
          role: master
          node_id: ' master-1 '
          token: s3cret-token
          slave_urls: [http://10.0.0.2:8080, https://gpu.example.org/]
          sync_interval: 1.5s
          health_interval: 1h30m
          control_timeout: 250ms
          sync_concurrency: 128
        """,
    )
    assert cfg.cluster.role == "master"
    assert cfg.cluster.node_id == "master-1"
    assert cfg.cluster.slave_urls == ["http://10.0.0.2:8080", "https://gpu.example.org/"]
    assert cfg.cluster.sync_interval == 1.5
    assert cfg.cluster.health_interval == 5400.0
    assert cfg.cluster.control_timeout == 0.25


def test_the_lending_timers_are_durations_and_no_lending_settings(tmp_path: Path) -> None:
    cfg = load(
        tmp_path,
        """
        cluster:
          lending_status_timeout: 250ms
          lending_reprobe_interval: 1.5s
          lending_reprobe_timeout: 1m
          lending_stall_check_interval: 2s
          lending_event_timeout: 3s
          lending_event_poll: linked
        """,
    )
    timers = cfg.cluster
    assert timers.lending_status_timeout == 0.25
    assert timers.lending_reprobe_interval == 1.5
    assert timers.lending_reprobe_timeout == 60.0
    assert timers.lending_stall_check_interval == 2.0
    assert timers.lending_event_timeout == 3.0
    assert timers.lending_event_poll == "linked"
    # Each node runs its own: the master pushes none of them, nor do they change the fingerprint.
    assert timers.lending_file_values() == {}


@pytest.mark.parametrize("role", ["master", "slave"])
def test_a_token_is_required_unless_standalone(tmp_path: Path, role: str) -> None:
    urls = "  master_url: http://m:8080\n  public_url: http://s:8080\n" if role == "slave" else ""
    error = load_error(tmp_path, f"cluster:\n  role: {role}\n{urls}")
    assert_only_problem(error, "cluster.token", 1)
    assert role in error.message


def test_a_blank_token_counts_as_missing(tmp_path: Path) -> None:
    error = load_error(tmp_path, "cluster:\n  role: master\n  token: '   '\n")
    assert_only_problem(error, "cluster.token", 3)


def test_a_placeholder_token_is_an_error_even_for_standalone(tmp_path: Path) -> None:
    error = load_error(tmp_path, "cluster:\n  token: ' CHANGE-ME '\n")
    assert_only_problem(error, "cluster.token", 2)
    assert "CHANGE-ME" not in str(error)


@pytest.mark.parametrize("section", ["inference_keys", "admin_keys"])
def test_the_token_must_not_reuse_an_api_key(tmp_path: Path, section: str) -> None:
    error = load_error(
        tmp_path,
        f"auth:\n  {section}: [shared-secret]\ncluster:\n  role: master\n  token: shared-secret\n",
    )
    assert_only_problem(error, "cluster.token", 5)
    assert f"auth.{section}" in error.message


def test_a_slave_with_only_node_id_and_token_fails_for_both_urls(tmp_path: Path) -> None:
    error = load_error(tmp_path, "cluster:\n  role: slave\n  node_id: s1\n  token: tok\n")
    assert {(p.key, p.line) for p in error.problems} == {
        ("cluster.master_url", 1),
        ("cluster.public_url", 1),
    }


def test_a_complete_slave_loads(tmp_path: Path) -> None:
    cfg = load(
        tmp_path,
        """
        cluster:
          role: slave
          node_id: gpu-2
          token: tok
          master_url: http://10.0.0.1:8080
          public_url: http://10.0.0.2:8080
        """,
    )
    assert (cfg.cluster.master_url, cfg.cluster.public_url) == (
        "http://10.0.0.1:8080",
        "http://10.0.0.2:8080",
    )


@pytest.mark.parametrize(
    "url",
    [
        "not a url",
        "10.0.0.2:8080",
        "/relative",
        "ftp://host/",
        "http://",
        "http://:8080",
        "http://user:hunter2@host:8080",
        "http://host:99999",
    ],
)
def test_urls_must_be_absolute_http_without_userinfo(tmp_path: Path, url: str) -> None:
    error = load_error(
        tmp_path,
        f"""
        cluster:
          public_url: '{url}'
          master_url: '{url}'
          slave_urls:
            - http://ok:8080
            - '{url}'
        vllm:
          backend_url: '{url}'
        """,
    )
    assert [(p.key, p.line) for p in error.problems] == [
        ("cluster.public_url", 2),
        ("cluster.master_url", 3),
        ("cluster.slave_urls[1]", 6),
        ("vllm.backend_url", 8),
    ]
    assert "hunter2" not in str(error)


def test_a_repeated_slave_url_is_an_error(tmp_path: Path) -> None:
    error = load_error(tmp_path, "cluster:\n  slave_urls:\n    - http://a:1\n    - http://a:1\n")
    assert_only_problem(error, "cluster.slave_urls[1]", 4)


@pytest.mark.parametrize("node_id", ["''", "'   '", "'a b'", "a/b", "'n\u00f6de'", "x" * 65])
def test_a_bad_node_id_is_an_error(tmp_path: Path, node_id: str) -> None:
    error = load_error(tmp_path, f"cluster:\n  node_id: {node_id}\n")
    assert_only_problem(error, "cluster.node_id", 2)


def test_a_node_id_may_use_letters_digits_dots_dashes_and_underscores(tmp_path: Path) -> None:
    node_id = "Node_1.gpu-a" + "x" * 52
    assert load(tmp_path, f"cluster:\n  node_id: {node_id}\n").cluster.node_id == node_id


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("30", "use a duration like 500ms, 1.5s, 2m"),
        ("1.5", "use a duration like 500ms, 1.5s, 2m"),
        ("30d", 'invalid duration "30d"'),
        ("0s", "greater than 0"),
        ("'0'", "greater than 0"),
        ("true", "use a duration like"),
    ],
)
def test_cluster_durations_must_be_positive_duration_strings(
    tmp_path: Path, value: str, fragment: str
) -> None:
    error = load_error(tmp_path, f"cluster:\n  role: standalone\n  health_interval: {value}\n")
    assert_only_problem(error, "cluster.health_interval", 3)
    assert fragment in error.message


@pytest.mark.parametrize("value", [0, 129])
def test_sync_concurrency_is_between_1_and_128(tmp_path: Path, value: int) -> None:
    error = load_error(tmp_path, f"cluster:\n  sync_concurrency: {value}\n")
    assert_only_problem(error, "cluster.sync_concurrency", 2)


def test_an_empty_store_dir_is_an_error(tmp_path: Path) -> None:
    error = load_error(tmp_path, "cluster:\n  store_dir: ''\n")
    assert_only_problem(error, "cluster.store_dir", 2)


# ------------------------------------------------------------------ lending keys


def test_lending_keys_in_the_file_are_canonicalised(tmp_path: Path) -> None:
    cfg = load(
        tmp_path,
        """
        cluster:
          offload_hold_for_faster_helper: no
          scheduling_refresh_interval: 60s
          offload_restore_delay: 1500ms
          scheduling_backend_depth: 3
          scheduling_min_samples: ' 40 '
          offload_decisions_retention: 720h
          offload_lent_stall_timeout: 180s
        """,
    )
    assert cfg.lending_file_values() == {
        "scheduling_refresh_interval": "1m0s",
        "scheduling_min_samples": "40",
        "scheduling_backend_depth": "3",
        "offload_restore_delay": "1.5s",
        "offload_hold_for_faster_helper": "false",
        "offload_decisions_retention": "720h0m0s",
        "offload_lent_stall_timeout": "3m0s",
    }
    assert list(cfg.cluster.lending_file_values()) == [
        "scheduling_refresh_interval",
        "scheduling_min_samples",
        "scheduling_backend_depth",
        "offload_restore_delay",
        "offload_hold_for_faster_helper",
        "offload_decisions_retention",
        "offload_lent_stall_timeout",
    ]


def test_a_yaml_true_and_a_go_bool_string_are_both_accepted(tmp_path: Path) -> None:
    assert load(
        tmp_path, "cluster:\n  offload_hold_for_faster_helper: true\n"
    ).lending_file_values() == {"offload_hold_for_faster_helper": "true"}
    assert load(
        tmp_path, "cluster:\n  offload_hold_for_faster_helper: 'F'\n"
    ).lending_file_values() == {"offload_hold_for_faster_helper": "false"}


@pytest.mark.parametrize(
    ("key", "value", "fragment"),
    [
        ("scheduling_backend_depth", "0", "between 1 and 64"),
        ("scheduling_min_samples", "2.5", "whole number"),
        ("scheduling_grant_ttl", "30", "invalid duration"),
        ("scheduling_sample_window", "30d", "invalid duration"),
        ("offload_probe_idle", "0s", "greater than 0"),
        ("offload_hold_for_faster_helper", "sometimes", "true or false"),
        ("offload_faster_helper_slots", "[1]", "string, number or boolean"),
    ],
)
def test_a_bad_lending_value_names_its_cluster_key(
    tmp_path: Path, key: str, value: str, fragment: str
) -> None:
    error = load_error(tmp_path, f"cluster:\n  node_id: n1\n  {key}: {value}\n")
    assert_only_problem(error, f"cluster.{key}", 3)
    assert fragment in error.message


# ------------------------------------------------------------------------ models


def test_a_missing_config_dir_is_an_error_at_its_line(tmp_path: Path) -> None:
    error = load_error(tmp_path, "models:\n  hash_workers: 2\n  config_dir: ./missing\n")
    assert_only_problem(error, "models.config_dir", 3)
    assert "does not exist" in error.message


def test_a_config_dir_that_is_a_file_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "file.txt").write_text("x")
    error = load_error(tmp_path, "models:\n  config_dir: file.txt\n")
    assert_only_problem(error, "models.config_dir", 2)
    assert "not a directory" in error.message


def test_a_missing_default_config_dir_is_reported_at_the_section_or_without_a_line(
    tmp_path: Path,
) -> None:
    path = write_config(tmp_path, "server: {}\nmodels:\n  hash_workers: 1\n", kcpps=False)
    with pytest.raises(ConfigError) as info:
        load_config(path, environ={})
    assert_only_problem(info.value, "models.config_dir", 2)
    path.write_text("server: {}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path, environ={})
    assert_only_problem(info.value, "models.config_dir", None)


@pytest.mark.parametrize("key", ["hash_workers", "concurrent_asset_transfers"])
def test_worker_counts_must_be_at_least_one(tmp_path: Path, key: str) -> None:
    error = load_error(tmp_path, f"models:\n  {key}: 0\n")
    assert_only_problem(error, f"models.{key}", 2)
    assert "at least 1" in error.message


def test_file_roots_must_not_contain_empty_entries(tmp_path: Path) -> None:
    error = load_error(tmp_path, "models:\n  file_roots:\n    - ./models\n    - ''\n")
    assert_only_problem(error, "models.file_roots[1]", 4)


# ----------------------------------------------------------- backend and families


def test_an_unknown_backend_mode_is_an_error(tmp_path: Path) -> None:
    error = load_error(tmp_path, "backend:\n  mode: ollama\n")
    assert_only_problem(error, "backend.mode", 2)
    assert "kobold, llama_sdcpp, vllm, sim" in error.message


def test_backend_settings_load(tmp_path: Path) -> None:
    cfg = load(
        tmp_path,
        """
        backend:
          mode: llama_sdcpp
          load_timeout: 90s
          request_timeout: 2m
          host: 0.0.0.0
        """,
    )
    assert (cfg.backend.mode, cfg.backend.load_timeout) == ("llama_sdcpp", 90.0)
    assert (cfg.backend.request_timeout, cfg.backend.host) == (120.0, "0.0.0.0")


def test_a_blank_backend_host_is_an_error(tmp_path: Path) -> None:
    assert_only_problem(load_error(tmp_path, "backend:\n  host: ' '\n"), "backend.host", 2)


def test_family_sections_keep_binary_url_and_args(tmp_path: Path) -> None:
    cfg = load(
        tmp_path,
        """
        llama:
          binary_path: llama-server
          extra_args: [--threads, 8, --flash-attn]
        whispercpp:
          backend_url: http://127.0.0.1:9100
        """,
    )
    assert cfg.llama.binary_path == "llama-server"
    assert cfg.llama.extra_args == ["--threads", "8", "--flash-attn"]
    assert cfg.whispercpp.backend_url == "http://127.0.0.1:9100"


# ---------------------------------------------------------------------- database


def test_the_database_defaults_to_sqlite_in_the_store_dir(tmp_path: Path) -> None:
    cfg = load(tmp_path, "cluster:\n  store_dir: state\n")
    expected = f"sqlite:///{(tmp_path / 'state').resolve()}/router.sqlite3"
    assert cfg.database_url({}) == expected
    assert cfg.database_url({}).startswith("sqlite:////")


def test_the_configured_database_url_beats_the_default_and_the_env_beats_both(
    tmp_path: Path,
) -> None:
    cfg = load(tmp_path, "database:\n  url: postgresql://router@db.internal/router\n")
    assert cfg.database_url({}) == "postgresql://router@db.internal/router"
    env = {"DATABASE_URL": "postgres://other@db2/router"}
    assert cfg.database_url(env) == "postgres://other@db2/router"


def test_an_absolute_sqlite_url_is_kept(tmp_path: Path) -> None:
    cfg = load(tmp_path, "database:\n  url: sqlite:////var/lib/router/db.sqlite3\n")
    assert cfg.database.url == "sqlite:////var/lib/router/db.sqlite3"


@pytest.mark.parametrize("url", ["mysql://u@h/db", "router.sqlite3", "sqlite://", "postgres://"])
def test_an_unsupported_database_url_is_an_error(tmp_path: Path, url: str) -> None:
    error = load_error(tmp_path, f"database:\n  url: '{url}'\n")
    assert_only_problem(error, "database.url", 2)


def test_an_unsupported_database_url_in_the_environment_is_an_error(tmp_path: Path) -> None:
    cfg = load(tmp_path, "")
    with pytest.raises(ConfigError) as info:
        cfg.database_url({"DATABASE_URL": "mysql://u:pw@h/db"})
    assert info.value.key == "DATABASE_URL"
    assert "pw" not in str(info.value)
    error = load_error(tmp_path, "", environ={"DATABASE_URL": "oracle://x"})
    assert error.key == "DATABASE_URL"


# ----------------------------------------------------------------------- analytics


def test_analytics_settings_load(tmp_path: Path) -> None:
    cfg = load(tmp_path, "analytics:\n  enabled: false\n  retention: 24h\n")
    assert (cfg.analytics.enabled, cfg.analytics.retention) == (False, 86400.0)


# ------------------------------------------------------------- token from the env


def test_the_token_env_var_replaces_the_configured_token(tmp_path: Path) -> None:
    cfg = load(
        tmp_path,
        "cluster:\n  role: master\n  token: from-file\n",
        environ={"ROUTER_CLUSTER_TOKEN": "from-env"},
    )
    assert cfg.cluster.token == "from-env"


def test_the_token_env_var_satisfies_a_master_without_a_token_in_the_file(tmp_path: Path) -> None:
    cfg = load(tmp_path, "cluster:\n  role: master\n", environ={"ROUTER_CLUSTER_TOKEN": "tok"})
    assert cfg.cluster.token == "tok"


def test_the_token_file_env_var_reads_one_trimmed_value(tmp_path: Path) -> None:
    secret = tmp_path / "token"
    secret.write_text("\n  file-token \n\n")
    cfg = load(
        tmp_path, "cluster:\n  role: master\n", environ={"ROUTER_CLUSTER_TOKEN_FILE": str(secret)}
    )
    assert cfg.cluster.token == "file-token"


def test_setting_both_token_env_vars_is_an_error(tmp_path: Path) -> None:
    secret = tmp_path / "token"
    secret.write_text("x")
    env = {"ROUTER_CLUSTER_TOKEN": "a", "ROUTER_CLUSTER_TOKEN_FILE": str(secret)}
    error = load_error(tmp_path, "", environ=env)
    assert error.key == "cluster.token"
    assert "not both" in error.message


@pytest.mark.parametrize(
    ("setup", "fragment"),
    [
        ("missing", "cannot be read"),
        ("directory", "not a regular file"),
        ("empty", "is empty"),
        ("two-lines", "single value"),
    ],
)
def test_a_bad_token_file_is_an_error(tmp_path: Path, setup: str, fragment: str) -> None:
    secret = tmp_path / "token"
    if setup == "directory":
        secret.mkdir()
    elif setup == "empty":
        secret.write_text("  \n")
    elif setup == "two-lines":
        secret.write_text("one\ntwo\n")
    error = load_error(tmp_path, "", environ={"ROUTER_CLUSTER_TOKEN_FILE": str(secret)})
    assert error.key == "cluster.token"
    assert fragment in error.message


def test_an_env_token_error_points_at_the_env_not_at_a_file_line(tmp_path: Path) -> None:
    error = load_error(
        tmp_path,
        "auth:\n  admin_keys: [adm]\ncluster:\n  role: master\n  token: fine\n",
        environ={"ROUTER_CLUSTER_TOKEN": "adm"},
    )
    assert_only_problem(error, "cluster.token", None)
    assert "$ROUTER_CLUSTER_TOKEN" in error.message


def test_a_placeholder_env_token_is_an_error(tmp_path: Path) -> None:
    error = load_error(tmp_path, "", environ={"ROUTER_CLUSTER_TOKEN": "replace-me"})
    assert_only_problem(error, "cluster.token", None)
    assert "placeholder" in error.message


def test_the_built_in_default_also_takes_the_env_token(tmp_path: Path) -> None:
    cfg = load_config(None, environ={"ROUTER_CLUSTER_TOKEN": "tok"})
    assert cfg.cluster.token == "tok"


# ------------------------------------------------------------ resolve_config_path


def test_an_explicit_path_wins_and_is_resolved_against_cwd(tmp_path: Path) -> None:
    write_config(tmp_path, "")
    other = tmp_path / "other.yaml"
    other.write_text("")
    env = {"ROUTER_CONFIG": str(other)}
    assert resolve_config_path("config.yaml", environ=env, cwd=tmp_path) == tmp_path / "config.yaml"


def test_the_env_var_is_used_without_an_explicit_path(tmp_path: Path) -> None:
    other = tmp_path / "other.yaml"
    other.write_text("")
    write_config(tmp_path, "")
    found = resolve_config_path(None, environ={"ROUTER_CONFIG": "other.yaml"}, cwd=tmp_path)
    assert found == other


def test_config_yaml_in_cwd_is_used_when_nothing_is_given(tmp_path: Path) -> None:
    write_config(tmp_path, "")
    assert resolve_config_path(None, environ={}, cwd=tmp_path) == tmp_path / "config.yaml"


def test_no_path_anywhere_means_the_built_in_default(tmp_path: Path) -> None:
    assert resolve_config_path(None, environ={}, cwd=tmp_path) is None


@pytest.mark.parametrize("source", ["explicit", "env"])
def test_a_named_config_that_does_not_exist_is_an_error(tmp_path: Path, source: str) -> None:
    write_config(tmp_path, "")
    explicit = "missing.yaml" if source == "explicit" else None
    env = {"ROUTER_CONFIG": "missing.yaml"} if source == "env" else {}
    with pytest.raises(ConfigError, match="does not exist") as info:
        resolve_config_path(explicit, environ=env, cwd=tmp_path)
    assert info.value.path == tmp_path / "missing.yaml"


# ------------------------------------------------------------------- diagnostics


def test_config_to_dict_is_json_with_secrets_redacted(tmp_path: Path) -> None:
    cfg = load(
        tmp_path,
        """
        auth:
          inference_keys: [inf-1, inf-2]
          admin_keys: [adm-1]
        cluster:
          role: master
          token: cluster-secret
          sync_interval: 90s
          scheduling_backend_depth: 3
        database:
          url: postgres://router:db-password@db/router
        """,
    )
    data = config_to_dict(cfg)
    text = json.dumps(data)
    for secret in ("inf-1", "adm-1", "cluster-secret", "db-password"):
        assert secret not in text
    assert data["auth"] == {
        "inference_keys": ["***", "***"],
        "admin_keys": ["***"],
        "fair_share": False,
    }
    assert data["cluster"]["token"] == "***"
    assert data["database"]["url"] == "postgres://router:***@db/router"
    assert data["cluster"]["sync_interval"] == "1m30s"
    assert data["cluster"]["scheduling_backend_depth"] == "3"
    assert "scheduling_grant_ttl" not in data["cluster"]
    assert data["cluster"]["store_dir"] == str((tmp_path / "router-store").resolve())
    assert data["source_path"] == str(tmp_path / "config.yaml")


def test_secrets_do_not_appear_in_the_model_repr(tmp_path: Path) -> None:
    cfg = load(
        tmp_path,
        "auth:\n  admin_keys: [adm-secret]\ncluster:\n  role: master\n  token: tok-secret\n",
    )
    assert "adm-secret" not in repr(cfg)
    assert "tok-secret" not in repr(cfg)


# ------------------------------------------------------------ python construction


def test_python_callers_may_give_durations_in_seconds() -> None:
    cluster = ClusterConfig(
        health_interval=0.5,
        sync_interval="2m",  # type: ignore[arg-type]
        store_dir="/tmp/store",  # type: ignore[arg-type]
    )
    assert (cluster.health_interval, cluster.sync_interval) == (0.5, 120.0)


def test_building_a_config_in_python_still_checks_cross_section_rules(tmp_path: Path) -> None:
    cfg = load(tmp_path, "")
    with pytest.raises(ValidationError, match=r"cluster\.token"):
        RouterConfig(
            server=cfg.server,
            models=cfg.models,
            cluster=ClusterConfig(role="master", store_dir=tmp_path / "store"),
        )


# ---------------------------------------------------------------------- fair share


def test_fair_share_is_off_unless_the_file_turns_it_on(tmp_path: Path) -> None:
    assert load(tmp_path, "").auth.fair_share is False
    assert load(tmp_path, "auth:\n  fair_share: true\n").auth.fair_share is True


def test_a_fair_share_that_is_not_a_boolean_is_refused_with_its_line(tmp_path: Path) -> None:
    error = load_error(tmp_path, "server:\n  bind: 127.0.0.1:8080\nauth:\n  fair_share: 'yes'\n")
    assert_only_problem(error, "auth.fair_share", 4)
