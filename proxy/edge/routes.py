"""The client route table: every path family the proxy serves, and how a path finds its route.

Each path family keeps its own table (`proxy.families.text.routes`, and the media and voice
families' `handlers`); this module joins them with the operator's probes (`proxy.observe`). A
key is either a literal path or a template: `{name}` matches one path segment, and a last
segment `{path}` matches the rest of the path, slashes included. A literal path wins over any
template, and a template with a longer literal prefix wins over a shorter one, so `/v1/{path}`
(the text catch-all) only takes what no other family claims.
"""

from __future__ import annotations

import re

from proxy.families.media import handlers as media
from proxy.families.text import routes as text
from proxy.families.text.kobold import KOBOLD_PREFIXES
from proxy.families.voice import handlers as voice
from proxy.observe import health
from proxy.serving.core import GET, Route

__all__ = ["ROUTES", "Route", "route_for"]

ROUTES: dict[str, Route] = {
    "/ping": (GET, health.handle_ping, False),
    # Operations: orchestrators' probes need no key; /metrics checks the admin key itself.
    "/healthz": (GET, health.handle_healthz, False),
    "/readyz": (GET, health.handle_readyz, False),
    "/metrics": (GET, health.handle_metrics, False),
    **text.ROUTES,
    **media.ROUTES,
    **voice.ROUTES,
}

_EXACT: dict[str, Route] = {key: route for key, route in ROUTES.items() if "{" not in key}


def _pattern(template: str) -> re.Pattern[str]:
    parts = []
    for piece in re.split(r"(\{[a-z_]+\})", template):
        if piece == "{path}" and template.endswith(piece):
            parts.append(r".+")
        elif piece.startswith("{") and piece.endswith("}"):
            parts.append(r"[^/]+")
        else:
            parts.append(re.escape(piece))
    return re.compile("".join(parts))


def _literal_prefix(template: str) -> int:
    return template.index("{")


_TEMPLATES: list[tuple[re.Pattern[str], Route]] = [
    (_pattern(key), ROUTES[key])
    for key in sorted((k for k in ROUTES if "{" in k), key=lambda k: (-_literal_prefix(k), k))
]


def route_for(path: str) -> Route | None:
    """The route of a client path, or None when it is not a client path."""
    route = _EXACT.get(path)
    if route is not None:
        return route
    for pattern, templated in _TEMPLATES:
        if pattern.fullmatch(path):
            return templated
    if path.startswith("/api/") and not path.startswith(KOBOLD_PREFIXES):
        return text.UNKNOWN_OLLAMA
    return None
