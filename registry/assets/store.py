"""This node's asset files: the validity rules, the shared directory and the hash index.

The index is the `model_assets` table of the router database: hash, name, size, path and how
the file was verified. A file below `models.file_roots` is found by name and hashed on demand.
"""

from __future__ import annotations

import os
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from registry.hashing import (
    PATH_FIELDS,
    is_sha256_hex,
    resolve_model_path,
)
from registry.kcpps import ModelConfig, is_safe_filename
from routerproject.errors import RouterError

SOURCE_LOCAL = "local_sha256"
SOURCE_FILE_ROOT = "file_root_sha256"
SOURCE_PEER = "peer_sha256"

# Writes and hashing go to a worker thread in blocks this big: one hop per MiB keeps the
# thread handoff cost far below the copy itself.
COPY_BLOCK_BYTES = 4 * 1024 * 1024
# Bounds the search for a file name below file_roots, as the inventory's listing is bounded.
FILE_ROOT_MAX_VISITED = 200_000


class AssetError(Exception):
    """A reference that cannot be resolved from one source; the message says why."""


# -- validity rules (reference-cluster §7.2) --------------------------------------------------


def check_sha256(value: object, param: str) -> str:
    if not is_sha256_hex(value):
        raise RouterError(400, f"{param} must be 64 lower-case hex characters", param=param)
    assert isinstance(value, str)
    return value


def check_filename(value: object, param: str) -> str:
    if not isinstance(value, str) or not is_safe_filename(value):
        raise RouterError(
            400,
            f"{param} must be a single safe file name (no path, no reserved characters or "
            "device names, at most 255 characters)",
            param=param,
        )
    return value


# -- the shared directory ---------------------------------------------------------------------


def asset_path(shared_dir: Path, sha256: str, filename: str) -> Path:
    """Where an asset lives in the shared dir: `sha256/<first 2>/<hash>/<filename>`."""
    return shared_dir / "sha256" / sha256[:2] / sha256 / filename


def ensure_asset_dir(shared_dir: Path, sha256: str) -> Path:
    """Create the asset's directory, refusing any symlink or non-directory on the way.

    A symlink planted below the shared dir would let a transfer write outside it.
    """
    if not is_sha256_hex(sha256):
        raise AssetError(f"not a sha256: {sha256!r}")
    shared_dir.mkdir(parents=True, exist_ok=True)
    current = shared_dir
    for part in ("sha256", sha256[:2], sha256):
        current = current / part
        try:
            info = os.lstat(current)
        except FileNotFoundError:
            try:
                os.mkdir(current)
            except FileExistsError:
                pass
            info = os.lstat(current)
        if stat.S_ISLNK(info.st_mode):
            raise AssetError(f"{current} is a symlink; refusing to write through it")
        if not stat.S_ISDIR(info.st_mode):
            raise AssetError(f"{current} is not a directory")
    return current


# -- the index (the router database) ----------------------------------------------------------


@dataclass(frozen=True)
class IndexedFile:
    sha256: str
    filename: str
    size: int
    path: str
    verification_source: str


def index_add(sha256: str, filename: str, size: int, path: Path, source: str) -> None:
    from django.utils import timezone

    from registry.models import ModelAsset

    ModelAsset.objects.update_or_create(
        sha256=sha256,
        path=str(path),
        defaults={
            "filename": filename,
            "size": size,
            "verification_source": source,
            "verified_at": timezone.now(),
        },
    )


def index_rows(sha256: str) -> list[IndexedFile]:
    from registry.models import ModelAsset

    return [
        IndexedFile(row.sha256, row.filename, row.size, row.path, row.verification_source)
        for row in ModelAsset.objects.filter(sha256=sha256).order_by("id")
    ]


def index_forget(sha256: str, path: str) -> None:
    from registry.models import ModelAsset

    ModelAsset.objects.filter(sha256=sha256, path=path).delete()


async def in_db(fn: Any, *args: Any) -> Any:
    """`fn(*args)` run where the Django ORM may run, awaited."""
    from channels.db import database_sync_to_async

    return await database_sync_to_async(fn)(*args)


# -- files ------------------------------------------------------------------------------------


def unlink(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def open_readonly(path: str) -> Any:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    return os.fdopen(fd, "rb", buffering=0)


def config_files(cfg: ModelConfig) -> list[Path]:
    out: list[Path] = []
    for name in sorted(PATH_FIELDS):
        value = cfg.raw.get(name)
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, str) and item:
                out.append(resolve_model_path(item, base_dir=cfg.path.parent))
    return out


def find_named(roots: list[Path], filename: str) -> list[Path]:
    """Regular files called `filename` below the roots; directory symlinks are not followed."""
    found: list[Path] = []
    visited = 0
    for root in roots:
        for directory, subdirs, files in os.walk(root, followlinks=False):
            visited += 1 + len(files)
            if visited > FILE_ROOT_MAX_VISITED:
                return found
            subdirs.sort()
            if filename in files:
                candidate = Path(directory) / filename
                try:
                    if stat.S_ISREG(os.lstat(candidate).st_mode):
                        found.append(candidate)
                except OSError:
                    continue
    return found


def write_atomically(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        unlink(Path(tmp))
        raise
