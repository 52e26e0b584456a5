"""Site inventory: each node of the cluster, its hardware, its models and its model files.

`GET /router/v1/site/inventory[?include_files=true]` on a master or standalone node answers
for the whole cluster; each slave answers for itself on `GET /router/v1/node/site/inventory`
(reference-cluster §9.2, §9.3). The reference's `option_catalog` and `observed_options` are
not part of this answer.

Two things here touch the machine and must never stall the event loop or fail the answer:

- Hardware: VRAM from `nvidia-smi` when it is on PATH and answers within
  NVIDIA_SMI_TIMEOUT_SECS, else RAM from `/proc/meminfo` (Linux), else nothing and a note. It
  runs in a worker thread and is cached for HARDWARE_CACHE_SECS, so a page refreshing every
  few seconds costs one probe per period, however many tabs are open.
- Files: only below `models.file_roots`, only when asked (`include_files=true`), in a worker
  thread, capped in count, path bytes and directory entries looked at. Directory symlinks are
  never descended and a file symlink is listed only when its target resolves inside the same
  root, so nothing outside the roots is ever named. No file is opened, let alone hashed.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import stat
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from django.conf import settings

from registry.cluster import RemoteNode
from registry.nodeclient import NodeCallError
from registry.ports import RegistryNode
from registry.recipes import COMPONENT_KINDS, Recipe
from registry.services import model_records
from routerproject.errors import RouterError

MEMINFO_PATH = Path("/proc/meminfo")
NVIDIA_SMI = "nvidia-smi"
NVIDIA_SMI_ARGS = ("--query-gpu=memory.total,memory.used", "--format=csv,noheader,nounits")
NVIDIA_SMI_TIMEOUT_SECS = 2.0
HARDWARE_CACHE_SECS = 5.0
KIB_BYTES = 1024
MIB_BYTES = 1024 * 1024

FILES_MAX_PER_NODE = 10_000
# 10 000 deep paths would still fit, but a tree of very long names must not push a node's
# answer past the node client's body cap (8 MiB), or the master would show no files at all.
FILES_MAX_PATH_BYTES = 4 * 1024 * 1024
# Bounds the walk itself: a root holding a million empty directories lists nothing, but
# would keep a worker thread busy for minutes.
FILES_MAX_VISITED = 200_000

NODE_INVENTORY_PATH = "/router/v1/node/site/inventory"
TRUE_WORDS = frozenset({"true", "1"})
FALSE_WORDS = frozenset({"false", "0"})


def include_files_parse(value: str | None) -> bool:
    """The `include_files` query parameter; absent means no file scan."""
    if value is None:
        return False
    word = value.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise RouterError(
        400, f"include_files must be true or false (got {value!r})", param="include_files"
    )


# -- hardware ------------------------------------------------------------------------------


def memory_doc(kind: str, total_bytes: int, used_bytes: int) -> dict[str, Any]:
    return {"kind": kind, "total_bytes": total_bytes, "used_bytes": used_bytes}


def meminfo_parse(text: str) -> dict[str, Any] | None:
    """RAM from the text of `/proc/meminfo`; None when it holds no usable total.

    Used memory is what MemAvailable says cannot be had: page cache the kernel would drop is
    not "used". Kernels older than 3.14 have no MemAvailable; there MemFree + Buffers + Cached
    is the usual estimate.
    """
    fields: dict[str, int] = {}
    for line in text.splitlines():
        name, sep, rest = line.partition(":")
        parts = rest.split()
        if not sep or not parts or not parts[0].isdigit():
            continue
        unit = parts[1].lower() if len(parts) > 1 else ""
        fields[name.strip()] = int(parts[0]) * (KIB_BYTES if unit == "kb" else 1)
    total = fields.get("MemTotal", 0)
    if total <= 0:
        return None
    available = fields.get("MemAvailable")
    if available is None:
        available = sum(fields.get(k, 0) for k in ("MemFree", "Buffers", "Cached"))
    available = min(max(available, 0), total)
    return memory_doc("ram", total, total - available)


def nvidia_smi_parse(text: str) -> dict[str, Any] | None:
    """VRAM summed over every GPU from `nvidia-smi --query-gpu=memory.total,memory.used
    --format=csv,noheader,nounits` (MiB per line); None when no line holds two numbers.

    A GPU that reports `[N/A]` is left out rather than counted as zero.
    """
    total = used = 0
    seen = False
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) != 2 or not all(cell.isdigit() for cell in cells):
            continue
        total += int(cells[0]) * MIB_BYTES
        used += int(cells[1]) * MIB_BYTES
        seen = True
    if not seen or total <= 0:
        return None
    return memory_doc("vram", total, min(used, total))


def _read_vram(binary: str, timeout_secs: float) -> tuple[dict[str, Any] | None, str]:
    try:
        proc = subprocess.Popen(
            [binary, *NVIDIA_SMI_ARGS],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    except OSError as exc:
        return None, f"nvidia-smi could not run: {exc.strerror or exc}"
    try:
        stdout, stderr = proc.communicate(timeout=timeout_secs)
    except subprocess.TimeoutExpired:
        proc.kill()
        # A wedged GPU can leave nvidia-smi in uninterruptible sleep, where even SIGKILL waits:
        # give up on it rather than wait without bound (subprocess.run would).
        try:
            proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            pass
        return None, f"nvidia-smi did not answer within {timeout_secs:g} s"
    if proc.returncode != 0:
        detail = (stderr or stdout).strip().splitlines()
        reason = detail[0][:200] if detail else f"exit status {proc.returncode}"
        return None, f"nvidia-smi failed: {reason}"
    memory = nvidia_smi_parse(stdout)
    return memory, "" if memory is not None else "nvidia-smi reported no GPU memory"


def _read_ram(path: Path) -> tuple[dict[str, Any] | None, str]:
    try:
        text = path.read_text(encoding="ascii", errors="replace")
    except FileNotFoundError:
        return None, f"{path} does not exist on this system"
    except OSError as exc:
        return None, f"{path} could not be read: {exc.strerror or exc}"
    memory = meminfo_parse(text)
    return memory, "" if memory is not None else f"{path} has no MemTotal"


def hardware_read(
    *, meminfo_path: Path, nvidia_smi: str | None, timeout_secs: float
) -> dict[str, Any]:
    """This machine's memory (VRAM when `nvidia_smi` answers, else RAM) and CPU count.

    Blocks for up to `timeout_secs`: call it from a worker thread. Never raises: what could
    not be read is null, and `note` says why.
    """
    notes: list[str] = []
    memory: dict[str, Any] | None = None
    if nvidia_smi:
        memory, note = _read_vram(nvidia_smi, timeout_secs)
        if note:
            notes.append(note)
    if memory is None:
        memory, note = _read_ram(meminfo_path)
        if note:
            notes.append(note)
    return {"memory": memory, "cpu_count": os.cpu_count(), "note": "; ".join(notes)}


class HardwareProbe:
    """hardware_read() off the event loop, cached; concurrent readers share one probe.

    The cache and its lock are thread-side state (the probe runs in worker threads), so they
    belong to no event loop and survive test loops coming and going.
    """

    def __init__(
        self,
        *,
        meminfo_path: Path = MEMINFO_PATH,
        nvidia_smi: str | None = None,
        find_nvidia_smi: bool = True,
        timeout_secs: float = NVIDIA_SMI_TIMEOUT_SECS,
        cache_secs: float = HARDWARE_CACHE_SECS,
    ) -> None:
        self.meminfo_path = meminfo_path
        self.nvidia_smi = nvidia_smi
        self.find_nvidia_smi = find_nvidia_smi and nvidia_smi is None
        self.timeout_secs = timeout_secs
        self.cache_secs = cache_secs
        self._lock = threading.Lock()
        self._cached: tuple[float, dict[str, Any]] | None = None

    def _fresh(self) -> dict[str, Any] | None:
        cached = self._cached
        if cached is not None and time.monotonic() - cached[0] < self.cache_secs:
            return cached[1]
        return None

    def _read_shared(self) -> dict[str, Any]:
        with self._lock:
            value = self._fresh()
            if value is not None:
                return value
            binary = shutil.which(NVIDIA_SMI) if self.find_nvidia_smi else self.nvidia_smi
            try:
                value = hardware_read(
                    meminfo_path=self.meminfo_path,
                    nvidia_smi=binary,
                    timeout_secs=self.timeout_secs,
                )
            except Exception as exc:
                # Whatever went wrong, hardware must never fail the inventory.
                value = {"memory": None, "cpu_count": os.cpu_count(), "note": str(exc)}
            self._cached = (time.monotonic(), value)
            return value

    async def read(self) -> dict[str, Any]:
        value = self._fresh()
        if value is None:
            value = await asyncio.to_thread(self._read_shared)
        # A copy each time: the answer is the caller's to change.
        memory = value["memory"]
        return {**value, "memory": dict(memory) if memory is not None else None}


# One probe per process: the cache is only worth something if every request shares it.
_probe: HardwareProbe | None = None


def hardware_probe() -> HardwareProbe:
    global _probe
    if _probe is None:
        _probe = HardwareProbe()
    return _probe


# -- files below the roots -----------------------------------------------------------------


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


class _Walk:
    def __init__(self, *, max_files: int, max_path_bytes: int, max_visited: int) -> None:
        self.max_files = max_files
        self.max_path_bytes = max_path_bytes
        self.max_visited = max_visited
        self.entries: list[dict[str, Any]] = []
        self.path_bytes = 0
        self.visited = 0
        self.truncated = False

    def _add(self, root: str, rel: str, info: os.stat_result) -> None:
        size = len(rel.encode("utf-8", "surrogateescape"))
        if len(self.entries) >= self.max_files or self.path_bytes + size > self.max_path_bytes:
            self.truncated = True
            return
        self.path_bytes += size
        self.entries.append(
            {"root": root, "path": rel, "size": info.st_size, "mtime": info.st_mtime}
        )

    def root(self, shown: str, real: str) -> str:
        """Walk one root (its resolved path `real`), depth first in name order.

        Returns a note, empty if all went well. Each directory is read whole and closed
        before its children are walked, so the walk holds no file descriptors open.
        """
        unreadable = 0
        stack: list[tuple[str, Iterator[os.DirEntry[str]]]] = []

        def enter(rel_dir: str, directory: str) -> None:
            nonlocal unreadable
            try:
                with os.scandir(directory) as it:
                    stack.append((rel_dir, iter(sorted(it, key=lambda e: e.name))))
            except OSError:
                unreadable += 1

        enter("", real)
        while stack and not self.truncated:
            rel_dir, children = stack[-1]
            entry = next(children, None)
            if entry is None:
                stack.pop()
                continue
            self.visited += 1
            if self.visited > self.max_visited:
                self.truncated = True
                break
            # Names that are not UTF-8 would not survive JSON; they are left out.
            try:
                entry.name.encode("utf-8")
            except UnicodeEncodeError:
                continue
            rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
            try:
                if entry.is_symlink():
                    target = os.path.realpath(entry.path)
                    if not _inside(target, real):
                        continue
                    info = os.stat(target)
                    if stat.S_ISREG(info.st_mode):
                        self._add(shown, rel, info)
                    # A directory symlink is not descended even inside the root: what it
                    # holds is listed under its real path, and it could form a loop.
                elif entry.is_dir(follow_symlinks=False):
                    enter(rel, entry.path)
                elif entry.is_file(follow_symlinks=False):
                    self._add(shown, rel, entry.stat(follow_symlinks=False))
            except OSError:
                unreadable += 1
        if not unreadable:
            return ""
        return f"{unreadable} {'entry' if unreadable == 1 else 'entries'} could not be read"


def files_list(
    *,
    roots: Sequence[Path],
    max_files: int = FILES_MAX_PER_NODE,
    max_path_bytes: int = FILES_MAX_PATH_BYTES,
    max_visited: int = FILES_MAX_VISITED,
) -> dict[str, Any]:
    """The regular files below `roots`: paths relative to their root, size and mtime.

    Blocking (a directory walk): call it from a worker thread. A root inside another root is
    not walked twice; its files are listed under the outer root.
    """
    walk = _Walk(max_files=max_files, max_path_bytes=max_path_bytes, max_visited=max_visited)
    listed: list[dict[str, str]] = []
    reals: list[tuple[dict[str, str], str]] = []
    for root in roots:
        item = {"path": str(root), "note": ""}
        listed.append(item)
        try:
            real = os.path.realpath(root, strict=True)
        except OSError as exc:
            reason = "does not exist" if isinstance(exc, FileNotFoundError) else exc.strerror
            item["note"] = f"not listed: {reason or exc}"
            continue
        if not os.path.isdir(real):
            item["note"] = "not listed: not a directory"
            continue
        reals.append((item, real))
    for index, (item, real) in enumerate(reals):
        # The outer root lists a nested one's files; of two equal roots, the first does.
        outer = next(
            (
                other_item["path"]
                for other_index, (other_item, other) in enumerate(reals)
                if other_index != index
                and _inside(real, other)
                and (other != real or other_index < index)
            ),
            None,
        )
        if outer is not None:
            item["note"] = f"listed under {outer}"
        elif walk.truncated:
            item["note"] = "not listed: the listing was already full"
        else:
            item["note"] = walk.root(item["path"], real)
    return {"roots": listed, "entries": walk.entries, "truncated": walk.truncated}


# -- the answer ----------------------------------------------------------------------------


def recipes_doc(recipes: Mapping[str, Recipe]) -> list[dict[str, Any]]:
    """The master's split recipes, once each (the node keys them by every public ID)."""
    unique: dict[str, Recipe] = {}
    for recipe in recipes.values():
        unique.setdefault(recipe.id, recipe)
    return [
        {
            "id": recipe.id,
            "public_id": recipe.public_id,
            "public_image_id": recipe.public_image_id,
            "components": [
                {
                    "kind": comp.kind,
                    "node_id": comp.node_id,
                    "model_id": comp.model_id,
                    "image_id": comp.image_id,
                    "config_filename": comp.config_filename,
                }
                for kind in COMPONENT_KINDS
                if (comp := recipe.components.get(kind)) is not None
            ],
        }
        for recipe in sorted(unique.values(), key=lambda r: r.id)
    ]


async def inventory_local(*, node: RegistryNode, include_files: bool) -> dict[str, Any]:
    """This node's own inventory entry (what a slave answers its master)."""
    roots = list(node.config.models.file_roots)
    if include_files:
        hardware, files = await asyncio.gather(
            hardware_probe().read(), asyncio.to_thread(files_list, roots=roots)
        )
    else:
        hardware, files = await hardware_probe().read(), None
    return {
        "node_id": node.node_id,
        "node_url": node.config.cluster.public_url,
        "source": node.source(),
        "role": node.role,
        "backend_mode": node.config.backend.mode,
        "available": True,
        "hardware": hardware,
        "models": node.local_records(),
        "files": files,
        "error": "",
        "build_version": settings.ROUTER_VERSION,
    }


async def _inventory_remote(
    *, node: RegistryNode, remote: RemoteNode, include_files: bool
) -> dict[str, Any]:
    """A registered node's entry: its own answer, or what the registry knows and why not."""
    entry: dict[str, Any] = {
        "node_id": remote.node_id,
        "node_url": remote.node_url,
        "source": "slave",
        "role": remote.role,
        "backend_mode": "",
        "available": False,
        "hardware": None,
        # The last poll's records: a node that does not answer still shows what it had.
        "models": [dict(rec) for rec in remote.records],
        "files": None,
        "error": "",
        "build_version": remote.build_version,
    }
    if not remote.healthy:
        entry["error"] = remote.error or "node is not healthy"
        return entry
    if node.client is None:
        entry["error"] = "this node has no cluster client"
        return entry
    path = NODE_INVENTORY_PATH + ("?include_files=true" if include_files else "")
    try:
        doc = await node.client.call_ok("GET", remote.node_url, path)
    except NodeCallError as exc:
        entry["error"] = f"did not answer: {exc}"
        return entry
    if not isinstance(doc, dict) or doc.get("node_id") != remote.node_id:
        shown = doc.get("node_id") if isinstance(doc, dict) else None
        entry["error"] = f"answered as node {shown!r}, not {remote.node_id!r}"
        return entry
    hardware, models, files = doc.get("hardware"), doc.get("models"), doc.get("files")
    if (
        not (hardware is None or isinstance(hardware, dict))
        or not isinstance(models, list)
        or not (files is None or isinstance(files, dict))
    ):
        entry["error"] = "answered an inventory this node cannot read"
        return entry
    entry.update(
        hardware=hardware,
        models=models,
        files=files if include_files else None,
        available=True,
        backend_mode=str(doc.get("backend_mode") or ""),
        build_version=str(doc.get("build_version") or remote.build_version),
    )
    if isinstance(doc.get("role"), str):
        entry["role"] = doc["role"]
    return entry


async def inventory_site(*, node: RegistryNode, include_files: bool) -> dict[str, Any]:
    """Every node of the cluster, asked at once; a node that fails is marked, never fatal."""
    remotes = sorted(node.cluster.nodes.values(), key=lambda n: n.node_id)
    entries = await asyncio.gather(
        inventory_local(node=node, include_files=include_files),
        *(
            _inventory_remote(node=node, remote=remote, include_files=include_files)
            for remote in remotes
        ),
    )
    return {
        "role": node.role,
        "node_id": node.node_id,
        "node_url": node.config.cluster.public_url,
        "nodes": list(entries),
        "models": model_records(node=node),
        "recipes": recipes_doc(node.recipes),
    }
