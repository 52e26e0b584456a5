"""The asset routes' work: site routes on a master or standalone, node routes on every node.

Parsing what a route is given (a lookup body, a `Range` header), finding the node a site call
names, carrying a call out on another node, and the local side of resolve, jobs and bind.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping
from typing import Any

from registry import hforigin
from registry.assets.service import AssetService, Job
from registry.assets.store import check_sha256, in_db
from registry.hforigin import HfOrigin, OriginMismatch
from registry.nodeclient import NodeCallError, normalize_base_url
from registry.ports import ClusterMember
from routerproject.errors import RouterError

LOOKUP_MAX_HASHES = 256
LOOKUP_MAX_BODY_BYTES = 1024 * 1024
RANGE_HEADER_MAX_CHARS = 96

_RANGE_RE = re.compile(r"bytes=(\d+)-(\d*)")


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
    unknown = sorted(set(doc) - BIND_FIELDS)
    if unknown:
        raise RouterError(400, f"{unknown[0]} is not a field of a bind", param=unknown[0])
    sha256 = check_sha256(doc.get("sha256"), "sha256")
    origin = hub_origin(doc)
    await verify_hub_file(origin, sha256, doc.get("token"))
    await in_db(hforigin.bind, sha256, origin)
    return {"sha256": sha256, "hf": origin.uri}


def hub_origin(doc: Mapping[str, Any]) -> HfOrigin:
    """The hub file a bind or substitute names (`repository`, `commit`, `repository_path`)."""
    return hforigin.check_origin(
        doc.get("repository"),
        doc.get("commit"),
        doc.get("repository_path"),
        param="repository",
        commit_param="commit",
        path_param="repository_path",
    )


async def verify_hub_file(origin: HfOrigin, sha256: str, token: object) -> None:
    """Have the hub vouch that `origin` holds the bytes of `sha256` (with the caller's token)."""
    if token is not None and not isinstance(token, str):
        raise RouterError(400, "token must be a string", param="token")
    try:
        await asyncio.to_thread(hforigin.verify, origin, sha256, token=token or None)
    except OriginMismatch as exc:
        raise RouterError(400, str(exc), param="sha256", code="model_asset_mismatch") from exc
