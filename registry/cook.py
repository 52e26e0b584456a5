"""Creating, deleting and loading split recipes (reference-cluster §8.1).

`POST /router/v1/site/cook/preview` checks a recipe and answers what would be stored;
`/apply` stores it in `<store_dir>/split-recipes.json` (written to a temporary file, synced and
renamed, so a reader sees the old file or the new one, never half of one) and routes by it at
once; `DELETE /router/v1/site/cook/<id>` removes it. `POST /router/v1/load` with a recipe's ID
loads its components, each on its own node.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from registry.ports import RegistryNode
from registry.recipes import COMPONENT_KINDS, RECIPES_FILE, Recipe, load_recipes
from routerproject.errors import RouterError

RECIPE_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
# The order an explicit load follows: the text model first, as the reference does.
LOAD_ORDER = ("text", "embeddings", "image", "voice", "music")
# Which record flag a component of each kind needs; music has no capability flag yet.
KIND_FLAG = {
    "text": "has_llm",
    "image": "has_image",
    "embeddings": "has_embeddings",
    "voice": "has_voice",
}

_lock = asyncio.Lock()


def _bad(message: str, param: str) -> RouterError:
    return RouterError(400, message, param=param)


def _records_of(node: RegistryNode, node_id: str) -> list[Mapping[str, Any]]:
    if node_id == node.node_id:
        return list(node.local_records())
    remote = node.cluster.nodes.get(node_id)
    return list(remote.records) if remote is not None else []


def _check_node(node: RegistryNode, comp: Mapping[str, Any], param: str) -> str:
    from registry.assets.routes import target_node

    node_id = comp.get("node_id")
    if not isinstance(node_id, str) or not node_id:
        raise _bad(f"{param}.node_id is required", f"{param}.node_id")
    node_url = comp.get("node_url")
    if node_url is not None and not isinstance(node_url, str):
        raise _bad(f"{param}.node_url must be a string", f"{param}.node_url")
    try:
        target_node(node, node_id, node_url or None)
    except RouterError as exc:
        raise _bad(exc.message, f"{param}.{exc.param or 'node_id'}") from exc
    return node_id


def _component(node: RegistryNode, comp: Any, index: int) -> dict[str, Any]:
    param = f"components[{index}]"
    if not isinstance(comp, dict):
        raise _bad(f"{param} must be an object", param)
    kind = comp.get("kind")
    if kind not in COMPONENT_KINDS:
        raise _bad(f"{param}.kind must be one of {', '.join(COMPONENT_KINDS)}", f"{param}.kind")
    node_id = _check_node(node, comp, param)
    model_id = comp.get("model_id")
    image_id = comp.get("image_id")
    for key, value in (("model_id", model_id), ("image_id", image_id)):
        if value is not None and not isinstance(value, str):
            raise _bad(f"{param}.{key} must be a string", f"{param}.{key}")
    if not model_id and not image_id:
        raise _bad(f"{param}.model_id is required", f"{param}.model_id")
    record = next(
        (
            r
            for r in _records_of(node, node_id)
            if (model_id and r.get("local_id") == model_id)
            or (not model_id and image_id and r.get("image_id") == image_id)
        ),
        None,
    )
    if record is None:
        field = "model_id" if model_id else "image_id"
        raise _bad(
            f'{param}.{field}: node "{node_id}" has no model {model_id or image_id!r}',
            f"{param}.{field}",
        )
    flag = KIND_FLAG.get(str(kind))
    if flag is not None and not record.get(flag):
        raise _bad(
            f'{param}.model_id: model "{record.get("local_id")}" on node "{node_id}" cannot '
            f"serve {kind} requests",
            f"{param}.model_id",
        )
    return {
        "kind": kind,
        "node_id": node_id,
        "model_id": str(record.get("local_id", "")),
        "image_id": str(record.get("image_id") or "") if kind == "image" else "",
        "config_filename": str(record.get("filename", "")),
    }


def _load_doc(store_dir: Path) -> list[dict[str, Any]]:
    path = store_dir / RECIPES_FILE
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:
        raise RouterError(
            500, f"{path} cannot be read: {exc}; fix or remove it first", type="server_error"
        ) from exc
    recipes = doc.get("recipes") if isinstance(doc, dict) else None
    return [r for r in recipes if isinstance(r, dict)] if isinstance(recipes, list) else []


def _write_doc(store_dir: Path, recipes: list[dict[str, Any]]) -> None:
    store_dir.mkdir(parents=True, exist_ok=True)
    path = store_dir / RECIPES_FILE
    fd, tmp = tempfile.mkstemp(prefix=RECIPES_FILE + ".", suffix=".tmp", dir=store_dir)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump({"recipes": recipes}, handle, indent=2, sort_keys=True)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def build_recipe(node: RegistryNode, body: Mapping[str, Any]) -> dict[str, Any]:
    """The recipe a preview or apply body describes, checked against the cluster now."""
    recipe_id = body.get("id")
    if not isinstance(recipe_id, str) or not RECIPE_ID_RE.fullmatch(recipe_id):
        raise _bad("id is required: letters, digits, '.', '_' or '-', at most 128 characters", "id")
    options = body.get("options")
    if options is not None and not isinstance(options, dict):
        raise _bad("options must be an object", "options")
    options = options or {}
    public_id = body.get("public_id", options.get("public_id")) or recipe_id
    public_image_id = body.get("public_image_id", options.get("public_image_id")) or ""
    for key, value in (("public_id", public_id), ("public_image_id", public_image_id)):
        if not isinstance(value, str) or (value and not RECIPE_ID_RE.fullmatch(value)):
            raise _bad(f"{key} must be a model ID (letters, digits, '.', '_' or '-')", key)
    components = body.get("components")
    if not isinstance(components, list) or not components:
        raise _bad("components must be a non-empty list", "components")
    recipe: dict[str, Any] = {"id": recipe_id, "public_id": public_id}
    if public_image_id:
        recipe["public_image_id"] = public_image_id
    nodes: set[str] = set()
    for index, raw in enumerate(components):
        comp = _component(node, raw, index)
        if comp["kind"] in recipe:
            raise _bad(
                f"components[{index}].kind: a recipe has one {comp['kind']} component",
                f"components[{index}].kind",
            )
        recipe[comp["kind"]] = comp
        nodes.add(comp["node_id"])
    if len(nodes) < 2:
        raise _bad(
            "components must live on at least two nodes: one node's config already serves "
            "everything it holds",
            "components",
        )
    for key in ("public_id", "public_image_id"):
        value = recipe.get(key)
        if value and (
            value in node.cluster.by_public_id or value in node.cluster.by_public_image_id
        ):
            raise _bad(f"{key} {value!r} is already the ID of a model of the cluster", key)
    if options:
        recipe["options"] = options
    return recipe


async def preview(node: RegistryNode, body: Mapping[str, Any]) -> dict[str, Any]:
    recipe = build_recipe(node, body)
    recipe["created"] = int(time.time())
    return {"recipe": recipe, "exists": recipe["id"] in {r.id for r in node.recipes.values()}}


def _install(node: RegistryNode, recipes: dict[str, Recipe]) -> None:
    table = node.recipes
    assert isinstance(table, dict)  # the node's own table, replaced in place
    table.clear()
    table.update(recipes)


async def stored(node: RegistryNode, recipe_id: object) -> dict[str, Any] | None:
    """The stored recipe of that ID, if any (what an apply or delete is about to change)."""
    recipes = await asyncio.to_thread(_load_doc, Path(node.config.cluster.store_dir))
    return next((r for r in recipes if r.get("id") == recipe_id), None)


async def apply(node: RegistryNode, body: Mapping[str, Any]) -> dict[str, Any]:
    overwrite = body.get("overwrite", False)
    if not isinstance(overwrite, bool):
        raise _bad("overwrite must be true or false", "overwrite")
    recipe = build_recipe(node, body)
    store_dir = Path(node.config.cluster.store_dir)
    async with _lock:
        existing = await asyncio.to_thread(_load_doc, store_dir)
        others = [r for r in existing if r.get("id") != recipe["id"]]
        if len(others) != len(existing) and not overwrite:
            raise RouterError(
                409,
                f'recipe "{recipe["id"]}" exists; send "overwrite": true to replace it',
                param="id",
                code="recipe_exists",
            )
        taken = {
            str(r.get(key))
            for r in others
            for key in ("id", "public_id", "public_image_id")
            if r.get(key)
        }
        for key in ("public_id", "public_image_id"):
            if recipe.get(key) in taken:
                raise _bad(f"{key} {recipe[key]!r} is already used by another recipe", key)
        recipe["created"] = int(time.time())
        await asyncio.to_thread(_write_doc, store_dir, [*others, recipe])
        _install(node, load_recipes(store_dir))
    return {"recipe": recipe}


async def delete(node: RegistryNode, recipe_id: str) -> dict[str, Any]:
    store_dir = Path(node.config.cluster.store_dir)
    async with _lock:
        existing = await asyncio.to_thread(_load_doc, store_dir)
        others = [r for r in existing if r.get("id") != recipe_id]
        if len(others) == len(existing):
            raise RouterError(
                404, f'recipe "{recipe_id}" does not exist', type="not_found", param="id"
            )
        await asyncio.to_thread(_write_doc, store_dir, others)
        _install(node, load_recipes(store_dir))
    return {"ok": True, "deleted": recipe_id}


async def load(node: RegistryNode, recipe: Recipe) -> dict[str, Any]:
    """Load the recipe's components, text first, skipping one already loaded by this call."""
    from registry.services import model_load_local, remote_load

    started = time.monotonic()
    done: list[dict[str, Any]] = []
    seen: set[tuple[str, str, str]] = set()
    for kind in LOAD_ORDER:
        comp = recipe.components.get(kind)
        if comp is None:
            continue
        key = (comp.node_id, comp.config_filename, comp.model_id)
        if key in seen:
            done.append(
                {"kind": kind, "node_id": comp.node_id, "model": comp.model_id, "skipped": True}
            )
            continue
        seen.add(key)
        record = next(
            (r for r in _records_of(node, comp.node_id) if r.get("local_id") == comp.model_id),
            None,
        )
        if record is None:
            raise RouterError(
                404, f'recipe "{recipe.id}" uses a model that is not available', type="not_found"
            )
        if record.get("disabled"):
            raise RouterError(404, f'recipe "{recipe.id}" uses a disabled model', type="not_found")
        if comp.node_id == node.node_id:
            result = await model_load_local(node=node, model_id=comp.model_id)
        else:
            remote = node.cluster.nodes[comp.node_id]
            if not remote.healthy:
                raise RouterError(
                    503,
                    f'recipe "{recipe.id}" needs node {comp.node_id}, which is not healthy',
                    type="backend_error",
                    code="node_unavailable",
                )
            result = await remote_load(node, remote.node_url, comp.model_id)
        done.append(
            {
                "kind": kind,
                "node_id": comp.node_id,
                "model": comp.model_id,
                "lanes": result.get("lanes", []),
                "skipped": False,
            }
        )
    return {
        "ok": True,
        "model": recipe.public_id,
        "recipe": recipe.id,
        "components": done,
        "duration_ms": round((time.monotonic() - started) * 1000.0, 1),
    }
