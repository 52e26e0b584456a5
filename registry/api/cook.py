"""Site routes of the split recipes (`/router/v1/site/cook/...`, reference-cluster §8.1)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from access.audit import aaudit_request
from registry import cook
from registry.ports import running_node
from routerproject.api import SiteAPIView, error_response
from routerproject.errors import RouterError


class ComponentInSerializer(serializers.Serializer):
    kind = serializers.ChoiceField(["text", "image", "embeddings", "voice", "music"])
    node_id = serializers.CharField(help_text="A node of the cluster (this one included).")
    node_url = serializers.CharField(
        required=False, help_text="Must equal the node's registered URL when given."
    )
    model_id = serializers.CharField(
        required=False, help_text="The config's local ID on that node."
    )
    image_id = serializers.CharField(
        required=False, help_text="For an image component: its image ID instead of model_id."
    )


class CookSerializer(serializers.Serializer):
    id = serializers.CharField(help_text="Letters, digits, '.', '_' or '-'; at most 128.")
    overwrite = serializers.BooleanField(
        required=False, help_text="Replace a recipe of that ID (apply only)."
    )
    public_id = serializers.CharField(required=False, help_text="Default: the ID.")
    public_image_id = serializers.CharField(
        required=False, help_text="The ID image requests may name."
    )
    components = ComponentInSerializer(many=True, help_text="On at least two nodes.")
    options = serializers.DictField(required=False, help_text="Kept with the recipe.")


class ComponentSerializer(serializers.Serializer):
    kind = serializers.ChoiceField(["text", "image", "embeddings", "voice", "music"])
    node_id = serializers.CharField()
    model_id = serializers.CharField()
    image_id = serializers.CharField()
    config_filename = serializers.CharField()


class StoredRecipeSerializer(serializers.Serializer):
    id = serializers.CharField()
    public_id = serializers.CharField()
    public_image_id = serializers.CharField(required=False)
    created = serializers.IntegerField()
    text = ComponentSerializer(required=False)
    image = ComponentSerializer(required=False)
    embeddings = ComponentSerializer(required=False)
    voice = ComponentSerializer(required=False)
    music = ComponentSerializer(required=False)


class PreviewSerializer(serializers.Serializer):
    recipe = StoredRecipeSerializer()
    exists = serializers.BooleanField(help_text="Apply needs overwrite: true.")


class ApplySerializer(serializers.Serializer):
    recipe = StoredRecipeSerializer()


class DeletedSerializer(serializers.Serializer):
    ok = serializers.BooleanField()
    deleted = serializers.CharField()


BAD_RECIPE = error_response(
    "A field is missing or wrong: an unknown node, a node_url that does not match it, a model "
    "the node lacks or that cannot serve the kind, one node only, an ID already in use; "
    "`param` names the field. Nothing is stored."
)


def _body(request: Request) -> dict[str, Any]:
    if not isinstance(request.data, dict):
        raise RouterError(400, "request body must be a JSON object")
    return dict(request.data)


class CookPreviewView(SiteAPIView):
    @extend_schema(
        operation_id="cookPreview",
        summary="Check a split recipe and show what would be stored",
        request=CookSerializer,
        responses={200: OpenApiResponse(PreviewSerializer, "The recipe."), 400: BAD_RECIPE},
    )
    async def post(self, request: Request) -> Response:
        return Response(await cook.preview(running_node(), _body(request)))


class CookApplyView(SiteAPIView):
    @extend_schema(
        operation_id="cookApply",
        summary="Store a split recipe; requests route by it at once",
        request=CookSerializer,
        responses={
            200: OpenApiResponse(ApplySerializer, "The stored recipe."),
            400: BAD_RECIPE,
            409: error_response("The ID exists and overwrite is not true (code recipe_exists)."),
        },
    )
    async def post(self, request: Request) -> Response:
        body, node = _body(request), running_node()
        before = await cook.stored(node, body.get("id"))
        result = await cook.apply(node, body)
        recipe = result["recipe"]
        action = "recipe.update" if before else "recipe.create"
        await aaudit_request(request, action, str(recipe["id"]), before, recipe)
        return Response(result)


class CookDeleteView(SiteAPIView):
    @extend_schema(
        operation_id="cookDelete",
        summary="Delete a split recipe",
        responses={
            200: OpenApiResponse(DeletedSerializer, "Deleted."),
            404: error_response("No recipe has that ID (or this node is a slave)."),
        },
    )
    async def delete(self, request: Request, recipe_id: str) -> Response:
        node = running_node()
        before = await cook.stored(node, recipe_id)
        result = await cook.delete(node, recipe_id)
        await aaudit_request(request, "recipe.delete", recipe_id, before, None)
        return Response(result)
