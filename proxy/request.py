"""One client request in flight (`Ctx`), the ASGI types it is made of, and its JSON body.

Every layer of the proxy handles a request through this: the edge makes it, the families and
the serving core read it, forwarding streams the answer into it, observation reports on it.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson

from access.identity import caller_of
from registry.affinity import PrefixMatch
from routerproject import request_ids
from routerproject.errors import RouterError, echo, error_body

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# A whole answer (status, headers, body) in one message, for a server that advertises it in
# `scope["extensions"]` (the node's own: proxy.edge.cycle). It is `http.response.start` plus
# one last `http.response.body`, less their two passes through the server and its held head:
# about 3% of a proxied request's instructions (callgrind). The server adds content-length.
WHOLE_ANSWER = "router.response"

JSON = b"application/json"
NDJSON = b"application/x-ndjson"
SSE = b"text/event-stream"


def model_not_allowed(public_id: str) -> RouterError:
    """403 for a model outside the request's key's `models`."""
    return RouterError(
        403,
        f'model "{echo(public_id)}" is not allowed for this key (model_not_allowed)',
        type="forbidden",
        code="model_not_allowed",
        param="model",
    )


@dataclass
class Ctx:
    """One client request in flight."""

    scope: Scope
    receive: Receive
    send: Send
    path: str
    method: str
    body: bytes = b""
    started: bool = False
    finished: bool = False
    disconnected: bool = False
    status: int = 0
    borrowed: bool = False
    """A lent request from another node (set by the node protocol, never by a client header)."""
    offload_load: bool = False
    offload_restore: bool = False
    guardian_restore: bool = False
    """Answering for a text-only model of this node as its guardian: load that model back after."""
    request_id: str = ""
    """The ID every answer, analytics row, decision row and log line of this request carries."""
    t0: float = field(default_factory=time.monotonic)
    wall0: float = field(default_factory=time.time)
    # What the access line and the metrics say about the request (proxy/observe/).
    _model: str = field(default="", repr=False)
    served_node: str = ""
    backend: str = ""
    """What served it here: `<lane>/<backend family>`, or `node` when another node did."""
    lent_to: str = ""
    """The helper node that answered it, when it was lent."""
    first_byte: float = 0.0
    sent_bytes: int = 0
    upstream_secs: float = 0.0
    """Time waiting on the model: queue, load, backend or the next node (not router work)."""
    prefix_match: PrefixMatch | None = None
    """The replica the routing choice picked for the prompt prefix it holds in cache."""
    relayed_key_name: str | None = None
    """The key name the node that let the request in sent with it (node protocol only)."""
    whole_send: Send | None = field(default=None, repr=False)
    """The server's own `send` when it takes `WHOLE_ANSWER`: `respond` uses it while `send` is
    still that one (a wrapper put in its place, which would not know the message, sees the
    answer as start and body)."""

    @property
    def key_name(self) -> str | None:
        """The stored key the request's usage counts against: the relaying node's word on a
        node-protocol call, else the caller the front door recorded (read late: the edge
        authorizes after it made this context)."""
        if self.relayed_key_name is not None:
            return self.relayed_key_name
        return caller_of(self.scope).key_name

    @property
    def model(self) -> str:
        """The model the client asked for."""
        return self._model

    @model.setter
    def model(self, public_id: str) -> None:
        # Every path family names the request's model here before it is resolved or served,
        # so the key's model scope is checked in this one place (README, "Giving people keys").
        if public_id and not caller_of(self.scope).may_use(public_id):
            raise model_not_allowed(public_id)
        self._model = public_id

    def may_use(self, public_id: str) -> bool:
        """Whether the request's key may ask for `public_id` (what model lists show)."""
        return caller_of(self.scope).may_use(public_id)

    def header(self, name: bytes) -> bytes | None:
        for key, value in self.scope["headers"]:
            if key == name:
                return bytes(value)
        return None

    async def start(self, status: int, headers: Iterable[tuple[bytes, bytes]]) -> None:
        out = self._started(status, headers)
        await self.send({"type": "http.response.start", "status": status, "headers": out})

    def _started(
        self, status: int, headers: Iterable[tuple[bytes, bytes]]
    ) -> list[tuple[bytes, bytes]]:
        self.started = True
        self.status = status
        self.first_byte = time.monotonic()
        out = list(headers)
        if self.request_id:
            out.append((request_ids.HEADER, self.request_id.encode("ascii")))
        return out

    async def chunk(self, data: bytes) -> None:
        if data:
            self.sent_bytes += len(data)
            await self.send({"type": "http.response.body", "body": data, "more_body": True})

    async def end(self, data: bytes = b"") -> None:
        self.finished = True
        self.sent_bytes += len(data)
        await self.send({"type": "http.response.body", "body": data, "more_body": False})

    async def respond(
        self,
        status: int,
        body: bytes,
        content_type: bytes = JSON,
        extra: Iterable[tuple[bytes, bytes]] = (),
    ) -> None:
        send = self.whole_send
        if send is not None and send is self.send:
            out = self._started(status, [(b"content-type", content_type), *extra])
            self.finished = True
            self.sent_bytes += len(body)
            await send({"type": WHOLE_ANSWER, "status": status, "headers": out, "body": body})
            return
        # A length lets the client (or a master relaying this answer) skip chunked decoding.
        length = str(len(body)).encode()
        headers = [(b"content-type", content_type), (b"content-length", length), *extra]
        await self.start(status, headers)
        await self.end(body)

    async def json(self, status: int, doc: Any) -> None:
        await self.respond(status, orjson.dumps(doc))

    async def error(self, err: RouterError) -> None:
        if err.models:
            # Only the models this request's key may use: a list must not show the others.
            err = err.with_models(m for m in err.models if self.may_use(m))
        extra = []
        if err.retry_after is not None:
            extra.append((b"retry-after", str(err.retry_after).encode()))
        await self.respond(err.status, error_body(self.path, err), extra=extra)


# -- request parsing ------------------------------------------------------------------------


def parse_json_body(ctx: Ctx) -> dict[str, Any]:
    if not ctx.body.strip():
        raise RouterError(400, "request body is empty; a JSON object is required")
    try:
        doc = orjson.loads(ctx.body)
    except orjson.JSONDecodeError as exc:
        raise RouterError(400, f"invalid JSON body: {exc}") from exc
    if not isinstance(doc, dict):
        raise RouterError(400, "request body must be a JSON object")
    return doc


def require_model(doc: dict[str, Any]) -> str:
    model = doc.get("model")
    if model is None or model == "":
        raise RouterError(400, "model is required", param="model")
    if not isinstance(model, str):
        raise RouterError(400, "model must be a string", param="model")
    return model
