"""Voice path families: speech, translations, voices, Kobold TTS and transcription.

`ROUTES` is joined into the client table by `proxy.routes`; the `/v1/realtime` WebSocket is
`proxy.realtime`.
"""

from __future__ import annotations

from proxy.handlers import Route

ROUTES: dict[str, Route] = {}
