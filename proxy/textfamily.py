"""Text-lane path families beyond chat and completions (issue: the whole inference surface).

Responses, Anthropic-style messages, rerank, Kobold extras, music, and the embeddings family;
`ROUTES` is joined into the client table by `proxy.routes`.
"""

from __future__ import annotations

from proxy.handlers import Route

ROUTES: dict[str, Route] = {}
