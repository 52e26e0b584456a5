from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from registry import hashing
from registry.hashing import FileHasher, config_hash, model_hash


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _expected(lines: list[str]) -> str:
    return _sha("\n".join(sorted(lines)).encode())


# --- config_hash ---------------------------------------------------------------------------


def test_config_hash_is_equal_for_the_same_settings_at_different_paths() -> None:
    node_a = {"model_param": "/srv/a/llama.gguf", "contextsize": 4096, "sdlora": ["/x/l1"]}
    node_b = {"model_param": "D:\\models\\other.gguf", "contextsize": 4096, "sdlora": ["rel/l2"]}
    assert config_hash(node_a) == config_hash(node_b)


def test_config_hash_ignores_key_order_at_every_level() -> None:
    first = {"contextsize": 4096, "vllm": {"settings": {"a": 1, "b": 2}}, "parallel": 1}
    second = {"parallel": 1, "vllm": {"settings": {"b": 2, "a": 1}}, "contextsize": 4096}
    assert config_hash(first) == config_hash(second)


def test_config_hash_differs_when_a_setting_differs() -> None:
    assert config_hash({"contextsize": 4096}) != config_hash({"contextsize": 8192})


def test_config_hash_treats_path_like_strings_outside_path_fields_as_locations() -> None:
    with_one = {"chatcompletionsadapter": "/etc/adapters/a.json", "port": 5001}
    with_other = {"chatcompletionsadapter": "C:/adapters/b.json", "port": 5001}
    assert config_hash(with_one) == config_hash(with_other)


def test_config_hash_keeps_plain_strings_in_unknown_fields() -> None:
    assert config_hash({"chatcompletionsadapter": "AutoGuess"}) != config_hash(
        {"chatcompletionsadapter": "ChatML"}
    )


def test_config_hash_distinguishes_an_unset_path_field_from_a_set_one() -> None:
    assert config_hash({"model_param": "a.gguf", "sdmodel": ""}) != config_hash(
        {"model_param": "a.gguf", "sdmodel": "dream.safetensors"}
    )


def test_config_hash_matches_the_documented_serialisation() -> None:
    raw = {"b": "é", "a": {"model_param": "/m.gguf"}}
    text = json.dumps(
        {"a": {"model_param": "<path>"}, "b": "é"},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    assert config_hash(raw) == _sha(text.encode("utf-8"))


# --- model_hash ----------------------------------------------------------------------------


def test_model_hash_covers_the_content_of_each_referenced_file(tmp_path: Path) -> None:
    (tmp_path / "text.gguf").write_bytes(b"text weights")
    (tmp_path / "proj.gguf").write_bytes(b"projector")
    raw = {"model_param": "text.gguf", "mmproj": str(tmp_path / "proj.gguf")}
    result = model_hash(raw, base_dir=tmp_path, hasher=FileHasher(None))
    assert result == _expected(
        [f"model_param={_sha(b'text weights')}", f"mmproj={_sha(b'projector')}"]
    )


def test_model_hash_is_equal_for_equal_files_in_different_places(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "m.gguf").write_bytes(b"same")
    (tmp_path / "b" / "renamed.gguf").write_bytes(b"same")
    hasher = FileHasher(None)
    first = model_hash({"model_param": "m.gguf"}, base_dir=tmp_path / "a", hasher=hasher)
    second = model_hash({"model_param": "renamed.gguf"}, base_dir=tmp_path / "b", hasher=hasher)
    assert first == second != ""


def test_model_hash_uses_a_portable_hash_without_reading_any_file(tmp_path: Path) -> None:
    portable = "ab" * 32
    raw = {"model_param_hash": portable, "model_param_filename": "m.gguf"}
    result = model_hash(raw, base_dir=tmp_path, hasher=FileHasher(None))
    assert result == _expected([f"model_param={portable}"])


def test_model_hash_ignores_a_malformed_portable_hash(tmp_path: Path) -> None:
    raw = {"model_param_hash": "AB" * 32}
    assert model_hash(raw, base_dir=tmp_path, hasher=FileHasher(None)) == ""


def test_model_hash_records_a_missing_file_by_its_stem(tmp_path: Path) -> None:
    raw = {"model_param": "gone/llama-7b.Q4.gguf"}
    result = model_hash(raw, base_dir=tmp_path, hasher=FileHasher(None))
    assert result == _expected(["model_param=missing:llama-7b.Q4"])


def test_model_hash_numbers_each_element_of_a_list_field(tmp_path: Path) -> None:
    (tmp_path / "l0.safetensors").write_bytes(b"lora zero")
    raw = {"sdmodel": "missing.safetensors", "sdlora": ["l0.safetensors", "l1.safetensors"]}
    result = model_hash(raw, base_dir=tmp_path, hasher=FileHasher(None))
    assert result == _expected(
        [
            "sdmodel=missing:missing",
            f"sdlora[0]={_sha(b'lora zero')}",
            "sdlora[1]=missing:l1",
        ]
    )


def test_model_hash_is_empty_when_no_weights_are_referenced(tmp_path: Path) -> None:
    raw = {"contextsize": 4096, "model_param": "", "sdmodel": None, "lora": []}
    assert model_hash(raw, base_dir=tmp_path, hasher=FileHasher(None)) == ""


# --- FileHasher ----------------------------------------------------------------------------


def _rewrite_keeping_stat(path: Path, content: bytes) -> None:
    stat = path.stat()
    assert len(content) == stat.st_size
    path.write_bytes(content)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def test_hasher_returns_none_for_a_missing_file(tmp_path: Path) -> None:
    assert FileHasher(None).hash_file(tmp_path / "nope.gguf") is None


def test_hasher_returns_none_for_a_directory(tmp_path: Path) -> None:
    assert FileHasher(None).hash_file(tmp_path) is None


def test_hasher_hashes_a_file_larger_than_one_chunk(tmp_path: Path) -> None:
    data = os.urandom(1024 * 1024 * 2 + 17)
    (tmp_path / "big.bin").write_bytes(data)
    assert FileHasher(None).hash_file(tmp_path / "big.bin") == _sha(data)


def test_hasher_reuses_the_cached_hash_while_size_and_mtime_are_unchanged(
    tmp_path: Path,
) -> None:
    weights = tmp_path / "w.bin"
    weights.write_bytes(b"original")
    hasher = FileHasher(None)
    assert hasher.hash_file(weights) == _sha(b"original")
    _rewrite_keeping_stat(weights, b"replaced")
    # Proves the file was not read again: its content now hashes differently.
    assert hasher.hash_file(weights) == _sha(b"original")


def test_hasher_rehashes_when_the_mtime_changes(tmp_path: Path) -> None:
    weights = tmp_path / "w.bin"
    weights.write_bytes(b"original")
    hasher = FileHasher(None)
    hasher.hash_file(weights)
    _rewrite_keeping_stat(weights, b"replaced")
    stat = weights.stat()
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert hasher.hash_file(weights) == _sha(b"replaced")


def test_hasher_rehashes_when_the_size_changes(tmp_path: Path) -> None:
    weights = tmp_path / "w.bin"
    weights.write_bytes(b"original")
    hasher = FileHasher(None)
    hasher.hash_file(weights)
    stat = weights.stat()
    weights.write_bytes(b"longer content")
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert hasher.hash_file(weights) == _sha(b"longer content")


def test_hasher_persists_its_cache_across_instances(tmp_path: Path) -> None:
    weights = tmp_path / "w.bin"
    weights.write_bytes(b"original")
    cache = tmp_path / "store" / "hash-cache.json"
    first = FileHasher(cache)
    first.hash_file(weights)
    first.save()
    _rewrite_keeping_stat(weights, b"replaced")
    assert FileHasher(cache).hash_file(weights) == _sha(b"original")
    assert not [p for p in cache.parent.iterdir() if p.name != cache.name]


def test_hasher_does_not_persist_anything_before_save(tmp_path: Path) -> None:
    weights = tmp_path / "w.bin"
    weights.write_bytes(b"original")
    cache = tmp_path / "hash-cache.json"
    FileHasher(cache).hash_file(weights)
    assert not cache.exists()


@pytest.mark.parametrize(
    "content",
    [
        "not json",
        "[]",
        '{"version": 99, "entries": {}}',
        '{"version": 1, "entries": []}',
        '{"version": 1, "entries": {"/x": {"size": "1", "mtime_ns": 1, "sha256": "zz"}}}',
    ],
)
def test_hasher_starts_empty_from_a_corrupt_cache_file(tmp_path: Path, content: str) -> None:
    weights = tmp_path / "w.bin"
    weights.write_bytes(b"original")
    cache = tmp_path / "hash-cache.json"
    cache.write_text(content)
    hasher = FileHasher(cache)
    assert hasher.hash_file(weights) == _sha(b"original")
    hasher.save()
    assert FileHasher(cache).hash_file(weights) == _sha(b"original")


def test_hasher_without_a_cache_path_saves_nothing(tmp_path: Path) -> None:
    hasher = FileHasher(None)
    (tmp_path / "w.bin").write_bytes(b"x")
    hasher.hash_file(tmp_path / "w.bin")
    hasher.save()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w.bin"]


# --- rules that two nodes' configs and a persisted cache depend on -------------------------


def test_config_hash_ignores_bare_file_names_in_path_fields() -> None:
    # A config that names its weights beside it has no separator to give the path away; the
    # field name alone marks it as a location, or two nodes' replicas would never merge.
    node_a = {"model_param": "llama-7b.gguf", "mmproj": "proj.gguf", "lora": ["style.gguf"]}
    node_b = {"model_param": "llama-copy.gguf", "mmproj": "p.gguf", "lora": ["renamed.gguf"]}
    assert config_hash(node_a) == config_hash(node_b)
    assert config_hash(node_a) == _sha(
        b'{"lora":["<path>"],"mmproj":"<path>","model_param":"<path>"}'
    )


def test_model_hash_takes_a_list_field_given_only_as_portable_hashes(tmp_path: Path) -> None:
    first, second = "0a" * 32, "1b" * 32
    raw = {"sdmodel_hash": "2c" * 32, "sdlora_hash": [first, second]}
    result = model_hash(raw, base_dir=tmp_path, hasher=FileHasher(None))
    assert result == _expected(
        [f"sdmodel={'2c' * 32}", f"sdlora[0]={first}", f"sdlora[1]={second}"]
    )


def _cache_file(cache: Path, weights: Path, entry: dict[str, object], version: object = 1) -> None:
    cache.write_text(json.dumps({"version": version, "entries": {str(weights): entry}}))


BOGUS_SHA = "f" * 64


def test_the_cache_file_is_written_with_format_version_one(tmp_path: Path) -> None:
    weights = tmp_path / "w.bin"
    weights.write_bytes(b"original")
    cache = tmp_path / "hash-cache.json"
    hasher = FileHasher(cache)
    hasher.hash_file(weights)
    hasher.save()
    stat = weights.stat()
    assert json.loads(cache.read_text()) == {
        "version": 1,
        "entries": {
            str(weights): {
                "size": stat.st_size,
                "mtime_ns": stat.st_mtime_ns,
                "sha256": _sha(b"original"),
            }
        },
    }


@pytest.mark.parametrize("version", [0, 2, "1", None])
def test_a_cache_of_another_format_version_is_not_trusted(tmp_path: Path, version: object) -> None:
    weights = tmp_path / "w.bin"
    weights.write_bytes(b"original")
    stat = weights.stat()
    cache = tmp_path / "hash-cache.json"
    entry = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": BOGUS_SHA}
    _cache_file(cache, weights, entry, version=version)
    assert FileHasher(cache).hash_file(weights) == _sha(b"original")


def test_a_cache_entry_of_the_current_version_is_trusted(tmp_path: Path) -> None:
    # The counterpart of the tests around it: a well-formed entry really is used unread.
    weights = tmp_path / "w.bin"
    weights.write_bytes(b"x")
    stat = weights.stat()
    cache = tmp_path / "hash-cache.json"
    entry = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": BOGUS_SHA}
    _cache_file(cache, weights, entry)
    assert FileHasher(cache).hash_file(weights) == BOGUS_SHA


MTIME_NS = 1_700_000_000_000_000_000  # exactly representable as a float


@pytest.mark.parametrize(
    "entry",
    [
        {"size": True, "mtime_ns": MTIME_NS},
        {"size": 1.0, "mtime_ns": MTIME_NS},
        {"mtime_ns": MTIME_NS},
        {"size": 1, "mtime_ns": float(MTIME_NS)},
        {"size": 1, "mtime_ns": True},
        {"size": 1},
    ],
)
def test_a_cache_entry_whose_size_or_mtime_is_not_an_integer_is_dropped(
    tmp_path: Path, entry: dict[str, object]
) -> None:
    # A one-byte file with that mtime: `True` and `1.0` compare equal to its size of 1.
    weights = tmp_path / "w.bin"
    weights.write_bytes(b"x")
    os.utime(weights, ns=(MTIME_NS, MTIME_NS))
    cache = tmp_path / "hash-cache.json"
    _cache_file(cache, weights, {**entry, "sha256": BOGUS_SHA})
    assert FileHasher(cache).hash_file(weights) == _sha(b"x")


@pytest.mark.parametrize("change", ["grows", "gets_a_new_mtime"])
def test_a_file_rewritten_while_it_is_read_is_not_cached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: str
) -> None:
    weights = tmp_path / "w.bin"
    weights.write_bytes(b"original")
    os.utime(weights, ns=(MTIME_NS, MTIME_NS))
    real_sha256_of = hashing._sha256_of

    def read_while_a_writer_changes_it(path: str) -> str | None:
        digest = real_sha256_of(path)
        if change == "grows":
            with open(path, "ab") as handle:
                handle.write(b" and more")
            os.utime(path, ns=(MTIME_NS, MTIME_NS))
        else:
            os.utime(path, ns=(MTIME_NS, MTIME_NS + 1))
        return digest

    monkeypatch.setattr(hashing, "_sha256_of", read_while_a_writer_changes_it)
    cache = tmp_path / "hash-cache.json"
    hasher = FileHasher(cache)

    assert hasher.hash_file(weights) == _sha(b"original")
    hasher.save()

    assert json.loads(cache.read_text())["entries"] == {}


def test_a_remembered_hash_is_not_read_again_until_the_file_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    weights = tmp_path / "m.gguf"
    weights.write_bytes(b"weights")
    hasher = FileHasher(tmp_path / "hash-cache.json")
    hasher.remember(weights, "a" * 64)
    reads: list[str] = []
    real = hashing._sha256_of

    def counted(path: str) -> str | None:
        reads.append(path)
        return real(path)

    monkeypatch.setattr(hashing, "_sha256_of", counted)
    assert hasher.hash_file(weights) == "a" * 64
    assert reads == []
    weights.write_bytes(b"other weights")
    assert hasher.hash_file(weights) == hashlib.sha256(b"other weights").hexdigest()
    assert reads == [str(weights)]
