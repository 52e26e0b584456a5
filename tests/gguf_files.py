"""Small real GGUF files for tests, written with the `gguf` package's own writer."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np


def write_gguf(
    path: Path,
    arch: str,
    *,
    context: int | None = None,
    template: str | None = None,
    pooling: gguf.PoolingType | None = None,
) -> Path:
    """A GGUF of one tiny tensor whose header holds what a model's would (those given)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(path), arch)
    if context is not None:
        writer.add_context_length(context)
    if template is not None:
        writer.add_chat_template(template)
    if pooling is not None:
        writer.add_pooling_type(pooling)
    writer.add_tensor("weight", np.zeros((8,), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
