"""The asset rules that need no running node: ranges, names, the shared dir, partial files."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from registry.assets.partial import PartialFile
from registry.assets.routes import (
    LOOKUP_MAX_HASHES,
    RANGE_HEADER_MAX_CHARS,
    parse_hashes,
    parse_range,
)
from registry.assets.store import AssetError, asset_path, check_filename, ensure_asset_dir
from registry.hashing import config_hash
from routerproject.errors import RouterError

DIGEST = "ab" * 32


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (None, None),
        ("bytes=0-9", (0, 9)),
        ("bytes=10-", (10, 99)),
        ("bytes=90-500", (90, 99)),
        ("bytes=99-99", (99, 99)),
    ],
)
def test_one_byte_range_is_served(header: str | None, expected: tuple[int, int] | None) -> None:
    assert parse_range(header, 100) == expected


@pytest.mark.parametrize(
    "header",
    [
        "bytes=0-1,3-4",
        "bytes=100-",
        "bytes=100-100",
        "bytes=100-200",
        "bytes=5-4",
        "bytes=-5",
        "items=0-1",
        "bytes=0-1 ,",
    ],
)
def test_other_ranges_are_refused_with_416(header: str) -> None:
    with pytest.raises(RouterError) as caught:
        parse_range(header, 100)
    assert caught.value.status == 416


def test_a_range_header_longer_than_its_cap_is_refused() -> None:
    padded = "bytes=" + "0" * (RANGE_HEADER_MAX_CHARS - 8) + "1-"
    assert len(padded) == RANGE_HEADER_MAX_CHARS
    assert parse_range(padded, 100) == (1, 99)
    with pytest.raises(RouterError):
        parse_range("bytes=0" + padded[6:], 100)


@pytest.mark.parametrize(
    "name", ["../x", "a/b", "a\\b", "CON", "lpt1.gguf", "x.", "x ", "", "a" * 256, "c:d", "a\x01"]
)
def test_unsafe_file_names_are_refused_naming_the_field(name: str) -> None:
    with pytest.raises(RouterError) as caught:
        check_filename(name, "model_param_filename")
    assert caught.value.status == 400 and caught.value.param == "model_param_filename"


def test_safe_file_names_pass() -> None:
    for name in ["m.gguf", "a" * 255, "COM10.bin", "console.gguf"]:
        assert check_filename(name, "f") == name


def test_lookup_bodies_hold_one_to_256_valid_hashes() -> None:
    assert parse_hashes({"hashes": [DIGEST] * LOOKUP_MAX_HASHES}, body_bytes=10) == [DIGEST]
    for doc, param in [
        ({"hashes": []}, "hashes"),
        ({"hashes": [DIGEST] * (LOOKUP_MAX_HASHES + 1)}, "hashes"),
        ({"hashes": [DIGEST, DIGEST.upper()]}, "hashes[1]"),
        ({}, "hashes"),
    ]:
        with pytest.raises(RouterError) as caught:
            parse_hashes(doc, body_bytes=10)
        assert caught.value.param == param
    with pytest.raises(RouterError) as too_big:
        parse_hashes({"hashes": [DIGEST]}, body_bytes=1024 * 1024 + 1)
    assert too_big.value.status == 413


def test_the_shared_dir_is_laid_out_by_hash(tmp_path: Path) -> None:
    made = ensure_asset_dir(tmp_path / "shared", DIGEST)
    assert made == tmp_path / "shared" / "sha256" / "ab" / DIGEST
    assert asset_path(tmp_path / "shared", DIGEST, "m.gguf") == made / "m.gguf"


def test_a_symlink_on_the_way_into_the_shared_dir_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "shared" / "sha256").mkdir(parents=True)
    (tmp_path / "shared" / "sha256" / "ab").symlink_to(outside, target_is_directory=True)
    with pytest.raises(AssetError, match="symlink"):
        ensure_asset_dir(tmp_path / "shared", DIGEST)
    assert list(outside.iterdir()) == []


def test_a_partial_file_resumes_after_re_hashing_what_it_holds(tmp_path: Path) -> None:
    data = bytes(range(256)) * 40
    partial = tmp_path / "m.gguf.partial"
    partial.write_bytes(data[:1000])
    writer = PartialFile.open(partial, len(data))
    try:
        assert writer.offset == 1000
        writer.write(data[1000:])
    finally:
        writer.close()
    assert writer.digest.hexdigest() == hashlib.sha256(data).hexdigest()
    assert partial.read_bytes() == data


def test_a_partial_file_longer_than_the_asset_starts_over(tmp_path: Path) -> None:
    partial = tmp_path / "m.partial"
    partial.write_bytes(b"x" * 11)
    writer = PartialFile.open(partial, 10)
    writer.close()
    assert writer.offset == 0 and partial.read_bytes() == b""


def test_a_symlink_in_place_of_the_partial_file_is_not_followed(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_bytes(b"keep")
    (tmp_path / "m.partial").symlink_to(target)
    with pytest.raises(OSError):
        PartialFile.open(tmp_path / "m.partial", 10)
    assert target.read_bytes() == b"keep"


def test_a_portable_config_hashes_like_its_origin_and_its_resolved_copy() -> None:
    origin = {"contextsize": 4096, "model_param": "/models/m.gguf", "sdlora": ["/a", "/b"]}
    portable = {
        "contextsize": 4096,
        "model_param_hash": DIGEST,
        "model_param_filename": "m.gguf",
        "sdlora_hash": [DIGEST, DIGEST],
        "sdlora_filename": ["a", "b"],
    }
    resolved = {"contextsize": 4096, "model_param": "/shared/m.gguf", "sdlora": ["/x", "/y"]}
    assert config_hash(origin) == config_hash(portable) == config_hash(resolved)
    # One lora fewer is another config.
    assert config_hash({**portable, "sdlora_hash": [DIGEST]}) != config_hash(origin)
    assert config_hash({**portable, "contextsize": 2048}) != config_hash(origin)
