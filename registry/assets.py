"""Model assets: the hash index, portable configs, resolution and verified peer transfers.

A portable config names its weights by SHA-256 and file name (`F_hash`, `F_filename`,
reference-cluster §7.2) instead of by path. A node that holds such a config resolves each
reference, in this order, to a file whose content it has verified:

1. its asset index (the `model_assets` table: hash, name, size, path, how it was verified);
2. files below `models.file_roots` with the same file name, hashed on demand;
3. a cluster peer: the master answers a lookup from its index and its nodes' (§7.3), and the
   file is streamed from that peer into `models.shared_dir` as
   `sha256/<first 2>/<hash>/<filename>`, resumable, size- and hash-checked.

A peer's path is never opened here: only bytes that hash to the reference are kept. Until every
reference of a config resolves, its record shows `asset_state` and `unresolved_fields`, an
explicit load is refused before any backend starts, and an inference request waits for the
resolution (and its transfer).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import errno
import fcntl
import hashlib
import http.client
import itertools
import json
import logging
import mmap
import os
import re
import stat
import threading
import time
import urllib.parse
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from registry.catalog import LocalCatalog
from registry.hashing import (
    PATH_FIELDS,
    PORTABLE_HASH_SUFFIX,
    FileHasher,
    is_sha256_hex,
    path_base_name,
    resolve_model_path,
)
from registry.hforigin import SOURCE_HF, HfOrigin, OriginMismatch
from registry.kcpps import (
    PORTABLE_FILENAME_SUFFIX,
    ModelConfig,
    ModelConfigError,
    is_safe_filename,
    portable_references,
    with_resolved_paths,
)
from registry.nodeclient import NodeCallError, normalize_base_url
from registry.ports import ClusterMember
from routerproject.errors import RouterError

logger = logging.getLogger(__name__)

SOURCE_LOCAL = "local_sha256"
SOURCE_FILE_ROOT = "file_root_sha256"
SOURCE_PEER = "peer_sha256"

LOOKUP_PATH = "/router/v1/node/assets/lookup"
LOOKUP_CLUSTER_PATH = "/router/v1/node/assets/lookup-cluster"
STREAM_PREFIX = "/router/v1/node/assets/"
LOOKUP_MAX_HASHES = 256
LOOKUP_MAX_BODY_BYTES = 1024 * 1024
LOOKUP_CACHE_SECS = 5.0
LOOKUP_CACHE_MAX_ENTRIES = 512
RANGE_HEADER_MAX_CHARS = 96
# The largest asset a peer may announce; a size beyond it is refused before any byte moves.
MAX_ASSET_BYTES = 1 << 40
# Writes and hashing go to a worker thread in blocks this big: one hop per MiB keeps the
# thread handoff cost far below the copy itself.
COPY_BLOCK_BYTES = 4 * 1024 * 1024
# aiohttp's read buffer for a transfer: it pauses the socket at twice this much unread, which
# bounds the memory a copy holds while its last block is being written.
READ_BUFFER_BYTES = 1024 * 1024
# A peer copy is written with O_DIRECT in spans aligned to this (a multiple of the logical
# block size of common disks): a buffered write copies every byte into freshly allocated page
# cache, which cost more CPU than hashing it, and the final fsync sends it all to disk anyway.
DIRECT_ALIGN = 4096
JOBS_KEPT = 200
# Bounds the search for a file name below file_roots, as the inventory's listing is bounded.
FILE_ROOT_MAX_VISITED = 200_000
PARTIAL_SUFFIX = ".partial"
# Below cluster.store_dir: resolved copies of portable configs, for backends that read the
# config file itself (koboldcpp's --config).
RESOLVED_CONFIGS_DIR = "resolved-kcpps"

_RANGE_RE = re.compile(r"bytes=(\d+)-(\d*)")


class AssetNode(ClusterMember, Protocol):
    """What the asset service needs of the running node."""

    @property
    def catalog(self) -> LocalCatalog: ...


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


# -- byte ranges --------------------------------------------------------------------------------


def parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """The (first, last) bytes asked for, None for the whole file; RouterError 416 otherwise.

    Only one `bytes=a-b` or `bytes=a-` range is served: a resume needs no more, and several
    ranges would cost a multipart body for nothing.
    """
    if header is None:
        return None
    text = header.strip()
    if len(text) > RANGE_HEADER_MAX_CHARS:
        raise RouterError(416, "Range header is too long", code="range_not_satisfiable")
    match = _RANGE_RE.fullmatch(text)
    if match is None:
        raise RouterError(
            416, "only a single bytes=a-b range is served", code="range_not_satisfiable"
        )
    first = int(match.group(1))
    last = int(match.group(2)) if match.group(2) else size - 1
    if first >= size or last < first:
        raise RouterError(
            416, f"range {text} is outside the file of {size} bytes", code="range_not_satisfiable"
        )
    return first, min(last, size - 1)


# -- jobs -------------------------------------------------------------------------------------


@dataclass
class Transfer:
    """A running or finished pull of one hash from a peer (shown by the jobs routes)."""

    sha256: str
    filename: str
    node_url: str
    size: int
    done: int = 0
    resumed_from: int = 0
    state: str = "running"
    error: str = ""
    hf: HfOrigin | None = None
    """Set when the bytes come from a Hugging Face hub rather than a peer."""

    def to_wire(self) -> dict[str, Any]:
        return {
            "sha256": self.sha256,
            "filename": self.filename,
            "node_url": self.node_url,
            "bytes_total": self.size,
            "bytes_done": self.done,
            "resumed_from": self.resumed_from,
            "state": self.state,
            "error": self.error,
        }


@dataclass
class FieldResult:
    field: str
    position: int | None
    sha256: str
    filename: str
    resolved: bool = False
    source: str = ""
    verification: str = ""
    error: str = ""
    transfer: Transfer | None = None
    hf: str | None = None

    def to_wire(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "field": self.field,
            "position": self.position,
            "sha256": self.sha256,
            "filename": self.filename,
            "resolved": self.resolved,
            "source": self.source,
            "verification": self.verification,
            "error": self.error,
            "transfer": self.transfer.to_wire() if self.transfer is not None else None,
        }
        return doc


@dataclass
class Job:
    id: str
    node_id: str
    model_id: str
    fields: list[FieldResult]
    state: str = "running"
    error: str = ""
    created: float = field(default_factory=time.time)
    finished: float | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def to_wire(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "node_id": self.node_id,
            "model_id": self.model_id,
            "state": self.state,
            "error": self.error,
            "created": self.created,
            "finished": self.finished,
            "fields": [result.to_wire() for result in self.fields],
        }


# -- the service --------------------------------------------------------------------------------


def _references(cfg: ModelConfig) -> list[FieldResult]:
    out: list[FieldResult] = []
    for name in sorted(cfg.unresolved_fields):
        refs = portable_references(cfg.raw, name)
        listed = isinstance(cfg.raw.get(name + PORTABLE_HASH_SUFFIX), list)
        for index, (digest, filename, origin) in enumerate(refs):
            out.append(FieldResult(name, index if listed else None, digest, filename, hf=origin))
    return out


class AssetService:
    """The node's asset index, resolution jobs and transfers; one per router process."""

    def __init__(self, node: AssetNode, *, monotonic: Any = time.monotonic) -> None:
        self.node = node
        config = node.config
        self.shared_dir = config.shared_dir_path
        self.hasher = FileHasher(config.cluster.store_dir / "hash-cache.json")
        self._monotonic = monotonic
        self._slots = asyncio.Semaphore(config.models.concurrent_asset_transfers)
        self._inflight: dict[str, asyncio.Task[tuple[Path, str]]] = {}
        self._config_jobs: dict[str, Job] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.jobs: OrderedDict[str, Job] = OrderedDict()
        self.transfers: dict[str, Transfer] = {}
        self._job_ids = itertools.count(1)
        self._lookup_cache: OrderedDict[str, tuple[float, list[dict[str, Any]]]] = OrderedDict()
        self.served_streams = 0
        self.served_bytes = 0

    # -- the index -----------------------------------------------------------------------------

    async def _db(self, fn: Any, *args: Any) -> Any:
        from channels.db import database_sync_to_async

        return await database_sync_to_async(fn)(*args)

    def _verified(self, path: Path, sha256: str) -> int | None:
        """The file's size when it exists, is a regular file and hashes to `sha256`."""
        try:
            info = os.lstat(path)
        except OSError:
            return None
        if not stat.S_ISREG(info.st_mode):
            return None
        if self.hasher.hash_file(path) != sha256:
            return None
        return info.st_size

    async def local_find(self, sha256: str) -> IndexedFile | None:
        """A file of this node verified to hash to `sha256`, indexing it when first seen."""
        for row in await self._db(index_rows, sha256):
            size = await asyncio.to_thread(self._verified, Path(row.path), sha256)
            if size is not None:
                return row
            # Changed or gone: the row no longer says anything true.
            await self._db(index_forget, sha256, row.path)
        # The weights of this node's own configs are hashed already (the catalog's cache).
        for cfg in list(self.node.catalog.configs.values()):
            for path in _config_files(cfg):
                size = await asyncio.to_thread(self._verified, path, sha256)
                if size is not None:
                    await self._db(index_add, sha256, path.name, size, path, SOURCE_LOCAL)
                    await asyncio.to_thread(self.hasher.save)
                    return IndexedFile(sha256, path.name, size, str(path), SOURCE_LOCAL)
        return None

    async def _from_file_roots(self, sha256: str, filename: str) -> Path | None:
        roots = list(self.node.config.models.file_roots)
        if not roots:
            return None
        candidates = await asyncio.to_thread(_find_named, roots, filename)
        for path in candidates:
            size = await asyncio.to_thread(self._verified, path, sha256)
            if size is not None:
                await self._db(index_add, sha256, filename, size, path, SOURCE_FILE_ROOT)
                await asyncio.to_thread(self.hasher.save)
                return path
        return None

    async def lookup_local(self, hashes: Iterable[str]) -> list[dict[str, Any]]:
        out = []
        for sha in hashes:
            found = await self.local_find(sha)
            if found is not None:
                out.append(
                    {
                        "sha256": sha,
                        "filename": found.filename,
                        "size": found.size,
                        "node_url": self.node.config.cluster.public_url,
                    }
                )
        return out

    # -- peer lookup ---------------------------------------------------------------------------

    async def lookup_cluster(self, hashes: list[str]) -> list[dict[str, Any]]:
        """The master's answer: its own index and every healthy node's, within one deadline."""
        now = self._monotonic()
        out: list[dict[str, Any]] = []
        missing: list[str] = []
        for sha in hashes:
            cached = self._lookup_cache.get(sha)
            if cached is not None and now - cached[0] < LOOKUP_CACHE_SECS:
                out.extend(cached[1])
            else:
                missing.append(sha)
        if not missing:
            return out
        found: dict[str, list[dict[str, Any]]] = {sha: [] for sha in missing}
        deadline = self.node.config.models.asset_lookup_timeout

        async def ask(url: str) -> list[dict[str, Any]]:
            client = self.node.client
            if client is None:
                return []
            try:
                status, doc = await client.call_json(
                    "POST", url, LOOKUP_PATH, json={"hashes": missing}, timeout=deadline
                )
            except NodeCallError as exc:
                logger.info("asset lookup at %s failed: %s", url, exc)
                return []
            if status != 200 or not isinstance(doc, dict):
                return []
            records = doc.get("assets")
            return [r for r in records if isinstance(r, dict)] if isinstance(records, list) else []

        loop = asyncio.get_running_loop()
        ends = loop.time() + deadline
        urls = [n.node_url for n in self.node.cluster.nodes.values() if n.healthy and n.node_url]
        tasks = [asyncio.ensure_future(ask(url)) for url in urls]
        try:
            mine = await asyncio.wait_for(self.lookup_local(missing), timeout=deadline)
        except TimeoutError:
            mine = []
        answers = [mine]
        if tasks:
            # One deadline for the whole lookup: a slow node costs the rest nothing beyond it.
            done, pending = await asyncio.wait(tasks, timeout=max(0.0, ends - loop.time()))
            for task in pending:
                task.cancel()
            answers.extend(task.result() for task in done if task.exception() is None)
        registered = {normalize_base_url(u) for u in urls}
        own = self.node.config.cluster.public_url
        if own:
            registered.add(normalize_base_url(own))
        for answer in answers:
            for record in answer:
                digest = record.get("sha256")
                source_url = record.get("node_url")
                if digest not in found or not isinstance(source_url, str) or not source_url:
                    continue
                try:
                    if normalize_base_url(source_url) not in registered:
                        continue  # only registered nodes are ever named as sources
                except ValueError:
                    continue
                found[str(digest)].append(record)
        for sha, records in found.items():
            self._lookup_cache[sha] = (now, records)
            self._lookup_cache.move_to_end(sha)
            out.extend(records)
        while len(self._lookup_cache) > LOOKUP_CACHE_MAX_ENTRIES:
            self._lookup_cache.popitem(last=False)
        return out

    async def peer_sources(self, sha256: str) -> list[dict[str, Any]]:
        node = self.node
        cluster = node.config.cluster
        if node.role == "master":
            records = await self.lookup_cluster([sha256])
        elif node.role == "slave" and node.client is not None and cluster.master_url:
            try:
                status, doc = await node.client.call_json(
                    "POST",
                    cluster.master_url,
                    LOOKUP_CLUSTER_PATH,
                    json={"hashes": [sha256]},
                    timeout=node.config.models.asset_lookup_timeout,
                )
            except NodeCallError as exc:
                logger.info("asset lookup through the master failed: %s", exc)
                return []
            raw = doc.get("assets") if status == 200 and isinstance(doc, dict) else None
            records = [r for r in raw if isinstance(r, dict)] if isinstance(raw, list) else []
        else:
            return []
        own = normalize_base_url(cluster.public_url) if cluster.public_url else ""
        out = []
        for record in records:
            url = record.get("node_url")
            if record.get("sha256") != sha256 or not isinstance(url, str):
                continue
            try:
                if normalize_base_url(url) == own:
                    continue  # a node is never its own source
            except ValueError:
                continue
            out.append(record)
        return out

    # -- resolution ----------------------------------------------------------------------------

    async def resolve_hash(
        self,
        sha256: str,
        filename: str,
        *,
        hf: str | None = None,
        result: FieldResult | None = None,
    ) -> tuple[Path, str]:
        """(verified local file, verification source) for one reference.

        Concurrent callers for one hash share one resolution, hence at most one transfer.
        """
        task = self._inflight.get(sha256)
        if task is None:
            task = asyncio.ensure_future(self._resolve_hash(sha256, filename, hf))
            self._inflight[sha256] = task
            task.add_done_callback(lambda _t: self._inflight.pop(sha256, None))
        if result is not None:
            result.transfer = self.transfers.get(sha256)
        # Shielded: one waiter going away must not cancel the others' transfer.
        path, source = await asyncio.shield(task)
        if result is not None:
            result.transfer = self.transfers.get(sha256)
        return path, source

    async def _resolve_hash(self, sha256: str, filename: str, hf: str | None) -> tuple[Path, str]:
        from registry import hforigin

        found = await self.local_find(sha256)
        if found is not None:
            return Path(found.path), found.verification_source
        path = await self._from_file_roots(sha256, filename)
        if path is not None:
            return path, SOURCE_FILE_ROOT
        reasons: list[str] = []
        for source in await self.peer_sources(sha256):
            try:
                return await self.pull(sha256, filename, source), SOURCE_PEER
            except AssetError as exc:
                reasons.append(f"{source.get('node_url')}: {exc}")
        if not reasons:
            reasons.append("no node of the cluster has it")
        origins: list[HfOrigin] = []
        if hf is not None:
            try:
                origins.append(hforigin.parse_origin(hf, param="hf"))
            except RouterError as exc:
                reasons.append(exc.message)
        bound = await self._db(hforigin.bound, sha256)
        if bound is not None and bound not in origins:
            origins.append(bound)
        for origin in origins:
            try:
                return await self.pull_hf(sha256, filename, origin), SOURCE_HF
            except AssetError as exc:
                reasons.append(f"{origin.uri}: {exc}")
        raise AssetError(
            f"{filename} ({sha256}) is not in the asset index, not below file_roots, and no "
            f"source delivered it ({'; '.join(reasons)})"
        )

    async def pull(self, sha256: str, filename: str, source: Mapping[str, Any]) -> Path:
        """Stream one asset from a peer into the shared dir, verified (reference §7.3)."""
        size = source.get("size")
        url = source.get("node_url")
        # A source may hold the same bytes under another name; the reference's name is kept.
        if source.get("sha256") != sha256:
            raise AssetError("the source reports another hash")
        if not isinstance(url, str) or self.node.client is None:
            raise AssetError("no usable source URL")
        try:
            self.node.client.allow.add(normalize_base_url(url))
        except ValueError as exc:
            raise AssetError(f"invalid source URL {url!r}") from exc
        return await self._fetch(Transfer(sha256, filename, url, _size(size)), SOURCE_PEER)

    async def pull_hf(self, sha256: str, filename: str, origin: HfOrigin) -> Path:
        """Download one asset from its hub origin, once the hub vouches for the hash there."""
        from registry import hforigin

        try:
            size = await asyncio.to_thread(hforigin.verify, origin, sha256)
        except OriginMismatch as exc:
            raise AssetError(str(exc)) from exc
        transfer = Transfer(sha256, filename, origin.uri, _size(size), hf=origin)
        return await self._fetch(transfer, SOURCE_HF)

    async def _fetch(self, transfer: Transfer, source: str) -> Path:
        async with self._slots:
            self.transfers[transfer.sha256] = transfer
            try:
                path = await self._copy(transfer)
            except AssetError as exc:
                transfer.state, transfer.error = "failed", str(exc)
                raise
            except NodeCallError as exc:
                transfer.state, transfer.error = "failed", str(exc)
                raise AssetError(f"transfer failed: {exc}") from exc
            transfer.state = "done"
        await self._db(index_add, transfer.sha256, transfer.filename, transfer.size, path, source)
        return path

    async def _copy(self, transfer: Transfer) -> Path:
        sha256, size = transfer.sha256, transfer.size
        directory = await asyncio.to_thread(ensure_asset_dir, self.shared_dir, sha256)
        target = directory / transfer.filename
        partial = directory / (transfer.filename + PARTIAL_SUFFIX)
        writer = await asyncio.to_thread(_PartialFile.open, partial, size)
        try:
            transfer.resumed_from = transfer.done = writer.offset
            if writer.offset < size or size == 0:
                await self._receive(transfer, writer)
            await asyncio.to_thread(writer.finish)
        finally:
            await asyncio.to_thread(writer.close)
        if writer.offset != size:
            raise AssetError(f"the source sent {writer.offset} of {size} bytes")
        if writer.digest.hexdigest() != sha256:
            await asyncio.to_thread(_unlink, partial)
            raise AssetError(
                f"the bytes received hash to {writer.digest.hexdigest()}, not {sha256}; "
                "the partial file was deleted"
            )

        def install() -> None:
            try:
                if stat.S_ISLNK(os.lstat(target).st_mode):
                    raise AssetError(f"{target} is a symlink; refusing to replace it")
            except FileNotFoundError:
                pass
            os.replace(partial, target)
            # Every byte was hashed as it arrived: the config that names the file must not read
            # the whole file again to learn what is already known.
            self.hasher.remember(target, sha256)
            self.hasher.save()

        await asyncio.to_thread(install)
        return target

    async def _receive(self, transfer: Transfer, writer: _PartialFile) -> None:
        import aiohttp

        from registry.httpclient import get_session

        headers = {"Accept-Encoding": "identity"}
        if transfer.hf is not None:
            from registry.hforigin import download_url

            # A hub sends LFS files from elsewhere (a redirect); no cluster token goes there.
            url, redirects = download_url(transfer.hf), True
        else:
            client = self.node.client
            assert client is not None
            # The node client's allow-list decides where the token may go; the bytes then flow
            # through the process's aiohttp pool, which reads them with far less overhead.
            url = client.checked_url(transfer.node_url, STREAM_PREFIX + transfer.sha256)
            headers["Authorization"] = client.authorization
            redirects = False
        if writer.offset > 0:
            headers["Range"] = f"bytes={writer.offset}-"
        if transfer.hf is None:
            await self._pull_from_peer(transfer, writer, url, headers)
            return
        try:
            async with get_session().get(
                url,
                headers=headers,
                allow_redirects=redirects,
                read_bufsize=READ_BUFFER_BYTES,
                timeout=aiohttp.ClientTimeout(
                    total=None,
                    sock_connect=self.node.config.cluster.control_timeout,
                    sock_read=self.node.config.cluster.control_timeout,
                ),
            ) as response:
                await self._take_body(transfer, writer, response)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise AssetError(f"transfer from {transfer.node_url} broke off: {exc!r}") from exc

    async def _pull_from_peer(
        self, transfer: Transfer, writer: _PartialFile, url: str, headers: dict[str, str]
    ) -> None:
        stop = threading.Event()
        timeout = self.node.config.cluster.control_timeout
        pull = asyncio.ensure_future(
            asyncio.to_thread(pull_blocking, url, headers, timeout, transfer, writer, stop)
        )
        try:
            await asyncio.shield(pull)
        except asyncio.CancelledError:
            # The partial file is closed by the caller: the thread must be done with it first.
            stop.set()
            try:
                await pull
            except Exception as exc:
                # Abandoned anyway; what the thread ended on still says why, in the log.
                logger.info("cancelled transfer from %s ended with %r", transfer.node_url, exc)
            raise

    async def _take_body(self, transfer: Transfer, writer: _PartialFile, response: Any) -> None:
        if body_start(transfer, writer, response.status, response.headers.get("Content-Range")):
            await asyncio.to_thread(writer.restart)
            transfer.resumed_from = transfer.done = 0
        parts: list[bytes] = []
        pending = 0
        received = writer.offset
        # One block is hashed and written in a thread while the next one arrives: the two
        # halves of the copy overlap instead of taking turns.
        writing: asyncio.Future[None] | None = None
        try:
            async for chunk in response.content.iter_any():
                received += len(chunk)
                if received > transfer.size:
                    if writing is not None:
                        await writing
                        writing = None
                    await asyncio.to_thread(writer.discard)
                    raise AssetError(f"the source sent more than the {transfer.size} bytes")
                parts.append(chunk)
                pending += len(chunk)
                if pending >= COPY_BLOCK_BYTES:
                    if writing is not None:
                        await writing
                    transfer.done = writer.offset
                    writing = asyncio.ensure_future(asyncio.to_thread(writer.write_all, parts))
                    parts, pending = [], 0
        finally:
            # The partial file is never left with a write in flight, whatever broke the copy.
            if writing is not None:
                await writing
        if parts:
            await asyncio.to_thread(writer.write_all, parts)
        transfer.done = writer.offset

    # -- configs -------------------------------------------------------------------------------

    def _new_job(self, model_id: str, fields: list[FieldResult]) -> Job:
        job = Job(
            id=f"{next(self._job_ids)}", node_id=self.node.node_id, model_id=model_id, fields=fields
        )
        self.jobs[job.id] = job
        while len(self.jobs) > JOBS_KEPT:
            self.jobs.popitem(last=False)
        return job

    def _own_config(self, local_id: str) -> ModelConfig:
        cfg = self.node.catalog.configs.get(local_id)
        if cfg is None:
            raise RouterError(
                404,
                f'model "{local_id}" is not a model config on node "{self.node.node_id}"',
                type="not_found",
                param="id",
                code="model_not_found",
            )
        return cfg

    def resolve_config(self, local_id: str) -> Job:
        """Start (or join) the resolution of one of this node's portable configs."""
        cfg = self._own_config(local_id)
        running = self._config_jobs.get(local_id)
        if running is not None and running.state == "running":
            return running
        job = self._new_job(local_id, _references(cfg))
        if not job.fields:
            job.state, job.finished = "done", time.time()
            job.done.set()
            return job
        self._config_jobs[local_id] = job
        task = asyncio.ensure_future(self._run_config_job(job, cfg))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return job

    async def _run_config_job(self, job: Job, cfg: ModelConfig) -> None:
        async def one(result: FieldResult) -> Path | None:
            try:
                path, source = await self.resolve_hash(
                    result.sha256, result.filename, hf=result.hf, result=result
                )
            except AssetError as exc:
                result.error = str(exc)
                return None
            except Exception as exc:  # a job must always finish
                logger.exception("resolving %s failed", result.sha256)
                result.error = f"{type(exc).__name__}: {exc}"
                return None
            result.resolved, result.source, result.verification = True, source, "sha256"
            return path

        paths = await asyncio.gather(*(one(result) for result in job.fields))
        try:
            if all(path is not None for path in paths):
                by_field: dict[str, list[str]] = {}
                for result, path in zip(job.fields, paths, strict=True):
                    by_field.setdefault(result.field, []).append(str(path))
                current = self.node.catalog.configs.get(cfg.local_id, cfg)
                try:
                    # A file not in the hash cache is read whole here: never on the event loop.
                    resolved = await asyncio.to_thread(
                        with_resolved_paths, current, by_field, hasher=self.hasher
                    )
                except ModelConfigError as exc:
                    raise AssetError(str(exc)) from exc
                copy = self.node.config.cluster.store_dir / RESOLVED_CONFIGS_DIR / cfg.filename
                text = json.dumps(dict(resolved.raw), indent=2).encode()
                await asyncio.to_thread(_write_resolved, copy, text)
                self._install(dataclasses.replace(resolved, launch_config=copy))
                job.state = "done"
            else:
                job.state = "failed"
                job.error = "; ".join(r.error for r in job.fields if r.error)
        except AssetError as exc:
            job.state, job.error = "failed", str(exc)
        finally:
            job.finished = time.time()
            job.done.set()

    def _install(self, cfg: ModelConfig) -> None:
        catalog = self.node.catalog
        old = catalog.configs.get(cfg.local_id)
        catalog.configs[cfg.local_id] = cfg
        if old is not None and old.image_id and catalog.image_ids.get(old.image_id) is old:
            del catalog.image_ids[old.image_id]
        if cfg.image_id:
            catalog.image_ids[cfg.image_id] = cfg
        self.node.cluster.rebuild()

    def annotate(self, record: dict[str, Any]) -> dict[str, Any]:
        """An unresolved config's record says whether a resolution runs or why it failed."""
        if "asset_state" not in record:
            return record
        job = self._config_jobs.get(str(record.get("local_id")))
        if job is not None and job.state == "running":
            record["asset_state"] = "resolving"
        elif job is not None and job.state == "failed":
            record["asset_state"] = "failed"
            record["asset_error"] = job.error
        return record

    async def ready(self, cfg: ModelConfig) -> ModelConfig:
        """`cfg` with every portable reference resolved, waiting for that; RouterError if not."""
        if not cfg.unresolved_fields:
            return cfg
        current = self.node.catalog.configs.get(cfg.local_id)
        if current is not None and not current.unresolved_fields:
            return current
        job = self.resolve_config(cfg.local_id)
        await job.done.wait()
        current = self.node.catalog.configs.get(cfg.local_id)
        if job.state != "done" or current is None or current.unresolved_fields:
            raise RouterError(
                503,
                f'model "{cfg.local_id}" cannot run: its weights '
                f"({', '.join(cfg.unresolved_fields)}) could not be resolved: {job.error}",
                type="backend_error",
                code="model_assets_unresolved",
            )
        return current

    # -- export --------------------------------------------------------------------------------

    async def export(self, local_id: str) -> dict[str, Any]:
        """The config with each path field turned into a portable reference (and indexed)."""
        cfg = self._own_config(local_id)
        raw = dict(cfg.raw)
        for name in sorted(PATH_FIELDS):
            value = raw.get(name)
            if value in (None, "", []):
                continue
            values = value if isinstance(value, list) else [value]
            hashes: list[str] = []
            names: list[str] = []
            for item in values:
                if not isinstance(item, str) or item == "":
                    continue
                path = resolve_model_path(item, base_dir=cfg.path.parent)
                digest = await asyncio.to_thread(self.hasher.hash_file, path)
                if digest is None:
                    raise RouterError(
                        409,
                        f"{name}: the file {path_base_name(item)} cannot be read on node "
                        f'"{self.node.node_id}", so it cannot be exported by hash',
                        param=name,
                        code="model_asset_missing",
                    )
                size = (await asyncio.to_thread(os.stat, path)).st_size
                await self._db(index_add, digest, path.name, size, path, SOURCE_LOCAL)
                hashes.append(digest)
                names.append(path_base_name(item))
            del raw[name]
            listed = isinstance(value, list)
            raw[name + PORTABLE_HASH_SUFFIX] = hashes if listed else hashes[0]
            raw[name + PORTABLE_FILENAME_SUFFIX] = names if listed else names[0]
        await asyncio.to_thread(self.hasher.save)
        return raw

    # -- serving -------------------------------------------------------------------------------

    async def open_for_serving(self, sha256: str) -> IndexedFile:
        check_sha256(sha256, "sha256")
        found = await self.local_find(sha256)
        if found is None:
            raise RouterError(404, f"asset {sha256} is not held by this node", type="not_found")
        return found

    async def read_file(self, path: str, first: int, length: int) -> AsyncIterator[bytes]:
        """The bytes [first, first+length) of the file, in blocks, at the configured rate."""
        limit = self.node.config.models.asset_serve_rate
        handle = await asyncio.to_thread(_open_readonly, path)
        started = self._monotonic()
        sent = 0
        try:
            await asyncio.to_thread(handle.seek, first)
            remaining = length
            while remaining > 0:
                block = await asyncio.to_thread(handle.read, min(COPY_BLOCK_BYTES, remaining))
                if not block:
                    raise AssetError(f"{path} is shorter than indexed")
                remaining -= len(block)
                sent += len(block)
                yield block
                if limit:
                    # Pace to the rate: sleep until the bytes sent so far are due.
                    ahead = sent / limit - (self._monotonic() - started)
                    if ahead > 0:
                        await asyncio.sleep(ahead)
        finally:
            await asyncio.to_thread(handle.close)

    def status(self) -> dict[str, Any]:
        return {
            "node_id": self.node.node_id,
            "jobs": [job.to_wire() for job in reversed(self.jobs.values())],
            "transfers": [t.to_wire() for t in self.transfers.values()],
            "served": {"streams": self.served_streams, "bytes": self.served_bytes},
        }


def body_start(
    transfer: Transfer, writer: _PartialFile, status: int, content_range: str | None
) -> bool:
    """Check a source's answer to a pull before its body is taken; True when the partial file
    must start over (the source ignored the range and sends the whole file)."""
    if status == 206:
        expected = f"bytes {writer.offset}-{transfer.size - 1}/{transfer.size}"
        if content_range != expected:
            raise AssetError(
                f"the source answered Content-Range {content_range!r}, not {expected!r}"
            )
        return False
    if status == 200:
        # Start over rather than mix two bodies.
        return writer.offset > 0
    raise AssetError(f"the source answered {status}")


def _store_block(writer: _PartialFile, block: memoryview, transfer: Transfer) -> None:
    writer.write(block, page_aligned=True)
    transfer.done = writer.offset


def pull_blocking(
    url: str,
    headers: Mapping[str, str],
    timeout: float,
    transfer: Transfer,
    writer: _PartialFile,
    stop: threading.Event,
) -> None:
    """Take a peer's asset stream into the partial file, in the calling (worker) thread.

    A peer copy is one long sequential read: a plain blocking socket reading straight into one
    reused buffer, hashed and written from there, costs a fraction of the CPU that an event
    loop's per-chunk reads and copies do, and leaves the router's loop free meanwhile.
    """
    parts = urllib.parse.urlsplit(url)
    connection_class = (
        http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    )
    connection = connection_class(parts.hostname or "", parts.port, timeout=timeout)
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    try:
        connection.request("GET", target, headers=dict(headers))
        response = connection.getresponse()
        if body_start(transfer, writer, response.status, response.getheader("Content-Range")):
            writer.restart()
            transfer.resumed_from = transfer.done = 0
        # Two buffers: one block is hashed and written by a second thread while the socket
        # fills the other, so the copy takes the longer of the two halves, not their sum.
        # Page-aligned (mmap) buffers, so that the writer can hand them to O_DIRECT.
        buffers = [mmap.mmap(-1, COPY_BLOCK_BYTES) for _ in range(2)]
        blocks = [memoryview(buffer) for buffer in buffers]
        received = writer.offset
        try:
            with concurrent.futures.ThreadPoolExecutor(1) as storer:
                storing: concurrent.futures.Future[None] | None = None
                try:
                    for turn in itertools.count():
                        if stop.is_set():
                            break
                        block = blocks[turn % 2]
                        # A resume from an unaligned offset reads a shorter first block, so that
                        # every later block starts on an aligned file offset.
                        want = COPY_BLOCK_BYTES - received % DIRECT_ALIGN
                        count = response.readinto(block[:want])
                        if not count:
                            break
                        received += count
                        if received > transfer.size:
                            break
                        if storing is not None:
                            storing.result()
                        storing = storer.submit(_store_block, writer, block[:count], transfer)
                finally:
                    if storing is not None:
                        storing.result()
        finally:
            for view in blocks:
                view.release()
            for buffer in buffers:
                buffer.close()
        if received > transfer.size:
            writer.discard()
            raise AssetError(f"the source sent more than the {transfer.size} bytes")
    except (OSError, http.client.HTTPException) as exc:
        raise AssetError(f"transfer from {transfer.node_url} broke off: {exc!r}") from exc
    finally:
        connection.close()
    if stop.is_set():
        raise AssetError(f"transfer from {transfer.node_url} was stopped")


class _PartialFile:
    """The `.partial` file of one transfer: resumed from what is there, re-hashed first."""

    def __init__(self, path: Path, fd: int, offset: int, digest: Any) -> None:
        self.path = path
        self.fd = fd
        self.offset = offset
        self.digest = digest
        # Cleared for good once the file system refuses O_DIRECT (tmpfs on older kernels,
        # alignments other than DIRECT_ALIGN): buffered writes then carry the copy.
        self.direct = True
        self._fd_direct = False

    @classmethod
    def open(cls, path: Path, size: int) -> _PartialFile:
        # O_NOFOLLOW: a symlink put in place of the partial file must not redirect the write.
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        try:
            have = os.fstat(fd).st_size
            if have > size:
                os.ftruncate(fd, 0)
                have = 0
            digest = hashlib.sha256()
            os.lseek(fd, 0, os.SEEK_SET)
            left = have
            while left > 0:
                block = os.read(fd, min(COPY_BLOCK_BYTES, left))
                if not block:
                    break
                digest.update(block)
                left -= len(block)
            offset = have - left
            os.ftruncate(fd, offset)
            os.lseek(fd, offset, os.SEEK_SET)
        except BaseException:
            os.close(fd)
            raise
        return cls(path, fd, offset, digest)

    def write(self, block: bytes | memoryview, *, page_aligned: bool = False) -> None:
        """Append `block`; with `page_aligned` (its memory starts on a page), the aligned part
        of it that lands on an aligned file offset goes to disk with O_DIRECT."""
        view = memoryview(block)
        position = self.offset
        while view:
            span = len(view)
            direct = (
                page_aligned
                and self.direct
                and span >= DIRECT_ALIGN
                and position % DIRECT_ALIGN == 0
                and (position - self.offset) % DIRECT_ALIGN == 0
            )
            if direct:
                span -= span % DIRECT_ALIGN
            written = self._write_once(view[:span], direct)
            view = view[written:]
            position += written
        self.digest.update(block)
        self.offset = position

    def _write_once(self, view: memoryview, direct: bool) -> int:
        if direct and not self._fd_direct and not self._direct_mode(True):
            direct = False
        if not direct and self._fd_direct:
            self._direct_mode(False)
        try:
            return os.write(self.fd, view)
        except OSError as exc:
            if not direct or exc.errno != errno.EINVAL:
                raise
        # O_DIRECT refused this write (nothing of it was written): buffered from now on.
        self.direct = False
        self._direct_mode(False)
        return os.write(self.fd, view)

    def _direct_mode(self, on: bool) -> bool:
        """Switch the descriptor's O_DIRECT flag; False when the file system refuses it."""
        flags = fcntl.fcntl(self.fd, fcntl.F_GETFL)
        if not on:
            fcntl.fcntl(self.fd, fcntl.F_SETFL, flags & ~os.O_DIRECT)
            self._fd_direct = False
            return True
        try:
            fcntl.fcntl(self.fd, fcntl.F_SETFL, flags | os.O_DIRECT)
        except OSError:
            self.direct = False
            return False
        self._fd_direct = True
        return True

    def write_all(self, blocks: list[bytes]) -> None:
        for block in blocks:
            self.write(block)

    def restart(self) -> None:
        os.ftruncate(self.fd, 0)
        os.lseek(self.fd, 0, os.SEEK_SET)
        self.offset = 0
        self.digest = hashlib.sha256()

    def discard(self) -> None:
        self.restart()
        _unlink(self.path)

    def finish(self) -> None:
        os.fsync(self.fd)

    def close(self) -> None:
        try:
            os.close(self.fd)
        except OSError:
            pass


def _write_resolved(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_atomically(path, data)


def _size(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_ASSET_BYTES:
        raise AssetError(f"the source reports an invalid size {value!r}")
    return value


def _unlink(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _open_readonly(path: str) -> Any:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    return os.fdopen(fd, "rb", buffering=0)


def _config_files(cfg: ModelConfig) -> list[Path]:
    out: list[Path] = []
    for name in sorted(PATH_FIELDS):
        value = cfg.raw.get(name)
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, str) and item:
                out.append(resolve_model_path(item, base_dir=cfg.path.parent))
    return out


def _find_named(roots: list[Path], filename: str) -> list[Path]:
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


# -- the routes' work (site routes on a master or standalone; node routes on every node) ------


def parse_hashes(doc: Any, *, body_bytes: int) -> list[str]:
    """The `hashes` of a lookup body: 1 to 256 valid hashes, in a body of at most 1 MiB."""
    if body_bytes > LOOKUP_MAX_BODY_BYTES:
        raise RouterError(413, "lookup body is larger than 1 MiB", code="body_too_large")
    hashes = doc.get("hashes") if isinstance(doc, dict) else None
    if not isinstance(hashes, list) or not 1 <= len(hashes) <= LOOKUP_MAX_HASHES:
        raise RouterError(
            400, f"hashes must be a list of 1 to {LOOKUP_MAX_HASHES} hashes", param="hashes"
        )
    for index, value in enumerate(hashes):
        check_sha256(value, f"hashes[{index}]")
    return list(dict.fromkeys(hashes))


def target_node(node: ClusterMember, node_id: str | None, node_url: str | None) -> str | None:
    """The registered URL of the node a site call names, or None for this node.

    Checked against the registry before any outbound call (reference-cluster §7.5), so a
    request can never aim this node's cluster token at a URL of the caller's choosing.
    """
    if not node_id or node_id == node.node_id:
        if node_url and node.config.cluster.public_url:
            try:
                same = normalize_base_url(node_url) == normalize_base_url(
                    node.config.cluster.public_url
                )
            except ValueError:
                same = False
            if not same:
                raise RouterError(
                    400,
                    f"node_url {node_url!r} does not match the registered node",
                    param="node_url",
                )
        return None
    remote = node.cluster.nodes.get(node_id)
    if remote is None:
        raise RouterError(
            400,
            f'node url for node "{node_id}" is required: the node is not registered',
            param="node_id",
        )
    if node_url:
        try:
            same = normalize_base_url(node_url) == normalize_base_url(remote.node_url)
        except ValueError:
            same = False
        if not same:
            raise RouterError(
                400,
                f"node_url {node_url!r} does not match the registered node {node_id!r}",
                param="node_url",
            )
    return remote.node_url


async def remote_call(
    node: ClusterMember, url: str, method: str, path: str, body: Any = None
) -> Any:
    """A site call carried out by another node; its 4xx verdicts reach the caller as they are."""
    if node.client is None:
        raise RouterError(502, "this node has no cluster client", type="backend_error")
    try:
        status, doc = await node.client.call_json(method, url, path, json=body)
    except NodeCallError as exc:
        raise RouterError(
            502, f"node at {url} did not answer: {exc}", type="backend_error"
        ) from exc
    if 200 <= status < 300:
        return doc
    err = doc.get("error") if isinstance(doc, dict) else None
    err = err if isinstance(err, dict) else {}
    if 400 <= status < 500:
        raise RouterError(
            status,
            str(err.get("message") or doc),
            type=str(err.get("type") or "invalid_request_error"),
            code=err.get("code"),
            param=err.get("param"),
        )
    raise RouterError(
        502, f"node at {url} failed: {err.get('message') or doc}", type="backend_error"
    )


def _job_or_404(service: AssetService, job_id: str) -> Job:
    job = service.jobs.get(job_id)
    if job is None:
        raise RouterError(404, f"job {job_id!r} is not known", type="not_found", param="id")
    return job


async def local_resolve(service: AssetService, model_id: str, *, wait: bool) -> dict[str, Any]:
    job = service.resolve_config(model_id)
    if wait:
        await job.done.wait()
    return job.to_wire()


def local_job(service: AssetService, job_id: str) -> dict[str, Any]:
    return _job_or_404(service, job_id).to_wire()


BIND_FIELDS = frozenset(
    {"node_id", "node_url", "sha256", "repository", "repository_path", "commit", "token"}
)


async def local_bind(service: AssetService, doc: Mapping[str, Any]) -> dict[str, Any]:
    """Verify a hub origin for a hash and store it (reference §7.4 bind)."""
    from registry import hforigin

    unknown = sorted(set(doc) - BIND_FIELDS)
    if unknown:
        raise RouterError(400, f"{unknown[0]} is not a field of a bind", param=unknown[0])
    sha256 = check_sha256(doc.get("sha256"), "sha256")
    origin = hforigin.check_origin(
        doc.get("repository"),
        doc.get("commit"),
        doc.get("repository_path"),
        param="repository",
        commit_param="commit",
        path_param="repository_path",
    )
    token = doc.get("token")
    if token is not None and not isinstance(token, str):
        raise RouterError(400, "token must be a string", param="token")
    try:
        await asyncio.to_thread(hforigin.verify, origin, sha256, token=token or None)
    except OriginMismatch as exc:
        raise RouterError(400, str(exc), param="sha256", code="model_asset_mismatch") from exc
    await service._db(hforigin.bind, sha256, origin)
    return {"sha256": sha256, "hf": origin.uri}


SUBSTITUTE_FIELDS = BIND_FIELDS | {
    "id",
    "filename",
    "field",
    "position",
    "expected_sha256",
    "confirm",
}
_config_locks: dict[str, asyncio.Lock] = {}


def _fingerprint(path: Path) -> tuple[bytes, str]:
    data = path.read_bytes()
    return data, hashlib.sha256(data).hexdigest()


def _write_atomically(path: Path, data: bytes) -> None:
    import tempfile

    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        _unlink(Path(tmp))
        raise


def _conflict(message: str, param: str) -> RouterError:
    return RouterError(409, message, param=param, code="model_asset_conflict")


def _substituted(
    raw: dict[str, Any],
    name: str,
    position: int | None,
    expected: str,
    new: str,
    hf: str,
    filename: str,
) -> dict[str, Any]:
    """The config with reference (`name`, `position`) moved from `expected` to `new`."""
    hash_key = name + PORTABLE_HASH_SUFFIX
    current = raw.get(hash_key)
    out = dict(raw)
    if isinstance(current, list):
        if position is None or not 0 <= position < len(current):
            raise RouterError(
                400, f"position must index {hash_key} (0..{len(current) - 1})", param="position"
            )
        if current[position] != expected:
            raise _conflict(
                f"{hash_key}[{position}] is {current[position]!r} now, not {expected}", "field"
            )
        hashes = list(current)
        hashes[position] = new
        out[hash_key] = hashes
        names = raw.get(name + PORTABLE_FILENAME_SUFFIX)
        if isinstance(names, list) and len(names) == len(hashes):
            names = list(names)
            names[position] = filename
            out[name + PORTABLE_FILENAME_SUFFIX] = names
        # A list's origins must all be hub references, so a single one is not added to it:
        # the binding stored for the hash serves instead.
        origins = raw.get(name + "_hf")
        if isinstance(origins, list) and len(origins) == len(hashes):
            origins = list(origins)
            origins[position] = hf
            out[name + "_hf"] = origins
        return out
    if position not in (None, 0):
        raise RouterError(400, f"{name} is not a list field: position must be 0", param="position")
    if current != expected:
        raise _conflict(f"{hash_key} is {current!r} now, not {expected}", "field")
    out[hash_key] = new
    out[name + PORTABLE_FILENAME_SUFFIX] = filename
    out[name + "_hf"] = hf
    return out


async def local_substitute(service: AssetService, doc: Mapping[str, Any]) -> dict[str, Any]:
    """Point one portable reference of a config at a verified hub file (reference §7.4)."""
    from registry import hforigin
    from registry.kcpps import load_model_config

    unknown = sorted(set(doc) - SUBSTITUTE_FIELDS)
    if unknown:
        raise RouterError(400, f"{unknown[0]} is not a field of a substitute", param=unknown[0])
    if doc.get("confirm") is not True:
        raise RouterError(
            400, "confirm must be true: the config file is rewritten", param="confirm"
        )
    node = service.node
    model_id = doc.get("id")
    cfg = node.catalog.configs.get(model_id) if isinstance(model_id, str) else None
    if cfg is None:
        raise RouterError(
            404,
            f"model {model_id!r} is not a model config on node {node.node_id!r}",
            type="not_found",
            param="id",
            code="model_not_found",
        )
    name = doc.get("field")
    if name not in PATH_FIELDS:
        raise RouterError(400, "field must be a model path field (e.g. model_param)", param="field")
    position = doc.get("position")
    if position is not None and (not isinstance(position, int) or isinstance(position, bool)):
        raise RouterError(400, "position must be an integer", param="position")
    expected = check_sha256(doc.get("expected_sha256"), "expected_sha256")
    sha256 = check_sha256(doc.get("sha256"), "sha256")
    origin = hforigin.check_origin(
        doc.get("repository"),
        doc.get("commit"),
        doc.get("repository_path"),
        param="repository",
        commit_param="commit",
        path_param="repository_path",
    )
    filename = check_filename(origin.path.rsplit("/", 1)[-1], "repository_path")
    token = doc.get("token")
    if token is not None and not isinstance(token, str):
        raise RouterError(400, "token must be a string", param="token")
    try:
        await asyncio.to_thread(hforigin.verify, origin, sha256, token=token or None)
    except OriginMismatch as exc:
        raise RouterError(400, str(exc), param="sha256", code="model_asset_mismatch") from exc
    lock = _config_locks.setdefault(str(cfg.path), asyncio.Lock())
    async with lock:
        data, before = await asyncio.to_thread(_fingerprint, cfg.path)
        try:
            raw = json.loads(data)
        except ValueError as exc:
            raise _conflict(f"{cfg.filename} is not valid JSON now: {exc}", "id") from exc
        if not isinstance(raw, dict):
            raise _conflict(f"{cfg.filename} is not a JSON object now", "id")
        new_raw = _substituted(raw, str(name), position, expected, sha256, origin.uri, filename)
        await service._db(hforigin.bind, sha256, origin)
        text = json.dumps(new_raw, indent=2).encode()
        _data, now = await asyncio.to_thread(_fingerprint, cfg.path)
        if now != before:
            raise _conflict(f"{cfg.filename} changed while it was being rewritten", "id")
        await asyncio.to_thread(_write_atomically, cfg.path, text)
        try:
            fresh = await asyncio.to_thread(
                load_model_config,
                cfg.path,
                default_backend_mode=node.config.backend.mode,
                hasher=service.hasher,
            )
        except ModelConfigError as exc:
            raise RouterError(500, f"the rewritten config is refused: {exc}") from exc
        service._install(fresh)
    return {"sha256": sha256, "hf": origin.uri}
