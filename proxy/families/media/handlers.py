"""Image and video path families: OpenAI images, sdapi, sdcpp jobs and ComfyUI.

`ROUTES` is joined into the client table by `proxy.edge.routes`. Everything here runs on the image
lane (kind "image"), so a video job (`/sdcpp/v1/vid_gen`) waits behind and is priced with the
node's image work.

Which image model a request runs on, in order: the model it names (body `model`, an sdapi
checkpoint, a ComfyUI workflow's model loader, `ckpt_name` or `unet_name`, or the
`X-Tensors-Model` header); for a follow-up naming a job, prompt or output file, the replica
that created it (`node.sticky`); otherwise the node's default image model
(`default_image_model`): the checkpoint last selected with `POST /sdapi/v1/options` on this
node, else the single enabled image model, else the first enabled image model by public ID.
A generation (txt2img, img2img, img_gen, vid_gen, a ComfyUI prompt) never falls to that last
rule: with several image models and no selection it must name one.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qs

import orjson

from proxy import work
from proxy.forwarding.local import shape_openai
from proxy.node import Node
from proxy.request import JSON, Ctx, Message, Send, parse_json_body
from proxy.serving.core import (
    GET,
    MODEL_HEADER,
    POST,
    Route,
    enabled_image_ids,
    failover,
    serve_on,
)
from proxy.serving.sticky import Holder
from registry.cluster import Replica
from registry.routing import candidates, require_view, resolve
from routerproject.errors import RouterError, echo

SDCPP = "sdcpp"
"""`node.sticky` family of sd.cpp job IDs."""
COMFY = "comfy"
COMFY_WS_PATH = "/ws"
"""ComfyUI's progress socket, relayed by the edge's WebSocket app (proxy/edge/realtime.py)."""
"""`node.sticky` family of ComfyUI prompt IDs."""
COMFY_FILE = "comfy-file"
"""`node.sticky` family of ComfyUI output file names, learnt from `/history` answers."""

# Answers read for an ID to remember are small JSON documents; anything larger passes unread.
TAP_LIMIT_BYTES = 1 << 20
NO_BODY = b"application/octet-stream"
# File name endings a ComfyUI workflow gives its checkpoints; the router's IDs have none.
CHECKPOINT_SUFFIXES = (".safetensors", ".ckpt", ".gguf", ".pt", ".pth", ".bin")
MODEL_INPUTS = ("ckpt_name", "unet_name")

_selected: dict[str, str] = {}
"""The checkpoint `POST /sdapi/v1/options` selected, per node ID (this process's nodes)."""


# -- choosing the model ---------------------------------------------------------------------


def selected_image_model(node: Node) -> str | None:
    """The checkpoint selected on this node, while it is still an enabled image model."""
    chosen = _selected.get(node.node_id)
    if chosen is not None and candidates(node, chosen, "image"):
        return chosen
    return None


def _selection_or_single(node: Node) -> str | None:
    chosen = selected_image_model(node)
    if chosen is not None:
        return chosen
    images = enabled_image_ids(node)
    return images[0] if len(images) == 1 else None


def default_image_model(node: Node) -> str:
    """Where a request that cannot name a model goes (GET `/queue`, `/system_stats`...)."""
    chosen = _selection_or_single(node)
    if chosen is not None:
        return chosen
    images = enabled_image_ids(node)
    if not images:
        require_view(node)
        raise RouterError(404, "no image model is enabled", code="model_not_found")
    return images[0]


def _header_model(ctx: Ctx) -> str | None:
    header = ctx.header(MODEL_HEADER)
    named = header.decode("latin-1").strip() if header is not None else ""
    return named or None


def _body_model(doc: dict[str, Any]) -> str | None:
    """The model an OpenAI, sdapi or sd.cpp body names, wherever its clients put it."""
    override = doc.get("override_settings")
    for value in (
        doc.get("model"),
        override.get("sd_model_checkpoint") if isinstance(override, dict) else None,
        doc.get("sd_model_checkpoint"),
    ):
        if value is not None and value != "":
            if not isinstance(value, str):
                raise RouterError(400, "model must be a string", param="model")
            return value
    return None


def _request_type(ctx: Ctx) -> bytes:
    # A request without a body has nothing to rewrite; its model travels in no field.
    if not ctx.body.strip():
        return NO_BODY
    return ctx.header(b"content-type") or NO_BODY


def _query(ctx: Ctx) -> str:
    return bytes(ctx.scope.get("query_string", b"")).decode("latin-1")


# -- serving --------------------------------------------------------------------------------


def _served_id(replica: Replica) -> str:
    return str(replica.record.get("image_id") or replica.local_id)


async def _run(
    ctx: Ctx,
    node: Node,
    model: str,
    *,
    body: Callable[[Replica], bytes] | None = None,
    replica: Replica | None = None,
    image: work.ImageWork | None = None,
) -> None:
    """Serve the request on `model` (on `replica` when a follow-up must reach that one).

    The model also goes as `X-Tensors-Model` (set to the ID that serves it): a request whose
    model was chosen here, not named in its body, reaches another node or the backend naming
    it, so the node there does not choose again by its own default.
    """
    ctx.model = model
    ctype = _request_type(ctx)
    # A header carries Latin-1 only; a model ID beyond ASCII travels in the body alone.
    if ctx.header(MODEL_HEADER) is None and model.isascii():
        ctx.scope["headers"] = [*ctx.scope["headers"], (MODEL_HEADER, model.encode("latin-1"))]

    def serve(target: Replica) -> Awaitable[None]:
        return serve_on(
            ctx,
            node,
            target,
            kind="image",
            public_id=model,
            path=ctx.path,
            body=body(target) if body is not None else ctx.body,
            shape=shape_openai,
            content_type=ctype,
            image=image,
            query=_query(ctx),
            # Jobs, prompts and edits live on the backend that took them, and a helper's
            # backend may not serve these paths: only the core image path is lent.
            lendable=False,
        )

    if replica is not None:
        await serve(replica)
        return
    first = resolve(node, model, "image", borrowed=ctx.borrowed)
    await failover(ctx, node, model, "image", first, serve)


def _holder(ctx: Ctx, node: Node) -> Holder | None:
    """The replica that answered this request, as `ctx` records it."""
    if not ctx.served_node or not ctx.model:
        return None
    for replica in candidates(node, ctx.model, "image"):
        if replica.node_id == ctx.served_node:
            return Holder(replica.node_id, ctx.model, replica.local_id)
    return None


def _holder_replica(node: Node, family: str, ident: str) -> Replica | None:
    """The replica holding a remembered ID; RouterError when its holder is not in the view."""
    holder = node.sticky.lookup(family, ident)
    if holder is None:
        return None
    for replica in candidates(node, holder.public_id, "image"):
        if replica.node_id == holder.node_id and replica.local_id == holder.local_id:
            return replica
    # No other replica knows the ID; the entry stays, for when its node is back.
    raise RouterError(
        503,
        f'"{echo(ident)}" is held by model "{echo(holder.public_id)}" on node '
        f'"{echo(holder.node_id)}", which is not available',
        type="backend_error",
        code="node_unavailable",
    )


async def _follow(ctx: Ctx, node: Node, family: str, ident: str) -> None:
    """Send a request naming a remembered ID to its holder; an unknown ID to the default."""
    replica = _holder_replica(node, family, ident)
    if replica is None:
        # Unknown here (forgotten, or made before a restart): the model the sending node
        # named, else the default image model's backend may still know it.
        await _run(ctx, node, _header_model(ctx) or default_image_model(node))
        return
    holder = node.sticky.lookup(family, ident)
    assert holder is not None
    await _run(ctx, node, holder.public_id, replica=replica)


class _Tap:
    """The client's `send`, keeping a copy of a small 2xx JSON answer on its way out.

    With `rewrite`, such an answer is held back until whole and passed on rewritten (its
    length changed to match); any other answer passes as it comes.
    """

    def __init__(self, ctx: Ctx, rewrite: Callable[[Any], Any] | None = None) -> None:
        self._send: Send = ctx.send
        self._rewrite = rewrite
        self._held: Message | None = None
        self._parts: list[bytes] = []
        self._size = 0
        self.keeping = False
        self.data = b""
        ctx.send = self

    async def __call__(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            headers = message.get("headers", [])
            ctype = next((bytes(v) for k, v in headers if k == b"content-type"), b"")
            self.keeping = 200 <= message["status"] < 300 and ctype.startswith(JSON)
            if self.keeping and self._rewrite is not None:
                self._held = message
                return
        elif kind == "http.response.body" and self.keeping:
            chunk = message.get("body", b"")
            more = message.get("more_body", False)
            self._parts.append(chunk)
            if self._held is not None:
                if not more:
                    await self._release(message)
                return
            self._size += len(chunk)
            if self._size > TAP_LIMIT_BYTES:
                self.keeping = False
                self._parts.clear()
            elif not more:
                self.data = b"".join(self._parts)
        await self._send(message)

    async def _release(self, last: Message) -> None:
        held, self._held = self._held, None
        assert held is not None and self._rewrite is not None
        body = b"".join(self._parts)
        try:
            body = orjson.dumps(self._rewrite(orjson.loads(body)))
        except orjson.JSONDecodeError:
            pass  # not the JSON it said it was: the client gets it as it came
        self.data = body
        headers = [
            (k, str(len(body)).encode() if k == b"content-length" else v)
            for k, v in held.get("headers", [])
        ]
        await self._send({**held, "headers": headers})
        await self._send({**last, "body": body, "more_body": False})

    def doc(self) -> Any:
        """The kept answer, parsed; None when there is none."""
        if not self.data:
            return None
        try:
            return orjson.loads(self.data)
        except orjson.JSONDecodeError:
            return None


# -- OpenAI images ---------------------------------------------------------------------------


async def handle_images(ctx: Ctx, node: Node) -> None:
    """Any `/v1/images/*`: a JSON body as generations, a multipart one (edits, variations)
    by its `model` form field."""
    ctype = (ctx.header(b"content-type") or b"").decode("latin-1")
    if not ctype.lower().lstrip().startswith("multipart/"):
        await handle_image_generations(ctx, node)
        return
    field = work.multipart_field(ctx.body, ctype, "model")
    model = field.decode("utf-8", "replace").strip() if field else ""
    model = model or _header_model(ctx) or ""
    if not model:
        raise RouterError(400, "model is required", param="model")

    def body(target: Replica) -> bytes:
        served = _served_id(target)
        if served == model:
            return ctx.body
        return work.replace_multipart_model(ctx.body, model, served)

    await _run(ctx, node, model, body=body, image=_form_work(ctx.body, ctype))


def _form_work(body: bytes, ctype: str) -> work.ImageWork:
    """The image work an edit or variation form asks for (its size and count)."""
    fields: dict[str, Any] = {}
    for name in ("size", "n"):
        value = work.multipart_field(body, ctype, name)
        if value is not None:
            text = value.decode("utf-8", "replace").strip()
            fields[name] = int(text) if name == "n" and text.isdigit() else text
    try:
        return work.image_work(fields)
    except ValueError as exc:
        raise RouterError(400, str(exc), param=getattr(exc, "param", None)) from exc


async def handle_image_generations(ctx: Ctx, node: Node) -> None:
    """`/v1/images/generations`, and sdapi's txt2img and img2img once `handle_generation` has
    put the selected model in: the named image model, else an sdapi checkpoint, else the one
    enabled image model."""
    doc = parse_json_body(ctx)
    model = doc.get("model")
    if model in (None, "") and ctx.header(MODEL_HEADER):
        # The reference's last selector: sd-server clients may name the model in a header.
        model = (ctx.header(MODEL_HEADER) or b"").decode("latin-1").strip()
    if model in (None, "") and ctx.path.startswith("/sdapi/"):
        override = doc.get("override_settings")
        if isinstance(override, dict):
            model = override.get("sd_model_checkpoint")
        model = model or doc.get("sd_model_checkpoint")
        if not model:
            images = enabled_image_ids(node)
            if len(images) == 1:
                model = images[0]
    if not isinstance(model, str) or not model:
        raise RouterError(400, "model is required", param="model")
    try:
        image = work.image_work(doc)
    except ValueError as exc:
        raise RouterError(400, str(exc), param=getattr(exc, "param", None)) from exc
    ctx.model = model
    replica = resolve(node, model, "image", borrowed=ctx.borrowed)

    def serve(target: Replica) -> Awaitable[None]:
        return serve_on(
            ctx,
            node,
            target,
            kind="image",
            public_id=model,
            path=ctx.path,
            body=ctx.body,
            shape=shape_openai,
            image=image,
        )

    await failover(ctx, node, model, "image", replica, serve)


async def handle_sd_models(ctx: Ctx, node: Node) -> None:
    require_view(node)
    entries = [
        {
            "title": pid,
            "model_name": pid,
            "filename": str(
                replicas[0].record.get("capabilities", {}).get("image", {}).get("model", "")
            ),
            "config": replicas[0].record.get("filename", ""),
            "hash": "",
            "sha256": "",
        }
        for pid, replicas in sorted(node.cluster.by_public_image_id.items())
        if any(not r.record.get("disabled") for r in replicas) and ctx.may_use(pid)
    ]
    await ctx.json(200, entries)


# -- AUTOMATIC1111 (sdapi) and sd.cpp --------------------------------------------------------


async def handle_generation(ctx: Ctx, node: Node) -> None:
    """txt2img and img2img, as core's image path (after the selection); sd.cpp's img_gen and
    vid_gen, whose answers name a job that must be found on this node later."""
    doc = parse_json_body(ctx)
    named = _body_model(doc) or _header_model(ctx)
    if ctx.path.startswith("/sdcpp/"):
        await _submit_job(ctx, node, doc, named)
        return
    if named is None:
        chosen = _selection_or_single(node)
        if chosen is not None:
            doc["model"] = chosen
            ctx.body = orjson.dumps(doc)
    await handle_image_generations(ctx, node)


async def _submit_job(ctx: Ctx, node: Node, doc: dict[str, Any], named: str | None) -> None:
    try:
        work.image_work(doc)  # a bad size or step count is refused here, not by the backend
    except ValueError as exc:
        raise RouterError(400, str(exc), param=getattr(exc, "param", None)) from exc
    model = named or _selection_or_single(node)
    if model is None:
        raise RouterError(400, "model is required", param="model")
    tap = _Tap(ctx)
    # No image work is recorded: the submit returns before the job runs, and its time would
    # teach the image cost fits that the work is nearly free. Never lent (see `_run`).
    await _run(ctx, node, model)
    _remember(ctx, node, SDCPP, _job_id(tap.doc()))


def _job_id(doc: Any) -> str | None:
    if not isinstance(doc, dict):
        return None
    for key in ("id", "job_id"):
        value = doc.get(key)
        if isinstance(value, str) and value:
            return value
    return None


def _remember(ctx: Ctx, node: Node, family: str, ident: str | None) -> None:
    if ident is None:
        return
    holder = _holder(ctx, node)
    if holder is not None:
        node.sticky.remember(family, ident, holder)


async def handle_sdcpp_job(ctx: Ctx, node: Node) -> None:
    """`/sdcpp/v1/jobs/{job_id}` and what follows it: the node that runs the job answers."""
    job_id = ctx.path[len("/sdcpp/v1/jobs/") :].split("/", 1)[0]
    await _follow(ctx, node, SDCPP, job_id)


async def handle_options(ctx: Ctx, node: Node) -> None:
    """GET reads the options of the selected model's backend; POST with
    `sd_model_checkpoint` selects the model later sdapi requests without one run on."""
    if ctx.method != "POST":
        model = _header_model(ctx) or default_image_model(node)

        def public(doc: Any) -> Any:
            # The checkpoint as this router names it: a client sends it back as its choice.
            if isinstance(doc, dict) and "sd_model_checkpoint" in doc:
                doc["sd_model_checkpoint"] = ctx.model
            return doc

        _Tap(ctx, public)
        await _run(ctx, node, model)
        return
    doc = parse_json_body(ctx)
    checkpoint = doc.get("sd_model_checkpoint")
    chosen: str | None = None
    if checkpoint is not None:
        if not isinstance(checkpoint, str) or not checkpoint.strip():
            raise RouterError(
                400, "sd_model_checkpoint must be a model ID", param="sd_model_checkpoint"
            )
        chosen = checkpoint.strip()
        if not candidates(node, chosen, "image"):
            require_view(node)
            raise RouterError(
                404,
                f'model "{echo(chosen)}" was not found',
                code="model_not_found",
                param="sd_model_checkpoint",
            )
    model = chosen or _header_model(ctx) or default_image_model(node)
    await _run(ctx, node, model)
    if chosen is not None and 200 <= ctx.status < 300:
        _selected[node.node_id] = chosen


async def handle_refresh_checkpoints(ctx: Ctx, node: Node) -> None:
    # The router's model list is always current (the registry), so there is nothing to do.
    await ctx.json(200, {})


async def handle_passthrough(ctx: Ctx, node: Node) -> None:
    """Other sdapi and sd.cpp paths, and ComfyUI's model-less ones: the model the request
    names, else the default image model."""
    model = _header_model(ctx)
    if model is None and ctx.method == "POST" and _request_type(ctx).startswith(JSON):
        model = _body_model(parse_json_body(ctx))
    await _run(ctx, node, model or default_image_model(node))


# -- ComfyUI ---------------------------------------------------------------------------------


def _workflow_loaders(doc: dict[str, Any]) -> list[tuple[dict[str, Any], str]]:
    """The workflow's model loaders: each node's inputs and the input naming the model (a
    checkpoint loader's `ckpt_name`, a diffusion model loader's `unet_name`)."""
    prompt = doc.get("prompt")
    if not isinstance(prompt, dict):
        raise RouterError(400, "prompt must be a workflow object", param="prompt")
    return [
        (inputs, key)
        for graph_node in prompt.values()
        if isinstance(graph_node, dict) and isinstance(inputs := graph_node.get("inputs"), dict)
        for key in MODEL_INPUTS
        if isinstance(inputs.get(key), str)
    ]


def _model_of_checkpoint(node: Node, name: str) -> str:
    """The image model a ComfyUI loader's name means: the ID itself, or ID + file ending."""
    if candidates(node, name, "image"):
        return name
    for suffix in CHECKPOINT_SUFFIXES:
        if name.endswith(suffix) and candidates(node, name[: -len(suffix)], "image"):
            return name[: -len(suffix)]
    require_view(node)
    raise RouterError(
        404,
        f'model "{echo(name)}" the workflow loads is not an image model here',
        code="model_not_found",
        param="prompt",
    )


async def handle_comfy_prompt(ctx: Ctx, node: Node) -> None:
    """`POST /prompt`: run the workflow where its checkpoint is; its prompt ID follows it.
    `GET /prompt` (the queue's size) goes where the model-less paths go."""
    if ctx.method != "POST":
        await handle_passthrough(ctx, node)
        return
    doc = parse_json_body(ctx)
    loaders = _workflow_loaders(doc)
    named = {inputs[key] for inputs, key in loaders}
    if len(named) > 1:
        raise RouterError(
            400, "the workflow loads more than one model; one node serves one", param="prompt"
        )
    model = _body_model(doc) or _header_model(ctx)
    if model is None and named:
        model = _model_of_checkpoint(node, named.pop())
    if model is None:
        # A generation, so never the first of several models by ID (see the module's doc).
        model = _selection_or_single(node)
        if model is None:
            raise RouterError(
                400, "the workflow loads no model this router knows; name one", param="model"
            )
    public = model

    def body(target: Replica) -> bytes:
        served = _served_id(target)
        if served == public or not loaders:
            return ctx.body
        for inputs, key in loaders:
            name = inputs[key]
            for ending in ("", *CHECKPOINT_SUFFIXES):
                if name == public + ending:
                    inputs[key] = served + ending
                    break
        return orjson.dumps(doc)

    tap = _Tap(ctx)
    await _run(ctx, node, public, body=body)
    found = tap.doc()
    prompt_id = found.get("prompt_id") if isinstance(found, dict) else None
    _remember(ctx, node, COMFY, prompt_id if isinstance(prompt_id, str) and prompt_id else None)


async def handle_comfy_ws_http(ctx: Ctx, node: Node) -> None:
    """A plain GET on ComfyUI's progress socket: it can only be used with an upgrade."""
    raise RouterError(
        426,
        f"{COMFY_WS_PATH} is a WebSocket: connect with an Upgrade: websocket request",
        code="upgrade_required",
    )


async def handle_comfy_history_item(ctx: Ctx, node: Node) -> None:
    """`/history/{prompt_id}`: the prompt's node answers; its output files follow it."""
    prompt_id = ctx.path[len("/history/") :]
    tap = _Tap(ctx)
    await _follow(ctx, node, COMFY, prompt_id)
    for filename in _output_files(tap.doc()):
        _remember(ctx, node, COMFY_FILE, filename)


def _output_files(doc: Any) -> list[str]:
    """The output file names of a ComfyUI history answer."""
    names: list[str] = []
    entries = doc.values() if isinstance(doc, dict) else ()
    for entry in entries:
        outputs = entry.get("outputs") if isinstance(entry, dict) else None
        for output in outputs.values() if isinstance(outputs, dict) else ():
            for files in output.values() if isinstance(output, dict) else ():
                for item in files if isinstance(files, list) else ():
                    name = item.get("filename") if isinstance(item, dict) else None
                    if isinstance(name, str) and name:
                        names.append(name)
    return names


async def handle_comfy_view(ctx: Ctx, node: Node) -> None:
    """`/view?filename=`: the node whose history named the file, else the default model."""
    filename = parse_qs(_query(ctx)).get("filename", [""])[0]
    if filename:
        await _follow(ctx, node, COMFY_FILE, filename)
        return
    await _run(ctx, node, default_image_model(node))


async def handle_comfy_interrupt(ctx: Ctx, node: Node) -> None:
    """`POST /interrupt`: a named prompt's node, else the default image model's."""
    doc = parse_json_body(ctx) if _request_type(ctx).startswith(JSON) else {}
    prompt_id = doc.get("prompt_id")
    if isinstance(prompt_id, str) and prompt_id:
        await _follow(ctx, node, COMFY, prompt_id)
        return
    await _run(ctx, node, _header_model(ctx) or default_image_model(node))


GET_POST = GET | POST

ROUTES: dict[str, Route] = {
    "/v1/images/generations": (POST, handle_image_generations, True),
    "/v1/images/edits": (POST, handle_images, True),
    "/v1/images/variations": (POST, handle_images, True),
    "/v1/images/{path}": (POST, handle_images, True),
    # As img2img, so that a request naming no model runs on the selected one.
    "/sdapi/v1/txt2img": (POST, handle_generation, True),
    "/sdapi/v1/img2img": (POST, handle_generation, True),
    "/sdapi/v1/options": (GET_POST, handle_options, True),
    "/sdapi/v1/sd-models": (GET, handle_sd_models, True),
    "/sdapi/v1/refresh-checkpoints": (POST, handle_refresh_checkpoints, True),
    "/sdapi/v1/{path}": (GET_POST, handle_passthrough, True),
    "/sdcpp/v1/img_gen": (POST, handle_generation, True),
    "/sdcpp/v1/vid_gen": (POST, handle_generation, True),
    "/sdcpp/v1/jobs/{job_id}": (GET | frozenset({"DELETE"}), handle_sdcpp_job, True),
    "/sdcpp/v1/jobs/{job_id}/cancel": (POST, handle_sdcpp_job, True),
    "/sdcpp/v1/{path}": (GET_POST, handle_passthrough, True),
    "/prompt": (GET_POST, handle_comfy_prompt, True),
    "/queue": (GET_POST, handle_passthrough, True),
    "/history": (GET_POST, handle_passthrough, True),
    "/history/{prompt_id}": (GET, handle_comfy_history_item, True),
    "/view": (GET, handle_comfy_view, True),
    "/object_info": (GET, handle_passthrough, True),
    "/object_info/{path}": (GET, handle_passthrough, True),
    "/system_stats": (GET, handle_passthrough, True),
    "/interrupt": (POST, handle_comfy_interrupt, True),
    "/upload/image": (POST, handle_passthrough, True),
    "/upload/mask": (POST, handle_passthrough, True),
    # The WebSocket itself is the edge's (proxy/edge/realtime.py); this route gives its upgrade
    # the key rules of every client path, and a plain GET the reason it fails.
    COMFY_WS_PATH: (GET, handle_comfy_ws_http, True),
}
