"""The node's own model catalog: every `.kcpps` in `models.config_dir`, indexed for routing.

Built once at startup; lookups on the request path are plain
dict reads.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from registry.hashing import FileHasher
from registry.kcpps import ModelConfig, ModelConfigError, scan_config_dir

logger = logging.getLogger(__name__)


@dataclass
class LocalCatalog:
    configs: dict[str, ModelConfig] = field(default_factory=dict)
    """Local model ID (the file stem) → config."""
    image_ids: dict[str, ModelConfig] = field(default_factory=dict)
    errors: list[ModelConfigError] = field(default_factory=list)

    @classmethod
    def scan(cls, config_dir: Path, *, default_backend_mode: str, store_dir: Path) -> LocalCatalog:
        hasher = FileHasher(store_dir / "hash-cache.json")
        configs, errors = scan_config_dir(
            config_dir, default_backend_mode=default_backend_mode, hasher=hasher
        )
        hasher.save()
        for err in errors:
            logger.warning("skipping model config: %s", err)
        catalog = cls(errors=list(errors))
        for cfg in configs:
            catalog.configs[cfg.local_id] = cfg
            if cfg.image_id:
                catalog.image_ids[cfg.image_id] = cfg
        return catalog

    def text_model(self, model_id: str) -> ModelConfig | None:
        cfg = self.configs.get(model_id)
        if cfg is not None and (cfg.has_llm or cfg.has_embeddings):
            return cfg
        return None

    def image_model(self, model_id: str) -> ModelConfig | None:
        cfg = self.image_ids.get(model_id)
        if cfg is None:
            # Clients often name the config rather than its derived image ID; both are accepted.
            cfg = self.configs.get(model_id)
        if cfg is not None and cfg.has_image:
            return cfg
        return None
