"""Image and video path families: OpenAI images, sdapi, sdcpp jobs and ComfyUI.

`ROUTES` is joined into the client table by `proxy.routes`.
"""

from __future__ import annotations

from proxy.handlers import Route

ROUTES: dict[str, Route] = {}
