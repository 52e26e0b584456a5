"""Site routes of the model assets (`/router/v1/site/model-assets/...`, reference-cluster §7).

Each acts on this node or, with `node_id` (and optionally `node_url`, which must match the
registry), on another node through that node's `/router/v1/node/site/model-assets/...` route.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, cast

from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from access.audit import aaudit_request
from registry.assets.routes import (
    LOOKUP_MAX_HASHES,
    local_bind,
    local_job,
    local_resolve,
    remote_call,
    target_node,
)
from registry.assets.service import AssetService
from registry.assets.substitute import local_substitute
from registry.ports import running_node
from routerproject.api import (
    BodySerializer,
    SiteAPIView,
    StrictBooleanField,
    StrictCharField,
    StrictListField,
    error_response,
    validated,
)
from routerproject.errors import RouterError

NODE_SITE = "/router/v1/node/site/model-assets"


def _service() -> AssetService:
    # The running node carries its asset service (proxy.node.Node.assets).
    return cast(AssetService, cast(Any, running_node()).assets)


class _Target(BodySerializer):
    node_id = StrictCharField(
        required=False, allow_blank=True, help_text="The node that holds the config; default here."
    )
    node_url = StrictCharField(
        required=False,
        allow_blank=True,
        help_text="Must equal the registered URL of `node_id` when given.",
    )


class ExportSerializer(_Target):
    id = StrictCharField(help_text="Local model ID (config file stem) on that node.")


class ResolveSerializer(_Target):
    id = StrictCharField(help_text="Local model ID of a portable config on that node.")
    wait = StrictBooleanField(
        required=False, default=False, help_text="Answer once the job has finished."
    )


class ResolveBatchSerializer(_Target):
    ids = StrictListField(
        child=StrictCharField(),
        min_length=1,
        max_length=LOOKUP_MAX_HASHES,
        help_text="Local model IDs of portable configs on that node.",
    )
    wait = StrictBooleanField(required=False, default=False)


class BindSerializer(_Target):
    sha256 = StrictCharField(help_text="64 lower-case hex characters.")
    repository = StrictCharField(help_text="owner/name on the hub (HF_ENDPOINT).")
    repository_path = StrictCharField(help_text="The file's path in the repository.")
    commit = StrictCharField(help_text="40 lower-case hex characters.")
    token = StrictCharField(required=False, help_text="A hub token for a gated repository.")


class SubstituteSerializer(BindSerializer):
    id = StrictCharField(help_text="Local model ID of the config to rewrite.")
    field = StrictCharField(help_text="The path field, e.g. model_param.")
    position = serializers.IntegerField(required=False, help_text="Index in a list field.")
    expected_sha256 = StrictCharField(help_text="The hash the config must still hold there.")
    confirm = StrictBooleanField(help_text="Must be true: the config file is rewritten.")


class BindResultSerializer(serializers.Serializer):
    sha256 = serializers.CharField()
    hf = serializers.CharField(help_text="hf://owner/repo@<commit>/<path>")


class TransferSerializer(serializers.Serializer):
    sha256 = serializers.CharField()
    filename = serializers.CharField()
    node_url = serializers.CharField(help_text="The peer it comes from.")
    bytes_total = serializers.IntegerField()
    bytes_done = serializers.IntegerField()
    resumed_from = serializers.IntegerField(help_text="Bytes kept from an earlier attempt.")
    state = serializers.ChoiceField(["running", "done", "failed"])
    error = serializers.CharField()


class FieldResultSerializer(serializers.Serializer):
    field = serializers.CharField(help_text="The config's path field, e.g. model_param.")
    position = serializers.IntegerField(allow_null=True, help_text="Index in a list field.")
    sha256 = serializers.CharField()
    filename = serializers.CharField()
    resolved = serializers.BooleanField()
    # Named like a DRF Field attribute: the metaclass takes it as a field all the same.
    source = serializers.CharField(  # type: ignore[assignment]
        help_text="local_sha256, file_root_sha256 or peer_sha256 once resolved."
    )
    verification = serializers.CharField()
    error = serializers.CharField()
    transfer = TransferSerializer(allow_null=True)


class JobSerializer(serializers.Serializer):
    id = serializers.CharField()
    node_id = serializers.CharField()
    model_id = serializers.CharField()
    state = serializers.ChoiceField(["running", "done", "failed"])
    error = serializers.CharField()
    created = serializers.FloatField()
    finished = serializers.FloatField(allow_null=True)
    # Named like a Serializer attribute: the metaclass takes it as a field all the same.
    fields = FieldResultSerializer(many=True)  # type: ignore[assignment]


class JobListSerializer(serializers.Serializer):
    jobs = JobSerializer(many=True)


class ServedSerializer(serializers.Serializer):
    streams = serializers.IntegerField(help_text="Asset streams this node has served.")
    bytes = serializers.IntegerField()


class AssetStatusSerializer(serializers.Serializer):
    node_id = serializers.CharField()
    jobs = JobSerializer(many=True, help_text="Newest first; the last 200.")
    transfers = TransferSerializer(many=True)
    served = ServedSerializer()


class ExportResultSerializer(serializers.Serializer):
    config = serializers.DictField(
        help_text="The config with each path field F as F_hash and F_filename."
    )


TARGET_ERRORS = {
    400: error_response(
        "A field is missing or malformed, the node is not registered, or node_url does not "
        "match it; `param` names the field. Nothing is called."
    ),
    404: error_response("The model is not a config on that node, or this node is a slave."),
    502: error_response("The node did not answer."),
}


def _target(data: dict[str, Any]) -> str | None:
    # Read before the body's own serializer (the node it names checks the rest), so the two
    # fields are held to their types here: a list is no node.
    named = {key: data[key] for key in ("node_id", "node_url") if data.get(key) is not None}
    fields = validated(_Target(data=named))
    return target_node(
        running_node(), fields.get("node_id") or None, fields.get("node_url") or None
    )


async def _here_or_there(
    request: Request,
    suffix: str,
    local: Callable[[AssetService, Mapping[str, Any]], Awaitable[dict[str, Any]]],
) -> Response:
    """A hub-origin write on the node its body names (through the node route), else here; the
    other node checks the fields itself, so the body goes as it came."""
    if not isinstance(request.data, dict):
        raise RouterError(400, "request body must be a JSON object")
    doc = dict(request.data)
    url = _target(doc)
    if url is not None:
        return Response(await remote_call(running_node(), url, "POST", NODE_SITE + suffix, doc))
    return Response(await local(_service(), doc))


def _node_named(doc: Mapping[str, Any]) -> str:
    return str(doc.get("node_id") or running_node().node_id)


async def _audit_resolve(request: Request, data: Mapping[str, Any], jobs: list[Any]) -> None:
    """One row per resolve call: it may fetch weights onto the node and rewrite its configs."""
    ids = [str(data["id"])] if "id" in data else [str(i) for i in data.get("ids", [])]
    target = f"{_node_named(data)}/{','.join(ids)}"
    await aaudit_request(request, "asset.resolve", target, None, {"jobs": jobs})


class ExportView(SiteAPIView):
    @extend_schema(
        operation_id="modelAssetsExport",
        summary="A model config in portable form (weights by SHA-256 and file name)",
        description="Every file the config names is hashed (cached) and indexed on its node, "
        "so peers can fetch it by hash.",
        request=ExportSerializer,
        responses={
            200: OpenApiResponse(ExportResultSerializer, "The portable config."),
            **TARGET_ERRORS,
            409: error_response("A weights file cannot be read (code model_asset_missing)."),
        },
    )
    async def post(self, request: Request) -> Response:
        body = ExportSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        url = _target(data)
        if url is not None:
            doc = {"node_id": data["node_id"], "id": data["id"]}
            return Response(
                await remote_call(running_node(), url, "POST", NODE_SITE + "/export", doc)
            )
        return Response({"config": await _service().export(data["id"])})


class ResolveView(SiteAPIView):
    @extend_schema(
        operation_id="modelAssetsResolve",
        summary="Resolve a portable config's weights on its node",
        description="Local index, then files below models.file_roots with the same name, then "
        "a cluster peer (streamed into models.shared_dir, verified). One job per config runs at "
        "a time; asking again joins it.",
        request=ResolveSerializer,
        responses={200: OpenApiResponse(JobSerializer, "The job."), **TARGET_ERRORS},
    )
    async def post(self, request: Request) -> Response:
        body = ResolveSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        url = _target(data)
        if url is not None:
            doc = {"node_id": data["node_id"], "id": data["id"], "wait": data["wait"]}
            job = await remote_call(running_node(), url, "POST", NODE_SITE + "/resolve", doc)
        else:
            job = await local_resolve(_service(), data["id"], wait=data["wait"])
        await _audit_resolve(request, data, [job])
        return Response(job)


class ResolveBatchView(SiteAPIView):
    @extend_schema(
        operation_id="modelAssetsResolveBatch",
        summary="Resolve several portable configs of one node",
        request=ResolveBatchSerializer,
        responses={200: OpenApiResponse(JobListSerializer, "One job per config."), **TARGET_ERRORS},
    )
    async def post(self, request: Request) -> Response:
        body = ResolveBatchSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        url = _target(data)
        jobs = []
        for model_id in data["ids"]:
            if url is not None:
                doc = {"node_id": data["node_id"], "id": model_id, "wait": data["wait"]}
                jobs.append(
                    await remote_call(running_node(), url, "POST", NODE_SITE + "/resolve", doc)
                )
            else:
                jobs.append(await local_resolve(_service(), model_id, wait=data["wait"]))
        await _audit_resolve(request, data, jobs)
        return Response({"jobs": jobs})


NODE_PARAMETERS = [
    OpenApiParameter("node_id", str, description="Another node to ask; default this node."),
    OpenApiParameter("node_url", str, description="Must match node_id's registered URL."),
]


class JobsView(SiteAPIView):
    @extend_schema(
        operation_id="modelAssetsJobs",
        summary="A node's resolution jobs, its transfers and the streams it served",
        parameters=NODE_PARAMETERS,
        responses={200: OpenApiResponse(AssetStatusSerializer, "The status."), **TARGET_ERRORS},
    )
    async def get(self, request: Request) -> Response:
        url = _target(dict(request.query_params.items()))
        if url is not None:
            return Response(await remote_call(running_node(), url, "GET", NODE_SITE + "/jobs"))
        return Response(_service().status())


class JobView(SiteAPIView):
    @extend_schema(
        operation_id="modelAssetsJob",
        summary="One resolution job",
        parameters=NODE_PARAMETERS,
        responses={
            200: OpenApiResponse(JobSerializer, "The job."),
            **TARGET_ERRORS,
            404: error_response("The job is not known (or this node is a slave)."),
        },
    )
    async def get(self, request: Request, job_id: str) -> Response:
        url = _target(dict(request.query_params.items()))
        if url is not None:
            path = f"{NODE_SITE}/jobs/{job_id}"
            return Response(await remote_call(running_node(), url, "GET", path))
        return Response(local_job(_service(), job_id))


class BindView(SiteAPIView):
    @extend_schema(
        operation_id="modelAssetsBind",
        summary="Bind a Hugging Face origin to a hash, once the hub vouches for it",
        description="The revision must resolve to `commit` and the file at `repository_path` "
        "must have the LFS hash `sha256`. A portable reference to that hash without an origin "
        "of its own is then fetched from there when no node has it.",
        request=BindSerializer,
        responses={
            200: OpenApiResponse(BindResultSerializer, "Bound."),
            **TARGET_ERRORS,
            400: error_response(
                "A field is missing, malformed or unknown; or the hub does not vouch for the "
                "hash there (code model_asset_mismatch). Nothing is stored."
            ),
        },
    )
    async def post(self, request: Request) -> Response:
        answer = await _here_or_there(request, "/bind", local_bind)
        doc = cast(dict[str, Any], request.data)
        target = f"{_node_named(doc)} sha256 {answer.data.get('sha256', '')}"
        await aaudit_request(request, "asset.bind", target, None, answer.data)
        return answer


class SubstituteView(SiteAPIView):
    @extend_schema(
        operation_id="modelAssetsSubstitute",
        summary="Point one portable reference of a config at a verified hub file",
        description="The hub must vouch for `sha256` at `commit` and `repository_path` (else "
        "400 model_asset_mismatch). Under a per-config lock, the config must still hold "
        "`expected_sha256` there and be unchanged on disk until it is rewritten (else 409 "
        "model_asset_conflict); the origin is bound, the file rewritten atomically (a list "
        "keeps its length) and the node's registry refreshed.",
        request=SubstituteSerializer,
        responses={
            200: OpenApiResponse(BindResultSerializer, "Substituted."),
            **TARGET_ERRORS,
            400: error_response(
                "A field is missing, malformed or unknown, confirm is not true, or the hub "
                "does not vouch for the hash (code model_asset_mismatch). Nothing changed."
            ),
            409: error_response(
                "The config holds another hash there now, or changed meanwhile (code "
                "model_asset_conflict). Nothing changed."
            ),
        },
    )
    async def post(self, request: Request) -> Response:
        answer = await _here_or_there(request, "/substitute", local_substitute)
        doc = cast(dict[str, Any], request.data)
        where = f"{doc.get('field')}" + (
            f"[{doc['position']}]" if doc.get("position") is not None else ""
        )
        target = f"{_node_named(doc)}/{doc.get('id')} {where}"
        before = {"sha256": doc.get("expected_sha256")}
        await aaudit_request(request, "asset.substitute", target, before, answer.data)
        return answer


class AssetLookupResultSerializer(serializers.Serializer):
    sha256 = serializers.CharField()
    assets = serializers.ListField(
        child=serializers.DictField(),
        help_text="{sha256, filename, size, node_url} per node that holds a verified copy.",
    )


class AssetLookupView(SiteAPIView):
    @extend_schema(
        operation_id="modelAssetsLookup",
        summary="Which nodes hold a verified copy of a hash",
        description="Without node_id a master asks every healthy node (one deadline, "
        "models.asset_lookup_timeout); with it, only that node.",
        parameters=NODE_PARAMETERS,
        responses={
            200: OpenApiResponse(AssetLookupResultSerializer, "The holders."),
            **TARGET_ERRORS,
        },
    )
    async def get(self, request: Request, sha256: str) -> Response:
        from registry.assets.service import LOOKUP_PATH
        from registry.assets.store import check_sha256

        check_sha256(sha256, "sha256")
        query = dict(request.query_params.items())
        url = _target(query)
        if url is not None:
            doc = await remote_call(running_node(), url, "POST", LOOKUP_PATH, {"hashes": [sha256]})
            return Response({"sha256": sha256, "assets": doc.get("assets", [])})
        service = _service()
        if running_node().role == "master" and not query.get("node_id"):
            return Response({"sha256": sha256, "assets": await service.lookup_cluster([sha256])})
        return Response({"sha256": sha256, "assets": await service.lookup_local([sha256])})
