"""OpenAPI paths of the media family (`proxy.mediafamily`), joined by `proxy.client_schema`."""

from __future__ import annotations

from typing import Any

Schema = dict[str, Any]


def paths() -> dict[str, Schema]:
    """The family's client paths, keyed as in `proxy.routes.ROUTES`."""
    return {}
