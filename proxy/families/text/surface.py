"""Text-lane path families beyond chat and completions (issue: the whole inference surface).

Responses, Anthropic-style messages, rerank, Kobold extras, music, and the embeddings family;
`ROUTES` is joined into the text family's table by `proxy.families.text.routes`.

Every path here names its model in the JSON body (music may not: it goes where a Kobold
generate without a model goes), and goes to that model's backend under the client's own path.
Answers are rewritten to the public ID at the top level and, for the Responses and Messages
event streams, in the `response` / `message` object each opening event carries, since those
name the model there. A created response's ID is remembered (`node.sticky`, family
"responses") on every node the answer passes, so a later GET, DELETE or cancel naming it goes
to the node, and there the backend, that stores it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qs, parse_qsl, urlencode

import aiohttp
import orjson

from proxy.families.text import koboldgen
from proxy.families.text.kobold import kobold_translated, loaded_text_model
from proxy.families.text.openai import default_embeddings
from proxy.families.text.replies import openai_error_to_anthropic
from proxy.forwarding.generations import Generation
from proxy.forwarding.local import Job, Shaper, forward
from proxy.forwarding.remote import Relay, RelayFactory, forward_remote
from proxy.forwarding.rewrite import (
    SSE_MAX_LINE_BYTES,
    InvalidBackendJSON,
    LineBuffer,
    LineFilter,
    UsageTracker,
    split_lines,
    usage_from_json,
)
from proxy.node import Node
from proxy.request import JSON, SSE, Ctx, parse_json_body, require_model
from proxy.serving.core import GET, MODEL_HEADER, POST, Route, failover
from proxy.serving.sticky import Holder
from registry.bodies import set_body_model
from registry.cluster import Replica
from registry.routing import Kind, lane_of, resolve
from routerproject.errors import RouterError, echo, is_anthropic_path

RESPONSES = "responses"
"""The sticky family of stored responses (vLLM's Responses API)."""
RESPONSES_PATH = "/v1/responses"
RESPONSES_PREFIX = "/v1/responses/"
# The objects a Responses or Messages stream's opening event carries, with the model inside.
_NESTED_MODEL_KEYS = ("response", "message")
_STREAM_HEADERS = ((b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no"))
_DATA = b"data:"
_DONE = b"[DONE]"


def _content_type(resp: aiohttp.ClientResponse) -> bytes:
    return resp.headers.get("Content-Type", "application/octet-stream").encode("latin-1")


# -- answers: the model ID back to the public one, and the created response's ID -------------


def _rewrite_doc(doc: Any, public_id: str) -> bool:
    """Set the answer's model names to `public_id`; whether anything changed."""
    if not isinstance(doc, dict):
        return False
    changed = False
    targets = [doc, *(doc.get(key) for key in _NESTED_MODEL_KEYS)]
    for target in targets:
        if isinstance(target, dict):
            current = target.get("model")
            if isinstance(current, str) and current != public_id:
                target["model"] = public_id
                changed = True
    return changed


def _created_id(doc: Any, *, event: bool) -> str | None:
    """The ID of the response an answer (or a stream's `response.created` event) creates."""
    if not isinstance(doc, dict):
        return None
    if event:
        if doc.get("type") != "response.created":
            return None
        doc = doc.get("response")
        if not isinstance(doc, dict):
            return None
    ident = doc.get("id")
    return ident if isinstance(ident, str) and ident else None


class _EventRewriter(LineFilter):
    """An SSE stream's `data:` JSON with its model names set to the public ID.

    Lines that need no change keep their bytes; `on_id` hears the created response's ID.
    """

    def __init__(self, public_id: str, on_id: Callable[[str], None] | None) -> None:
        super().__init__(SSE_MAX_LINE_BYTES)
        self._public_id = public_id
        self._on_id = on_id

    def _filter(self, region: bytes) -> bytes:
        return b"".join(self._line(line) for line in split_lines(region))

    def _line(self, line: bytes) -> bytes:
        if not line.startswith(_DATA):
            return line
        body = line[len(_DATA) :]
        stripped = body.strip()
        if not stripped or stripped == _DONE:
            return line
        try:
            doc = orjson.loads(stripped)
        except orjson.JSONDecodeError:
            return line  # not ours to judge: the client sees what the backend sent
        if self._on_id is not None:
            ident = _created_id(doc, event=True)
            if ident is not None:
                self._on_id(ident)
                self._on_id = None
        if not _rewrite_doc(doc, self._public_id):
            return line
        ending = b"\r\n" if line.endswith(b"\r\n") else b"\n" if line.endswith(b"\n") else b""
        return _DATA + b" " + orjson.dumps(doc) + ending


class _WholeRewriter:
    """A whole JSON answer with its model names set to the public ID (any status, as the
    reference rewrites errors too); invalid JSON is the backend's fault (502)."""

    def __init__(self, public_id: str, status: int, on_id: Callable[[str], None] | None) -> None:
        self._public_id = public_id
        self._ok = status < 300
        self._on_id = on_id
        self._parts: list[bytes] = []

    def feed(self, chunk: bytes) -> bytes:
        self._parts.append(chunk)
        return b""

    def close(self) -> bytes:
        data = b"".join(self._parts)
        if not data.strip():
            return data
        try:
            doc = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise InvalidBackendJSON("backend returned invalid json") from exc
        if self._ok and self._on_id is not None:
            ident = _created_id(doc, event=False)
            if ident is not None:
                self._on_id(ident)
        return orjson.dumps(doc) if _rewrite_doc(doc, self._public_id) else data


class _Verbatim:
    """Bytes as they came: music and other answers the reference never rewrites."""

    def feed(self, chunk: bytes) -> bytes:
        return chunk

    def close(self) -> bytes:
        return b""


class _AnthropicError:
    """A backend's error on an Anthropic path, in Anthropic's envelope: its SDKs read the
    message and type from there (llama-server answers these paths' errors in OpenAI's)."""

    def __init__(self, status: int) -> None:
        self._status = status
        self._parts: list[bytes] = []

    def feed(self, chunk: bytes) -> bytes:
        self._parts.append(chunk)
        return b""

    def close(self) -> bytes:
        return openai_error_to_anthropic(self._status, b"".join(self._parts))


def _answer_relay(
    public_id: str, on_id: Callable[[str], None] | None, *, anthropic: bool = False
) -> RelayFactory:
    def make(status: int, ctype: bytes) -> Relay:
        if anthropic and status >= 400 and ctype.startswith(JSON):
            return _AnthropicError(status)
        if ctype.startswith(SSE):
            return _EventRewriter(public_id, on_id)
        if ctype.startswith(JSON):
            return _WholeRewriter(public_id, status, on_id)
        return _Verbatim()

    return make


def _verbatim(status: int, ctype: bytes) -> Relay:
    return _Verbatim()


class _AnthropicUsage:
    """The usage of an Anthropic event stream: the input tokens `message_start` reports inside
    its message, the output tokens the closing `message_delta` reports (llama-server's says
    only those), merged, so analytics and a key's tpm see both."""

    def __init__(self) -> None:
        self._lines = LineBuffer()
        self._usage: dict[str, Any] = {}

    def feed(self, chunk: bytes) -> None:
        region = self._lines.take(chunk)
        if b'"usage"' not in region:
            return
        for line in split_lines(region):
            self._line(line)

    def _line(self, line: bytes) -> None:
        if not line.startswith(_DATA) or b'"usage"' not in line:
            return
        try:
            doc = orjson.loads(line[len(_DATA) :])
        except orjson.JSONDecodeError:
            return
        if not isinstance(doc, dict):
            return
        holder = doc.get("message") if doc.get("type") == "message_start" else doc
        usage = holder.get("usage") if isinstance(holder, dict) else None
        if isinstance(usage, dict):
            self._usage.update(usage)

    def usage(self) -> dict[str, Any] | None:
        return dict(self._usage) if self._usage else None


def _relay_shaper(make: RelayFactory, *, anthropic: bool = False) -> Shaper:
    """A local backend's answer through `make`'s filter, streamed when it is a stream."""

    async def shape(ctx: Ctx, job: Job, resp: aiohttp.ClientResponse) -> None:
        ctype = _content_type(resp)
        relay = make(resp.status, ctype)
        try:
            if ctype.startswith(SSE):
                await ctx.start(resp.status, [(b"content-type", ctype), *_STREAM_HEADERS])
                tracker: UsageTracker | _AnthropicUsage = (
                    _AnthropicUsage() if anthropic else UsageTracker()
                )
                async for data in resp.content.iter_any():
                    tracker.feed(data)
                    await ctx.chunk(relay.feed(data))
                await ctx.end(relay.close())
                job.usage = tracker.usage()
                return
            data = await resp.read()
            out = relay.feed(data) + relay.close()
        except InvalidBackendJSON as exc:
            raise RouterError(502, "backend returned invalid json", type="backend_error") from exc
        if resp.status < 300 and ctype.startswith(JSON):
            job.usage = usage_from_json(data)
        await ctx.respond(resp.status, out, ctype)

    return shape


# -- sending ---------------------------------------------------------------------------------


async def _send(
    ctx: Ctx,
    node: Node,
    replica: Replica,
    *,
    kind: Kind,
    public_id: str,
    body: bytes,
    relay: RelayFactory,
    shape: Shaper | None = None,
    backend_path: str | None = None,
    stream: bool = False,
    model_header: str | None = None,
) -> None:
    """Run the request where `replica` lives: this node's backend, or the node holding it.

    `relay` filters the answer (from either); `shape` replaces it for a local backend whose
    answer the router translates (Kobold's stream and token count).
    """
    ctx.model = public_id
    lane = lane_of(kind)
    if replica.cfg is None:
        await forward_remote(
            ctx,
            node,
            replica,
            lane=lane,
            path=ctx.path,
            body=body,
            public_id=public_id,
            served_id=replica.local_id,
            relay=relay,
            model_header=model_header,
        )
        return
    job = Job(
        cfg=replica.cfg,
        lane=lane,
        model_id=replica.local_id,
        public_id=public_id,
        backend_path=backend_path or ctx.path,
        query=ctx.scope.get("query_string", b"").decode("latin-1"),
        body=body,
        stream=stream,
        prompt_bytes=len(body),
        method=ctx.method,
        model_header=model_header,
        lendable=False,
    )
    await forward(
        ctx, node, job, shape or _relay_shaper(relay, anthropic=is_anthropic_path(ctx.path))
    )


def _with_model(ctx: Ctx, model: str) -> bytes:
    # The client's bytes with only the model changed (or inserted): the serving node then
    # measures the same body (and prompt size) as this one, as the core paths do.
    return set_body_model(ctx.body, model)


def _remembering(node: Node, target: Replica, public_id: str) -> Callable[[str], None]:
    def remember(ident: str) -> None:
        node.sticky.remember(RESPONSES, ident, Holder(target.node_id, public_id, target.local_id))

    return remember


# -- text ------------------------------------------------------------------------------------


async def handle_text(ctx: Ctx, node: Node) -> None:
    """A text path of the OpenAI, Anthropic or vLLM family: the model named in the body."""
    if ctx.method != "POST":
        # A GET on the catch-all names no model and no ID the router knows to follow.
        raise RouterError(404, "endpoint not found", type="not_found")
    doc = parse_json_body(ctx)
    model = ctx.model = require_model(doc)
    replica = resolve(node, model, "llm", borrowed=ctx.borrowed)
    creates = ctx.path == RESPONSES_PATH
    continues = _previous_replica(node, doc, model) if creates else None

    def serve(target: Replica) -> Awaitable[None]:
        on_id = _remembering(node, target, model) if creates else None
        return _send(
            ctx,
            node,
            target,
            kind="llm",
            public_id=model,
            body=_with_model(ctx, target.local_id),
            relay=_answer_relay(model, on_id, anthropic=is_anthropic_path(ctx.path)),
            stream=doc.get("stream") is True,
        )

    if continues is not None:
        # Only the backend that stores the previous response can continue it: no failover.
        await serve(continues)
        return
    await failover(ctx, node, model, "llm", replica, serve)


def _previous_replica(node: Node, doc: dict[str, Any], model: str) -> Replica | None:
    """The replica that stores the response a new one continues (`previous_response_id`),
    when this router created it under the same model; None leaves the choice to rotation."""
    previous = doc.get("previous_response_id")
    if not isinstance(previous, str) or not previous:
        return None
    holder = node.sticky.lookup(RESPONSES, previous)
    if holder is None or holder.public_id != model:
        return None
    return _available_holder(node, holder, previous)


def _available_holder(node: Node, holder: Holder, ident: str) -> Replica:
    replica = _holder_replica(node, holder)
    if replica is None or not replica.available:
        raise RouterError(
            502,
            f'the replica holding response "{echo(ident)}" ({holder.node_id}) is not available',
            type="backend_error",
            code="backend_unavailable",
        )
    return replica


def _response_id(path: str) -> str:
    return path[len(RESPONSES_PREFIX) :].split("/", 1)[0]


def _holder_replica(node: Node, holder: Holder) -> Replica | None:
    for replica in node.cluster.by_public_id.get(holder.public_id, []):
        if replica.node_id == holder.node_id and replica.local_id == holder.local_id:
            return replica
    return None


async def handle_response_followup(ctx: Ctx, node: Node) -> None:
    """GET or DELETE a stored response, or cancel it: on the node and backend that made it."""
    ident = _response_id(ctx.path)
    holder = node.sticky.lookup(RESPONSES, ident)
    if holder is None:
        raise RouterError(
            404,
            f'response "{echo(ident)}" was not found',
            code="response_not_found",
            param="response_id",
        )
    replica = _available_holder(node, holder, ident)
    await _send(
        ctx,
        node,
        replica,
        kind="llm",
        public_id=holder.public_id,
        body=ctx.body,
        relay=_answer_relay(holder.public_id, None),
    )
    if ctx.method == "DELETE" and 200 <= ctx.status < 300:
        node.sticky.forget(RESPONSES, ident)


# -- rerank: embeddings or text --------------------------------------------------------------


def rerank_kind(node: Node, model: Any) -> Kind:
    """Which family `/v1/rerank` belongs to for this model.

    The reference lists it under both. A request without a model is selector-less embeddings
    (§5.2); a model that only embeds (no text replica, an embeddings one) is reranked by its
    embeddings backend; any other model, unknown ones included, is text, as llama-server
    serves `/v1/rerank` from its text process.
    """
    if model in (None, ""):
        return "embeddings"
    if not isinstance(model, str):
        return "llm"  # the text path refuses it with the usual message
    records = [
        r.record for r in node.cluster.by_public_id.get(model, []) if not r.record.get("disabled")
    ]
    embeds = any(rec.get("has_embeddings") for rec in records)
    if embeds and not any(rec.get("has_llm") for rec in records):
        return "embeddings"
    return "llm"


async def handle_rerank(ctx: Ctx, node: Node) -> None:
    doc = parse_json_body(ctx)
    if rerank_kind(node, doc.get("model")) == "embeddings":
        await handle_embeddings_family(ctx, node)
    else:
        await handle_text(ctx, node)


# -- embeddings family -----------------------------------------------------------------------


async def handle_embeddings_family(ctx: Ctx, node: Node) -> None:
    """Embed, rerank, classify, score, pool: the embeddings backend under the client's path,
    selector-less requests round-robin over loaded embedding models (§5.2)."""
    doc = parse_json_body(ctx)
    no_model = doc.get("model") in (None, "")
    model = default_embeddings(node) if no_model else require_model(doc)
    ctx.model = model
    replica = resolve(node, model, "embeddings", borrowed=ctx.borrowed)

    def serve(target: Replica) -> Awaitable[None]:
        return _send(
            ctx,
            node,
            target,
            kind="embeddings",
            public_id=model,
            body=_with_model(ctx, target.local_id),
            relay=_answer_relay(model, None),
        )

    await failover(ctx, node, model, "embeddings", replica, serve)


# -- Kobold extras ---------------------------------------------------------------------------


def _kobold_model(node: Node, doc: dict[str, Any]) -> str:
    model = doc.get("model")
    if model in (None, ""):
        return loaded_text_model(node)
    if not isinstance(model, str):
        raise RouterError(400, "model must be a string", param="model")
    return model


class _KoboldEvents:
    """OpenAI completion chunks (SSE) as KoboldCpp's token events."""

    def __init__(self) -> None:
        self._lines = LineBuffer()

    def feed(self, chunk: bytes) -> bytes:
        region = self._lines.take(chunk)
        return b"".join(self._event(line) for line in split_lines(region)) if region else b""

    def close(self) -> bytes:
        rest = self._lines.drain()
        return self._event(rest) if rest else b""

    @staticmethod
    def _event(line: bytes) -> bytes:
        if not line.startswith(_DATA):
            return b""
        payload = line[len(_DATA) :].strip()
        if not payload or payload == _DONE:
            return b""
        try:
            doc = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return b""
        choices = doc.get("choices") if isinstance(doc, dict) else None
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return b""  # the usage chunk, or something Kobold clients would not read
        text = choices[0].get("text")
        finish = choices[0].get("finish_reason")
        token = {
            "token": text if isinstance(text, str) else "",
            "finish_reason": finish if isinstance(finish, str) else None,
        }
        return b"event: message\ndata: " + orjson.dumps(token) + b"\n\n"


# The closing token event of a stream a client aborted (KoboldCpp ends such a one by "stop").
_ABORTED_EVENT = b'event: message\ndata: {"token":"","finish_reason":"stop"}\n\n'


def _kobold_stream_shape(generation: Generation | None) -> Shaper:
    """Kobold's token events from a completion stream; with a genkey's `generation`, its text
    is kept as it comes and an abort ends the stream."""

    async def shape(ctx: Ctx, job: Job, resp: aiohttp.ClientResponse) -> None:
        ctype = _content_type(resp)
        if resp.status >= 300 or not ctype.startswith(SSE):
            await ctx.respond(resp.status, await resp.read(), ctype)
            return
        await ctx.start(200, [(b"content-type", SSE), *_STREAM_HEADERS])
        events = _KoboldEvents()
        tracker = UsageTracker()
        text = koboldgen.CompletionText(generation) if generation is not None else None

        async def feed(data: bytes) -> None:
            tracker.feed(data)
            if text is not None:
                text.feed(data)
            await ctx.chunk(events.feed(data))

        stop = generation.stop if generation is not None else None
        aborted = await koboldgen.read_until_stopped(resp, stop, feed)
        await ctx.end(events.close() + (_ABORTED_EVENT if aborted else b""))
        job.usage = tracker.usage()

    return shape


async def _serve_kobold(
    ctx: Ctx,
    node: Node,
    model: str,
    replica: Replica,
    translated: Callable[[Replica], Awaitable[None]],
    genkey: str | None = None,
) -> None:
    """Serve a Kobold extra on `model`, first on `replica`: a replica on another node gets the
    client's own body (its node translates Kobold itself), a local one what `translated`
    sends it. A `genkey` run on another node is remembered there for its follow-ups."""

    def serve(target: Replica) -> Awaitable[None]:
        if target.cfg is None:
            if genkey is not None:
                koboldgen.remember_remote(node, genkey, target, model)
            body = _with_model(ctx, target.local_id)
            return _send(ctx, node, target, kind="llm", public_id=model, body=body, relay=_verbatim)
        return translated(target)

    await failover(ctx, node, model, "llm", replica, serve)


async def handle_kobold_stream(ctx: Ctx, node: Node) -> None:
    """`/api/extra/generate/stream`: Kobold's generate as token events, on the text lane."""
    doc = parse_json_body(ctx)
    model = ctx.model = _kobold_model(node, doc)
    replica = resolve(node, model, "llm", borrowed=ctx.borrowed)
    if replica.cfg is not None:
        kobold_translated(doc)  # refused before anything runs, as generate is
    genkey = koboldgen.genkey_of(doc)

    async def translated(target: Replica) -> None:
        path, body_doc = kobold_translated(doc)
        body_doc.update(model=target.local_id, stream=True)
        generation = node.generations.start(genkey, ctx.key_name) if genkey else None
        try:
            await _send(
                ctx,
                node,
                target,
                kind="llm",
                public_id=model,
                body=orjson.dumps(body_doc),
                relay=_verbatim,
                shape=_kobold_stream_shape(generation),
                backend_path=path,
                stream=True,
            )
        finally:
            if genkey is not None and generation is not None:
                node.generations.end(genkey, generation)

    await _serve_kobold(ctx, node, model, replica, translated, genkey)


TOKENIZE_PATH = "/tokenize"


async def _shape_tokencount(ctx: Ctx, job: Job, resp: aiohttp.ClientResponse) -> None:
    data = await resp.read()
    if resp.status >= 300:
        await ctx.respond(resp.status, data, _content_type(resp))
        return
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise RouterError(502, "backend returned invalid json", type="backend_error") from exc
    tokens = doc.get("tokens") if isinstance(doc, dict) else None
    if not isinstance(tokens, list):
        raise RouterError(502, "backend returned no tokens", type="backend_error")
    await ctx.json(200, {"value": len(tokens), "ids": tokens})


async def handle_kobold_tokencount(ctx: Ctx, node: Node) -> None:
    """`/api/extra/tokencount`: the backend's tokenizer (llama-server's and vLLM's
    `/tokenize`), answered in Kobold's shape."""
    doc = parse_json_body(ctx)
    prompt = doc.get("prompt", "")
    if not isinstance(prompt, str):
        raise RouterError(400, "prompt must be a string", param="prompt")
    model = ctx.model = _kobold_model(node, doc)

    def translated(target: Replica) -> Awaitable[None]:
        # llama-server reads `content`, vLLM `prompt`.
        body = orjson.dumps({"model": target.local_id, "content": prompt, "prompt": prompt})
        return _send(
            ctx,
            node,
            target,
            kind="llm",
            public_id=model,
            body=body,
            relay=_verbatim,
            shape=_shape_tokencount,
            backend_path=TOKENIZE_PATH,
        )

    replica = resolve(node, model, "llm", borrowed=ctx.borrowed)
    await _serve_kobold(ctx, node, model, replica, translated)


# -- music -----------------------------------------------------------------------------------


def _music_model(ctx: Ctx, node: Node) -> tuple[str, dict[str, Any] | None]:
    """The model a music request names (body, `?model=`, `X-Tensors-Model`), else the text
    model a Kobold generate without one would use: KoboldCpp serves music from its text
    process, and its music UI names no model."""
    doc: dict[str, Any] | None = None
    content_type = ctx.header(b"content-type") or b""
    if ctx.body.strip() and content_type.startswith(JSON):
        doc = parse_json_body(ctx)
        model = doc.get("model")
        if model not in (None, ""):
            if not isinstance(model, str):
                raise RouterError(400, "model must be a string", param="model")
            return model, doc
    query = parse_qs(ctx.scope.get("query_string", b"").decode("latin-1"))
    named = query.get("model", [""])[-1] or (ctx.header(MODEL_HEADER) or b"").decode("latin-1")
    if named.strip():
        return named.strip(), doc
    return loaded_text_model(node), doc


def _query_with_model(ctx: Ctx, model: str) -> bytes:
    query = parse_qsl(ctx.scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
    if not any(key == "model" for key, _ in query):
        return urlencode(query).encode("latin-1")
    return urlencode([(k, model if k == "model" else v) for k, v in query]).encode("latin-1")


async def handle_music(ctx: Ctx, node: Node) -> None:
    """KoboldCpp's music UI and API, on the text lane of the model that serves them.

    Neither the request nor the answer is rewritten beyond a JSON body's model (the reference
    copies music answers as they are).
    """
    model, doc = _music_model(ctx, node)
    ctx.model = model
    replica = resolve(node, model, "llm", borrowed=ctx.borrowed)

    def serve(target: Replica) -> Awaitable[None]:
        body = ctx.body
        if doc is not None and "model" in doc:
            body = _with_model(ctx, target.local_id)
        if target.cfg is None:
            # The holder knows the model by its own ID, in whichever selector named it.
            ctx.scope = {**ctx.scope, "query_string": _query_with_model(ctx, target.local_id)}
        return _send(
            ctx,
            node,
            target,
            kind="llm",
            public_id=model,
            body=body,
            relay=_verbatim,
            model_header=target.local_id,
        )

    await failover(ctx, node, model, "llm", replica, serve)


GET_POST = GET | POST
GET_DELETE = GET | frozenset({"DELETE"})

EMBEDDINGS_PATHS = (
    "/v2/embed",
    "/api/extra/embeddings",
    "/rerank",
    "/v2/rerank",
    "/classify",
    "/score",
    "/v1/score",
    "/pooling",
)

ROUTES: dict[str, Route] = {
    # Any /v1 path no other family claims is text (a longer literal prefix wins over it).
    "/v1/{path}": (GET_POST, handle_text, True),
    RESPONSES_PATH: (POST, handle_text, True),
    "/v1/responses/input_tokens": (POST, handle_text, True),
    "/v1/responses/{response_id}": (GET_DELETE, handle_response_followup, True),
    "/v1/responses/{response_id}/cancel": (POST, handle_response_followup, True),
    "/v1/messages": (POST, handle_text, True),
    "/v1/messages/count_tokens": (POST, handle_text, True),
    "/v1/rerank": (POST, handle_rerank, True),
    "/v1/reranking": (POST, handle_text, True),
    "/api/extra/generate/stream": (POST, handle_kobold_stream, True),
    "/api/extra/tokencount": (POST, handle_kobold_tokencount, True),
    **{path: (POST, handle_embeddings_family, True) for path in EMBEDDINGS_PATHS},
    "/musicui": (GET, handle_music, True),
    "/musicui/{path}": (GET, handle_music, True),
    "/api/extra/music/{path}": (GET_POST, handle_music, True),
}
