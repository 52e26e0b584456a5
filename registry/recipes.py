"""Split recipes: one public model made of components that live on different nodes.

A master routes a request that names a recipe to the node owning the component its path
needs (text, image, embeddings, voice) under the component's own model ID, and answers under
the recipe's public ID. Recipes are stored in `<cluster.store_dir>/split-recipes.json`
(`{"recipes": [...]}`), written by the cook routes (registry/cook.py). Unlike
the reference, a component's node health is checked before forwarding, so a down node gives a
clean 503 instead of a transport error.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

RECIPES_FILE = "split-recipes.json"
COMPONENT_KINDS = ("text", "image", "embeddings", "voice", "music")


@dataclass(frozen=True)
class Component:
    kind: str
    node_id: str
    model_id: str
    image_id: str
    config_filename: str


@dataclass(frozen=True)
class Recipe:
    id: str
    public_id: str
    public_image_id: str
    components: dict[str, Component]

    def component(self, kind: str) -> Component | None:
        if kind == "embeddings":
            return self.components.get("embeddings") or self.components.get("text")
        return self.components.get(kind)


def _component(kind: str, raw: Any) -> Component | None:
    if not isinstance(raw, dict) or not isinstance(raw.get("node_id"), str):
        return None
    return Component(
        kind=kind,
        node_id=raw["node_id"],
        model_id=str(raw.get("model_id") or ""),
        image_id=str(raw.get("image_id") or ""),
        config_filename=str(raw.get("config_filename") or ""),
    )


def load_recipes(store_dir: Path) -> dict[str, Recipe]:
    """Recipes by every public ID they answer to (text and image IDs)."""
    path = store_dir / RECIPES_FILE
    if not path.exists():
        return {}
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        logger.warning("ignoring %s: %s", path, exc)
        return {}
    out: dict[str, Recipe] = {}
    for raw in doc.get("recipes", []) if isinstance(doc, dict) else []:
        if not isinstance(raw, dict) or not isinstance(raw.get("id"), str):
            continue
        components = {}
        for kind in COMPONENT_KINDS:
            comp = _component(kind, raw.get(kind))
            if comp is not None:
                components[kind] = comp
        recipe = Recipe(
            id=raw["id"],
            public_id=str(raw.get("public_id") or raw["id"]),
            public_image_id=str(raw.get("public_image_id") or ""),
            components=components,
        )
        out[recipe.public_id] = recipe
        if recipe.public_image_id:
            out[recipe.public_image_id] = recipe
    return out
