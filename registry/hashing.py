"""Content identity of model configs: the config hash, the weights hash and a file hash cache.

Two records are replicas of one model exactly when ``model_hash + ":" + config_hash`` match
(reference-cluster §4.1), so both hashes must ignore where a node keeps its files and depend
only on settings and on file *content*.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# Recognised model path fields of a .kcpps; each may also appear in portable form as
# `<field>_hash` / `<field>_filename` / `<field>_hf` (reference-cluster §7.2).
PATH_FIELDS: frozenset[str] = frozenset(
    {
        "model_param",
        "sdmodel",
        "mmproj",
        "whispermodel",
        "embeddingsmodel",
        "sdvae",
        "sdt5xxl",
        "sdclipl",
        "sdclipg",
        "sdclip1",
        "sdclip2",
        "sdlora",
        "draftmodel",
        "ttsmodel",
        "musicmodel",
        "lora",
    }
)
# Fields that koboldcpp accepts as a list of files as well as a single file.
LIST_PATH_FIELDS: frozenset[str] = frozenset({"sdlora", "lora"})

PATH_PLACEHOLDER = "<path>"
PORTABLE_HASH_SUFFIX = "_hash"
# Every key a portable reference to field F uses: F_hash, F_filename and F_hf.
PORTABLE_SUFFIXES = ("_hash", "_filename", "_hf")
HASH_CHUNK_BYTES = 1024 * 1024
HASH_CACHE_FORMAT_VERSION = 1

_SHA256_HEX_RE = re.compile(r"[0-9a-f]{64}")


def is_sha256_hex(value: object) -> bool:
    """True for exactly 64 lower-case hex characters (the only accepted portable hash form)."""
    return isinstance(value, str) and _SHA256_HEX_RE.fullmatch(value) is not None


def looks_like_path(value: str) -> bool:
    """Heuristic from the reference: anything with a separator or a URL scheme is location data."""
    return "/" in value or "\\" in value or ":/" in value or value.startswith("/")


def path_base_name(value: str) -> str:
    """Last component of a POSIX or Windows path; configs are written on either."""
    return re.split(r"[\\/]", value.rstrip("/\\"))[-1]


def resolve_model_path(value: str, *, base_dir: Path) -> Path:
    """Where a path field points; relative paths are relative to the .kcpps directory."""
    path = Path(value).expanduser()
    if not path.is_absolute():
        path = base_dir / path
    return Path(os.path.abspath(path))


def _normalise(value: Any, *, path_field: bool) -> Any:
    if isinstance(value, Mapping):
        return {
            str(key): _normalise(item, path_field=str(key) in PATH_FIELDS)
            for key, item in value.items()
        }
    if isinstance(value, list | tuple):
        return [_normalise(item, path_field=path_field) for item in value]
    # An empty path field means "not set" in koboldcpp configs; turning it into "<path>"
    # would make a config without image weights hash like one with them.
    if isinstance(value, str) and ((path_field and value != "") or looks_like_path(value)):
        return PATH_PLACEHOLDER
    return value


def _locations_only(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The config with each portable reference folded back into its path field.

    A portable reference is just another way of saying where the weights are, so a config,
    its exported copy and that copy once resolved must all hash alike: otherwise a model
    moved by hash would be shown as a different model from its origin.
    """
    out = dict(raw)
    for name in PATH_FIELDS:
        portable = [
            name + suffix for suffix in PORTABLE_SUFFIXES if out.get(name + suffix) is not None
        ]
        if not portable or out.get(name) not in (None, "", []):
            continue
        reference = out.get(name + PORTABLE_HASH_SUFFIX)
        for key in portable:
            out.pop(key, None)
        if isinstance(reference, list):
            out[name] = [PATH_PLACEHOLDER] * len(reference)
        elif reference is not None:
            out[name] = PATH_PLACEHOLDER
    return out


def config_hash(raw: Mapping[str, Any]) -> str:
    """SHA-256 hex of the settings with every location replaced, so it is equal across nodes."""
    normalised = _normalise(_locations_only(raw), path_field=False)
    text = json.dumps(normalised, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class FileHasher:
    """Streams SHA-256 of weight files, remembering results by (path, size, mtime_ns).

    Weights run to many GB, so re-hashing on every rescan would stall the node; the cache is
    persisted (``hash-cache.json`` in the store dir) so a restart does not re-hash either.
    """

    def __init__(self, cache_path: Path | None) -> None:
        self._cache_path = cache_path
        self._lock = threading.Lock()
        # absolute path -> (size, mtime_ns, sha256); one entry per path, so a file that
        # changes replaces its entry instead of growing the cache.
        self._entries: dict[str, tuple[int, int, str]] = {}
        self._dirty = False
        if cache_path is not None:
            self._entries = _read_cache(cache_path)

    def hash_file(self, path: Path) -> str | None:
        """SHA-256 hex of the file, or None when it is missing or unreadable."""
        key = os.path.abspath(path)
        try:
            before = os.stat(key)
        except OSError:
            return None
        with self._lock:
            cached = self._entries.get(key)
        if cached is not None and cached[0] == before.st_size and cached[1] == before.st_mtime_ns:
            return cached[2]
        digest = _sha256_of(key)
        if digest is None:
            return None
        try:
            after = os.stat(key)
        except OSError:
            return None
        # A file rewritten while we read it would leave a hash that matches neither
        # version; return it for this call but do not let it outlive the call.
        if after.st_size == before.st_size and after.st_mtime_ns == before.st_mtime_ns:
            with self._lock:
                self._entries[key] = (before.st_size, before.st_mtime_ns, digest)
                self._dirty = True
        return digest

    def remember(self, path: Path, sha256: str) -> None:
        """Record a hash established by other means (a copy hashed as it was written), keyed by
        the file as it is now, so a later `hash_file` does not read it again."""
        key = os.path.abspath(path)
        now = os.stat(key)
        with self._lock:
            self._entries[key] = (now.st_size, now.st_mtime_ns, sha256)
            self._dirty = True

    def save(self) -> None:
        """Persist the cache atomically; a crash mid-write leaves the previous file intact."""
        if self._cache_path is None:
            return
        with self._lock:
            if not self._dirty and self._cache_path.exists():
                return
            payload = {
                "version": HASH_CACHE_FORMAT_VERSION,
                "entries": {
                    key: {"size": size, "mtime_ns": mtime_ns, "sha256": digest}
                    for key, (size, mtime_ns, digest) in sorted(self._entries.items())
                },
            }
            self._cache_path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp_name = tempfile.mkstemp(
                prefix=self._cache_path.name + ".", suffix=".tmp", dir=self._cache_path.parent
            )
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as handle:
                    json.dump(payload, handle, separators=(",", ":"))
                    handle.flush()
                    os.fsync(handle.fileno())
                os.replace(tmp_name, self._cache_path)
            except BaseException:
                try:
                    os.unlink(tmp_name)
                except OSError:
                    pass
                raise
            self._dirty = False


def _sha256_of(path: str) -> str | None:
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as handle:
            while chunk := handle.read(HASH_CHUNK_BYTES):
                digest.update(chunk)
    except OSError:
        return None
    return digest.hexdigest()


def _read_cache(cache_path: Path) -> dict[str, tuple[int, int, str]]:
    """Load the persisted cache; anything unreadable or malformed just means starting empty."""
    try:
        data = json.loads(cache_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("version") != HASH_CACHE_FORMAT_VERSION:
        return {}
    entries = data.get("entries")
    if not isinstance(entries, dict):
        return {}
    result: dict[str, tuple[int, int, str]] = {}
    for key, entry in entries.items():
        if not isinstance(entry, dict):
            continue
        size, mtime_ns, digest = entry.get("size"), entry.get("mtime_ns"), entry.get("sha256")
        if (
            isinstance(size, int)
            and not isinstance(size, bool)
            and isinstance(mtime_ns, int)
            and not isinstance(mtime_ns, bool)
            and is_sha256_hex(digest)
        ):
            assert isinstance(digest, str)
            result[key] = (size, mtime_ns, digest)
    return result


def _file_line(
    label: str, value: object, portable: object, *, base_dir: Path, hasher: FileHasher
) -> str | None:
    if is_sha256_hex(portable):
        return f"{label}={portable}"
    if not isinstance(value, str) or value == "":
        return None
    digest = hasher.hash_file(resolve_model_path(value, base_dir=base_dir))
    if digest is None:
        return f"{label}=missing:{Path(path_base_name(value)).stem}"
    return f"{label}={digest}"


def model_hash(raw: Mapping[str, Any], *, base_dir: Path, hasher: FileHasher) -> str:
    """SHA-256 hex over ``field=<file sha256>`` lines; ``""`` when no weights are referenced."""
    lines: list[str] = []
    for field in sorted(PATH_FIELDS):
        value = raw.get(field)
        portable = raw.get(field + PORTABLE_HASH_SUFFIX)
        if isinstance(value, list) or isinstance(portable, list):
            values = value if isinstance(value, list) else []
            hashes = portable if isinstance(portable, list) else []
            for index in range(max(len(values), len(hashes))):
                line = _file_line(
                    f"{field}[{index}]",
                    values[index] if index < len(values) else None,
                    hashes[index] if index < len(hashes) else None,
                    base_dir=base_dir,
                    hasher=hasher,
                )
                if line is not None:
                    lines.append(line)
            continue
        line = _file_line(field, value, portable, base_dir=base_dir, hasher=hasher)
        if line is not None:
            lines.append(line)
    if not lines:
        return ""
    return hashlib.sha256("\n".join(sorted(lines)).encode("utf-8")).hexdigest()
