"""`manage.py init_node`: the join string, the GGUF scan and the files the command writes.

The GGUF files are real ones, written with `gguf.GGUFWriter` at run time; every config the
command writes is loaded through the node's own loaders.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from io import StringIO
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
import trustme
from django.core.management import call_command
from django.core.management.base import CommandError

from registry.hashing import FileHasher
from registry.kcpps import load_model_config
from registry.nodeinit.ggufheader import HeaderError, read_values
from registry.nodeinit.ggufscan import read_header, scan_models
from registry.nodeinit.joining import Join, JoinError, join_decode, join_encode
from registry.nodeinit.plan import default_node_id, default_public_url
from registry.nodeinit.render import DEFAULT_MAX_CONTEXT
from routerproject.config import ConfigError, RouterConfig, load_config
from tests.gguf_files import write_gguf


def init_node(*args: str) -> str:
    out = StringIO()
    call_command("init_node", *args, stdout=out)
    return out.getvalue()


def joined(output: str) -> str:
    return next(w for w in output.split() if w.startswith("rjoin1:"))


def load(path: Path) -> RouterConfig:
    return load_config(path, environ={})


# --- the join string ----------------------------------------------------------------------


def test_a_join_string_carries_the_url_token_and_ca_back_unchanged() -> None:
    join = Join("https://10.0.0.1:8443", "s3cret-token", "-----BEGIN CERTIFICATE-----\nx\n")
    text = join_encode(join)
    assert text.startswith("rjoin1:") and "=" not in text and "s3cret" not in text
    assert join_decode(text) == join
    assert join_decode(join_encode(Join("http://a:1", "t"))).ca_pem is None


def test_a_join_string_never_shows_its_token_in_repr() -> None:
    assert "s3cret" not in repr(Join("http://a:1", "s3cret"))


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("join:abc", "must start with 'rjoin1:'"),
        ("rjoin1:@@@", "is damaged"),
        ("rjoin1:" + "WzFd", "is damaged"),  # a JSON list, not an object
        (join_encode(Join("http://a:1", "")), "carries no cluster token"),
        (join_encode(Join("ftp://a:1", "t")), "url must be an absolute http:// or https:// URL"),
        ("rjoin1:" + "a" * 70_000, "is longer than"),
    ],
)
def test_a_bad_join_string_is_refused_with_why(text: str, reason: str) -> None:
    with pytest.raises(JoinError, match=re.escape(reason)):
        join_decode(text)


def test_a_join_string_whose_ca_is_not_a_certificate_is_refused() -> None:
    with pytest.raises(JoinError, match="ca is not a PEM certificate"):
        join_decode(join_encode(Join("https://a:1", "t", "not a pem")))


# --- reading headers and pairing projectors -------------------------------------------------


def write_every_kind(path: Path, endian: gguf.GGUFEndian = gguf.GGUFEndian.LITTLE) -> Path:
    """A header with a value of every kind, arrays (of strings, of arrays) among them."""
    writer = gguf.GGUFWriter(str(path), "llama", endianess=endian)
    writer.add_array("tokenizer.ggml.tokens", ["<s>", "</s>", "héllo", ""])
    writer.add_array("tokenizer.ggml.scores", [0.5, -1.0, 2.0, 0.0])
    writer.add_array("nested", [[1, 2], ["a", "b"]])
    writer.add_int8("k.int8", -5)
    writer.add_uint16("k.uint16", 65000)
    writer.add_int32("k.int32", -70000)
    writer.add_uint64("k.uint64", 2**40)
    writer.add_float64("k.float64", 0.25)
    writer.add_bool("k.bool", True)
    writer.add_context_length(131072)
    writer.add_chat_template("{% for m in messages %}{{ m.content }}{% endfor %}")
    writer.add_tensor("weight", np.zeros((8,), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("endian", [gguf.GGUFEndian.LITTLE, gguf.GGUFEndian.BIG])
def test_the_header_walk_agrees_with_the_gguf_packages_reader(
    tmp_path: Path, endian: gguf.GGUFEndian
) -> None:
    path = write_every_kind(tmp_path / "every.gguf", endian)
    ours = read_values(path, lambda key: True)
    theirs = gguf.GGUFReader(path).fields
    keys = [k for k in theirs if not k.startswith("GGUF.")]
    assert list(ours) == keys
    for key in keys:
        field = theirs[key]
        if field.types[0] == gguf.GGUFValueType.ARRAY:
            assert ours[key] is None  # skipped, not decoded
        else:
            assert ours[key] == pytest.approx(field.contents()), key
    assert ours["general.architecture"] == "llama"
    assert ours["llama.context_length"] == 131072


def test_a_header_walk_reads_only_the_keys_asked_for(tmp_path: Path) -> None:
    path = write_every_kind(tmp_path / "every.gguf")
    assert read_values(path, lambda key: key.endswith(".context_length")) == {
        "llama.context_length": 131072
    }


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda raw: b"", "cannot be read"),
        (lambda raw: b"GGML" + raw[4:], "no GGUF magic"),
        (lambda raw: raw[:4] + (1).to_bytes(4, "little") + raw[8:], "GGUF version 1 is not"),
        (lambda raw: raw[:200], "the file ends inside its header"),
    ],
)
def test_a_damaged_header_is_refused_with_why(tmp_path: Path, damage: Any, reason: str) -> None:
    whole = write_every_kind(tmp_path / "every.gguf").read_bytes()
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(damage(whole))
    with pytest.raises(HeaderError, match=re.escape(reason)):
        read_values(broken, lambda key: True)


def test_the_header_gives_the_context_length_and_whether_a_chat_template_is_there(
    tmp_path: Path,
) -> None:
    chat = read_header(write_gguf(tmp_path / "a.gguf", "qwen2", context=32768, template="{{x}}"))
    base = read_header(write_gguf(tmp_path / "b.gguf", "llama", context=2048))
    assert (chat.architecture, chat.context_length, chat.has_chat_template) == (
        "qwen2",
        32768,
        True,
    )
    assert (base.context_length, base.has_chat_template) == (2048, False)
    assert not chat.embeds and not base.embeds
    unpooled = write_gguf(tmp_path / "c.gguf", "qwen3", context=4096, pooling=gguf.PoolingType.NONE)
    assert not read_header(unpooled).embeds
    pooled = write_gguf(tmp_path / "d.gguf", "qwen3", context=4096, pooling=gguf.PoolingType.LAST)
    assert read_header(pooled).embeds


def test_files_that_are_not_text_models_are_skipped_with_the_reason(tmp_path: Path) -> None:
    (tmp_path / "broken.gguf").write_bytes(b"not a gguf at all")
    write_gguf(tmp_path / "unet.gguf", "sd")
    scan = scan_models(tmp_path)
    assert scan.models == []
    reasons = {path.name: reason for path, reason in scan.skipped}
    assert reasons["broken.gguf"] == "not a GGUF file (no GGUF magic)"
    assert reasons["unet.gguf"] == "no sd.context_length in its header (not a text model)"


def test_a_projector_named_for_its_model_is_paired_with_it_and_no_other(tmp_path: Path) -> None:
    write_gguf(tmp_path / "gemma-3-4b-it-Q4_K_M.gguf", "gemma3", context=8192)
    write_gguf(tmp_path / "gemma-3-4b-it-Q8_0.gguf", "gemma3", context=8192)
    write_gguf(tmp_path / "qwen2.5-7b-Q4_K_M.gguf", "qwen2", context=8192)
    write_gguf(tmp_path / "mmproj-gemma-3-4b-it-f32.gguf", "clip")
    write_gguf(tmp_path / "mmproj-gemma-3-4b-it-f16.gguf", "clip")
    pairs = {m.local_id: m.mmproj and m.mmproj.name for m in scan_models(tmp_path).models}
    assert pairs == {
        "gemma-3-4b-it-Q4_K_M": "mmproj-gemma-3-4b-it-f16.gguf",
        "gemma-3-4b-it-Q8_0": "mmproj-gemma-3-4b-it-f16.gguf",
        "qwen2.5-7b-Q4_K_M": None,
    }


def test_a_model_directory_of_one_model_takes_its_unnamed_projector(tmp_path: Path) -> None:
    write_gguf(tmp_path / "llava" / "llava-v1.6-7b.Q4_K_M.gguf", "llama", context=4096)
    write_gguf(tmp_path / "llava" / "llava-v1.6-7b.Q8_0.gguf", "llama", context=4096)
    write_gguf(tmp_path / "llava" / "projector.gguf", "clip")
    scan = scan_models(tmp_path)
    assert {m.mmproj and m.mmproj.name for m in scan.models} == {"projector.gguf"}
    assert scan.unpaired == []


def test_an_unnamed_projector_among_different_models_is_left_for_the_operator(
    tmp_path: Path,
) -> None:
    write_gguf(tmp_path / "alpha.gguf", "llama", context=4096)
    write_gguf(tmp_path / "beta.gguf", "llama", context=4096)
    write_gguf(tmp_path / "mmproj-F16.gguf", "clip")
    write_gguf(tmp_path / "other" / "gamma.gguf", "llama", context=4096)
    scan = scan_models(tmp_path)
    assert all(m.mmproj is None for m in scan.models)
    assert [p.name for p in scan.unpaired] == ["mmproj-F16.gguf"]


def test_a_split_model_is_one_config_named_without_its_part(tmp_path: Path) -> None:
    write_gguf(tmp_path / "big-00001-of-00002.gguf", "llama", context=4096)
    write_gguf(tmp_path / "big-00002-of-00002.gguf", "llama", context=4096)
    scan = scan_models(tmp_path)
    assert [(m.local_id, m.path.name) for m in scan.models] == [("big", "big-00001-of-00002.gguf")]
    assert scan.skipped == []


def test_two_files_of_one_name_get_distinct_ids(tmp_path: Path) -> None:
    write_gguf(tmp_path / "a" / "chat.gguf", "llama", context=4096)
    write_gguf(tmp_path / "b" / "chat.gguf", "llama", context=4096)
    (tmp_path / "chat.sim.json").write_text("{}")
    assert sorted(m.local_id for m in scan_models(tmp_path).models) == [
        "chat",
        "chat-2",
        "chat-3",
    ]


def test_a_wildcard_bind_names_this_machine_by_its_address_toward_the_master() -> None:
    assert default_public_url("10.1.2.3:9000") == "http://10.1.2.3:9000"
    assert default_public_url("0.0.0.0:8080", master_url="https://127.0.0.1:1") == (
        "https://127.0.0.1:8080"
    )
    assert default_node_id("gpu box.lan") == "gpu-box"


# --- the command ----------------------------------------------------------------------------


@pytest.fixture
def models_dir(tmp_path: Path) -> Path:
    root = tmp_path / "models"
    write_gguf(root / "qwen" / "qwen2.5-7b-Q4_K_M.gguf", "qwen2", context=32768, template="{{x}}")
    write_gguf(root / "qwen" / "mmproj-qwen2.5-7b-f16.gguf", "clip")
    write_gguf(root / "base-1b.gguf", "llama", context=2048)
    return root


@pytest.fixture
def no_servers(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A PATH holding only a fake llama-server: what the command finds there is known."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    server = bin_dir / "llama-server"
    server.write_text("#!/bin/sh\n")
    server.chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    return server


def test_a_master_config_loads_as_written_with_a_fresh_token_and_keys(
    tmp_path: Path, models_dir: Path, no_servers: Path
) -> None:
    out = tmp_path / "m" / "config.yaml"
    text = init_node(
        "--role",
        "master",
        "--out",
        str(out),
        "--node-id",
        "gpu-box",
        "--models-dir",
        str(models_dir),
    )
    config = load(out)
    assert config.cluster.role == "master" and config.cluster.node_id == "gpu-box"
    assert config.server.bind == "0.0.0.0:8080" and config.security.profile == "secure"
    assert len(config.cluster.token) >= 40 and config.cluster.slave_urls == []
    assert config.auth.inference_keys and config.auth.admin_keys
    assert config.backend.mode == "llama_sdcpp"
    assert config.llama.binary_path == str(no_servers)
    assert config.sdcpp.binary_path == "" and "sd-server was not on PATH" in out.read_text()
    assert config.models.config_dir == out.parent / "kcpps"
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    join = join_decode(joined(text))
    assert (join.url, join.token) == (config.cluster.public_url, config.cluster.token)
    assert "init_node --role slave --join rjoin1:" in text
    assert f"runrouter --config {out}" in text
    # Two masters never share a secret.
    other = init_node("--role", "master", "--out", str(tmp_path / "n.yaml"))
    assert join_decode(joined(other)).token != config.cluster.token


def test_each_gguf_gets_a_model_config_the_node_loads(tmp_path: Path, models_dir: Path) -> None:
    out = tmp_path / "config.yaml"
    init_node("--role", "standalone", "--out", str(out), "--models-dir", str(models_dir))
    hasher = FileHasher(None)
    configs = {
        p.stem: load_model_config(p, default_backend_mode="llama_sdcpp", hasher=hasher)
        for p in (tmp_path / "kcpps").glob("*.kcpps")
    }
    assert set(configs) == {"qwen2.5-7b-Q4_K_M", "base-1b"}
    qwen, base = configs["qwen2.5-7b-Q4_K_M"], configs["base-1b"]
    assert qwen.text_model == models_dir / "qwen" / "qwen2.5-7b-Q4_K_M.gguf"
    assert qwen.context_size == DEFAULT_MAX_CONTEXT == 8192  # capped: trained on 32768
    assert qwen.mmproj == models_dir / "qwen" / "mmproj-qwen2.5-7b-f16.gguf"
    assert qwen.has_multimodal and qwen.extra_args == ("--jinja",)
    assert (base.context_size, base.mmproj, base.extra_args) == (2048, None, ())
    assert base.missing_files == () and qwen.missing_files == ()


def test_an_embedding_gguf_is_written_as_an_embeddings_only_config(tmp_path: Path) -> None:
    models = tmp_path / "models"
    bge = models / "bge-small-f16.gguf"
    write_gguf(bge, "bert", context=512, template="{{x}}", pooling=gguf.PoolingType.CLS)
    text = init_node(
        "--role", "standalone", "--out", str(tmp_path / "c.yaml"), "--models-dir", str(models)
    )
    assert "bge-small-f16: context 512, embeddings only" in text
    path = tmp_path / "kcpps" / "bge-small-f16.kcpps"
    config = load_model_config(path, default_backend_mode="llama_sdcpp", hasher=FileHasher(None))
    assert config.has_embeddings and not config.has_llm
    assert config.raw["embeddings"] is True and config.extra_args == ()


def test_max_context_zero_keeps_the_trained_context(tmp_path: Path, models_dir: Path) -> None:
    init_node(
        "--role",
        "standalone",
        "--out",
        str(tmp_path / "c.yaml"),
        "--models-dir",
        str(models_dir),
        "--max-context",
        "0",
    )
    raw = json.loads((tmp_path / "kcpps" / "qwen2.5-7b-Q4_K_M.kcpps").read_text())
    assert raw["contextsize"] == 32768


def test_a_second_run_keeps_the_model_configs_already_there(
    tmp_path: Path, models_dir: Path
) -> None:
    out = tmp_path / "config.yaml"
    init_node("--role", "standalone", "--out", str(out), "--models-dir", str(models_dir))
    edited = tmp_path / "kcpps" / "base-1b.kcpps"
    edited.write_text(json.dumps({"model_param": "x.gguf", "contextsize": 1024}))
    write_gguf(models_dir / "new-3b.gguf", "llama", context=4096)
    text = init_node(
        "--role", "standalone", "--out", str(out), "--force", "--models-dir", str(models_dir)
    )
    assert "3 model(s) found: 1 written, 2 kept." in text
    assert json.loads(edited.read_text())["contextsize"] == 1024
    assert (tmp_path / "kcpps" / "new-3b.kcpps").exists()


def test_a_slave_takes_the_masters_url_and_token_from_the_join_string(tmp_path: Path) -> None:
    master = tmp_path / "master.yaml"
    code = joined(
        init_node("--role", "master", "--out", str(master), "--public-url", "http://10.0.0.1:8080")
    )
    out = tmp_path / "slave" / "config.yaml"
    text = init_node(
        "--role",
        "slave",
        "--join",
        code,
        "--out",
        str(out),
        "--node-id",
        "s1",
        "--public-url",
        "http://10.0.0.2:8080",
    )
    slave, boss = load(out), load(master)
    assert slave.cluster.role == "slave" and slave.cluster.master_url == "http://10.0.0.1:8080"
    assert slave.cluster.token == boss.cluster.token
    assert slave.auth.admin_keys != boss.auth.admin_keys
    assert "\n    - http://10.0.0.2:8080\n" in text
    # The printed line, added under the master's `slave_urls:`, is all the master needs.
    added = master.read_text().replace(
        "  slave_urls:\n", "  slave_urls:\n    - http://10.0.0.2:8080\n"
    )
    master.write_text(added)
    assert load(master).cluster.slave_urls == ["http://10.0.0.2:8080"]


def test_a_masters_ca_travels_in_the_join_string_to_the_slave(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    trustme.CA().cert_pem.write_to_path(str(ca))
    code = joined(
        init_node(
            "--role",
            "master",
            "--out",
            str(tmp_path / "m.yaml"),
            "--public-url",
            "https://10.0.0.1:8443",
            "--ca-file",
            str(ca),
        )
    )
    assert load(tmp_path / "m.yaml").cluster.tls_ca_file == ca
    out = tmp_path / "s" / "config.yaml"
    init_node("--role", "slave", "--join", code, "--out", str(out), "--bind", "0.0.0.0:8443")
    slave = load(out)
    assert slave.cluster.tls_ca_file == out.parent / "cluster-ca.pem"
    assert slave.cluster.tls_ca_file.read_text() == ca.read_text()
    assert slave.cluster.public_url.startswith("https://")


def test_an_existing_config_is_never_replaced_without_force(tmp_path: Path) -> None:
    out = tmp_path / "config.yaml"
    out.write_text("# the operator's\n")
    with pytest.raises(CommandError, match="exists"):
        init_node("--role", "master", "--out", str(out))
    assert out.read_text() == "# the operator's\n"
    init_node("--role", "master", "--out", str(out), "--force")
    assert load(out).cluster.role == "master"


def test_a_dry_run_writes_nothing(tmp_path: Path, models_dir: Path) -> None:
    out = tmp_path / "config.yaml"
    text = init_node(
        "--role", "master", "--out", str(out), "--models-dir", str(models_dir), "--dry-run"
    )
    assert "Would write" in text and "2 model(s) found: 2 written" in text
    assert not out.exists() and not (tmp_path / "kcpps").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--role", "master", "--join", "rjoin1:x"], "--join is for --role slave only"),
        (["--role", "slave"], "--role slave needs --join"),
        (["--role", "slave", "--join", "rjoin1:@"], "--join is damaged"),
        (["--role", "master", "--bind", "nope"], "--bind must be host:port"),
        (["--role", "master", "--public-url", "10.0.0.1:8080"], "--public-url must be an absolute"),
        (["--role", "master", "--models-dir", "/nonexistent/x"], "is not a directory"),
        (["--role", "master", "--max-context", "-1"], "--max-context must be 0"),
        (["--role", "standalone", "--ca-file", "x.pem"], "--ca-file is for --role master"),
        (["--role", "master", "--node-id", "no spaces"], "cluster.node_id: may contain only"),
    ],
)
def test_bad_input_is_refused_naming_the_option_and_writes_nothing(
    tmp_path: Path, args: list[str], message: str
) -> None:
    out = tmp_path / "config.yaml"
    with pytest.raises(CommandError, match=re.escape(message)):
        init_node(*args, "--out", str(out))
    assert list(tmp_path.iterdir()) == []


def test_the_written_config_fails_to_load_if_a_key_is_wrong(tmp_path: Path) -> None:
    # The loader really checks what the command writes: a broken value is caught.
    out = tmp_path / "config.yaml"
    init_node("--role", "master", "--out", str(out))
    out.write_text(out.read_text().replace("role: master", "role: boss"))
    with pytest.raises(ConfigError, match=re.escape("cluster.role: must be one of")):
        load(out)


# --- run as the operator runs it -----------------------------------------------------------

MANAGE_PY = Path(__file__).resolve().parents[2] / "manage.py"


def run_manage(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("ROUTER_CONFIG", "DATABASE_URL")}
    return subprocess.run(
        [sys.executable, str(MANAGE_PY), *args],
        cwd=str(cwd),
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_broken_config_in_the_current_directory_does_not_stop_it_nor_is_a_store_made(
    tmp_path: Path,
) -> None:
    # The file an operator runs it to replace; before, its error stopped the command.
    (tmp_path / "config.yaml").write_text("server: [broken\n")
    done = run_manage(tmp_path, "init_node", "--role", "standalone", "--out", "config.yaml")
    assert done.returncode == 1 and "--force" in done.stderr, done.stdout + done.stderr

    done = run_manage(
        tmp_path, "init_node", "--role", "standalone", "--out", "config.yaml", "--force"
    )

    assert done.returncode == 0, done.stdout + done.stderr
    assert load(tmp_path / "config.yaml").cluster.role == "standalone"
    # Nothing but what it writes: no node store (with a secret key) in the current directory.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml", "kcpps"]


def test_a_bad_option_prints_the_usage_and_exits_2(tmp_path: Path) -> None:
    done = run_manage(tmp_path, "init_node", "--role", "bogus", "--out", "x.yaml")
    assert done.returncode == 2
    assert "usage: manage.py init_node" in done.stderr and "invalid choice: 'bogus'" in done.stderr
    assert not (tmp_path / "x.yaml").exists()
