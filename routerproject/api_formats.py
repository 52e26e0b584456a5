"""How the management API reads and writes JSON, in DRF's terms.

DRF imports these classes from its settings while it defines `APIView`, so this module must not
import any view module (the shared views live in `routerproject.api`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import orjson
from django.core.serializers.json import DjangoJSONEncoder
from rest_framework import exceptions
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.parsers import BaseParser
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request


class JSONBodyParser(BaseParser):
    """Any body is read as JSON, whatever its content type says, as the views always did."""

    media_type = "application/json"

    def parse(
        self,
        stream: Any,
        media_type: str | None = None,
        parser_context: Mapping[str, Any] | None = None,
    ) -> Any:
        raw = stream.read()
        if not raw.strip():
            return {}
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise exceptions.ParseError(f"invalid JSON body: {exc}") from exc


class JSONBodyRenderer(JSONRenderer):
    """The bytes Django's `JsonResponse` wrote before the move to DRF: same encoder, separators
    and ASCII escaping, and NaN allowed (a fit can hold one)."""

    encoder_class = DjangoJSONEncoder
    ensure_ascii = True
    compact = False
    strict = False


class FirstChoiceNegotiation(BaseContentNegotiation):
    """One parser and one renderer per view: a client's Accept or Content-Type header cannot
    turn an answer into 406 or 415."""

    def select_parser(self, request: Request, parsers: Iterable[BaseParser]) -> BaseParser | None:
        return next(iter(parsers), None)

    def select_renderer(
        self, request: Request, renderers: Iterable[BaseRenderer], format_suffix: str | None = None
    ) -> tuple[BaseRenderer, str]:
        renderer = next(iter(renderers))
        return renderer, renderer.media_type
