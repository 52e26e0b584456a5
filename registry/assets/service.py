"""The node's asset service: resolving portable configs to verified files, export, serving.

A portable config names its weights by SHA-256 and file name (`F_hash`, `F_filename`,
reference-cluster §7.2) instead of by path. A node that holds such a config resolves each
reference, in this order, to a file whose content it has verified:

1. its asset index (the `model_assets` table: hash, name, size, path, how it was verified);
2. files below `models.file_roots` with the same file name, hashed on demand;
3. a cluster peer: the master answers a lookup from its index and its nodes' (§7.3), and the
   file is streamed from that peer into `models.shared_dir` as
   `sha256/<first 2>/<hash>/<filename>`, resumable, size- and hash-checked (`pull.py`).

A peer's path is never opened here: only bytes that hash to the reference are kept. Until every
reference of a config resolves, its record shows `asset_state` and `unresolved_fields`, an
explicit load is refused before any backend starts, and an inference request waits for the
resolution (and its transfer).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import logging
import os
import stat
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from registry.assets.pull import Puller, Transfer
from registry.assets.store import (
    COPY_BLOCK_BYTES,
    SOURCE_FILE_ROOT,
    SOURCE_LOCAL,
    SOURCE_PEER,
    AssetError,
    IndexedFile,
    check_sha256,
    config_files,
    find_named,
    in_db,
    index_add,
    index_forget,
    index_rows,
    open_readonly,
    write_atomically,
)
from registry.catalog import LocalCatalog
from registry.hashing import (
    PATH_FIELDS,
    PORTABLE_HASH_SUFFIX,
    FileHasher,
    path_base_name,
    resolve_model_path,
)
from registry.hforigin import SOURCE_HF, HfOrigin
from registry.kcpps import (
    PORTABLE_FILENAME_SUFFIX,
    ModelConfig,
    ModelConfigError,
    portable_references,
    with_resolved_paths,
)
from registry.nodeclient import NodeCallError, normalize_base_url
from registry.ports import ClusterMember
from routerproject.errors import RouterError

logger = logging.getLogger(__name__)

LOOKUP_PATH = "/router/v1/node/assets/lookup"
LOOKUP_CLUSTER_PATH = "/router/v1/node/assets/lookup-cluster"
LOOKUP_CACHE_SECS = 5.0
LOOKUP_CACHE_MAX_ENTRIES = 512
JOBS_KEPT = 200
# Below cluster.store_dir: resolved copies of portable configs, for backends that read the
# config file itself (koboldcpp's --config).
RESOLVED_CONFIGS_DIR = "resolved-kcpps"


class AssetNode(ClusterMember, Protocol):
    """What the asset service needs of the running node."""

    @property
    def catalog(self) -> LocalCatalog: ...


# -- jobs -------------------------------------------------------------------------------------


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
        self.puller = Puller(
            node, self.shared_dir, self.hasher, config.models.concurrent_asset_transfers
        )
        self._inflight: dict[str, asyncio.Task[tuple[Path, str]]] = {}
        self._config_jobs: dict[str, Job] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.jobs: OrderedDict[str, Job] = OrderedDict()
        self._job_ids = itertools.count(1)
        self._lookup_cache: OrderedDict[str, tuple[float, list[dict[str, Any]]]] = OrderedDict()
        self.served_streams = 0
        self.served_bytes = 0

    @property
    def transfers(self) -> dict[str, Transfer]:
        """The running and finished copies from peers and hubs, by hash."""
        return self.puller.transfers

    # -- the index -----------------------------------------------------------------------------

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
        for row in await in_db(index_rows, sha256):
            size = await asyncio.to_thread(self._verified, Path(row.path), sha256)
            if size is not None:
                return row
            # Changed or gone: the row no longer says anything true.
            await in_db(index_forget, sha256, row.path)
        # The weights of this node's own configs are hashed already (the catalog's cache).
        for cfg in list(self.node.catalog.configs.values()):
            for path in config_files(cfg):
                size = await asyncio.to_thread(self._verified, path, sha256)
                if size is not None:
                    await in_db(index_add, sha256, path.name, size, path, SOURCE_LOCAL)
                    await asyncio.to_thread(self.hasher.save)
                    return IndexedFile(sha256, path.name, size, str(path), SOURCE_LOCAL)
        return None

    async def _from_file_roots(self, sha256: str, filename: str) -> Path | None:
        roots = list(self.node.config.models.file_roots)
        if not roots:
            return None
        candidates = await asyncio.to_thread(find_named, roots, filename)
        for path in candidates:
            size = await asyncio.to_thread(self._verified, path, sha256)
            if size is not None:
                await in_db(index_add, sha256, filename, size, path, SOURCE_FILE_ROOT)
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
        urls = [n.node_url for n in self.node.cluster.nodes.values() if n.healthy and n.node_url]
        answers = await self._ask_cluster(urls, missing)
        for sha, records in self._from_registered(urls, missing, answers).items():
            self._lookup_cache[sha] = (now, records)
            self._lookup_cache.move_to_end(sha)
            out.extend(records)
        while len(self._lookup_cache) > LOOKUP_CACHE_MAX_ENTRIES:
            self._lookup_cache.popitem(last=False)
        return out

    async def _ask_cluster(self, urls: list[str], missing: list[str]) -> list[list[dict[str, Any]]]:
        """The records of this node and of the nodes at `urls`, each answer that came within the
        lookup's one deadline."""
        deadline = self.node.config.models.asset_lookup_timeout
        loop = asyncio.get_running_loop()
        ends = loop.time() + deadline
        tasks = [asyncio.ensure_future(self._ask_node(url, missing, deadline)) for url in urls]
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
        return answers

    async def _ask_node(
        self, url: str, missing: list[str], deadline: float
    ) -> list[dict[str, Any]]:
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

    def _from_registered(
        self, urls: list[str], missing: list[str], answers: list[list[dict[str, Any]]]
    ) -> dict[str, list[dict[str, Any]]]:
        """The records of each hash asked for, from the answers that name a registered node (or
        this one) as the source."""
        found: dict[str, list[dict[str, Any]]] = {sha: [] for sha in missing}
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
        return found

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
                return await self.puller.pull(sha256, filename, source), SOURCE_PEER
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
        bound = await in_db(hforigin.bound, sha256)
        if bound is not None and bound not in origins:
            origins.append(bound)
        for origin in origins:
            try:
                return await self.puller.pull_hf(sha256, filename, origin), SOURCE_HF
            except AssetError as exc:
                reasons.append(f"{origin.uri}: {exc}")
        raise AssetError(
            f"{filename} ({sha256}) is not in the asset index, not below file_roots, and no "
            f"source delivered it ({'; '.join(reasons)})"
        )

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
                await in_db(index_add, digest, path.name, size, path, SOURCE_LOCAL)
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
        handle = await asyncio.to_thread(open_readonly, path)
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


def _write_resolved(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, data)
