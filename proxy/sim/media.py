"""The simulated backend's media paths: just enough of each to test routing.

img2img and the OpenAI edits and variations answer as txt2img and generations do; sdapi
options are a per-process dict; sd.cpp's async jobs and ComfyUI prompts run in the background
for their simulated time (holding the one slot, as real work would), and their status answers
say pending until then. Job and prompt IDs are random, so two simulated backends never hand
out the same one and a router that asks the wrong backend gets a 404. ComfyUI's `/ws` tells
each socket of a prompt's `client_id` its progress (start, each step, done).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from proxy.sim import server
from proxy.work import image_work, multipart_field

JOBS_KEY = web.AppKey("sim_media_jobs", dict)
OPTIONS_KEY = web.AppKey("sim_media_options", dict)
TASKS_KEY = web.AppKey("sim_media_tasks", set)
SOCKETS_KEY = web.AppKey("sim_comfy_sockets", dict)
PNG_B64 = server.TINY_PNG_B64
PNG = base64.b64decode(PNG_B64)


@dataclass
class _Job:
    """An sd.cpp job or a ComfyUI prompt: pending until its simulated work is done."""

    ident: str
    model: str
    kind: str
    count: int
    created: int = field(default_factory=lambda: int(time.time()))
    done: bool = False
    cancelled: bool = False
    workflow: dict[str, Any] = field(default_factory=dict)
    task: asyncio.Task[None] | None = None

    @property
    def filename(self) -> str:
        return f"sim_{self.ident}.png"


def _jobs(request: web.Request) -> dict[str, _Job]:
    jobs: dict[str, _Job] = request.app[JOBS_KEY]
    return jobs


def _duration_ms(state: server.SimState, body: dict[str, Any]) -> float | web.Response:
    try:
        work = image_work(body)
    except ValueError as exc:
        return server._bad_request(str(exc))
    megapixel_steps = work.width * work.height / 1e6 * work.steps * work.n
    return state.weights.base_ms + state.weights.image_ms_per_megapixel_step * megapixel_steps


async def _read(request: web.Request) -> dict[str, Any] | web.Response:
    state = request.app[server.STATE_KEY]
    if not state.loaded:
        return server._loading()
    _, parsed = await server._read_json(request)
    return parsed


Notify = Callable[[dict[str, Any]], Awaitable[None]]


def _start(
    request: web.Request,
    job: _Job,
    duration_ms: float,
    seen: dict[str, Any],
    *,
    steps: int = 1,
    notify: Notify | None = None,
) -> None:
    """Run `job` in the background for its simulated time, step by step, then mark it done;
    `notify` hears ComfyUI's progress messages for it."""
    state = request.app[server.STATE_KEY]

    async def tell(kind: str, **data: Any) -> None:
        if notify is not None:
            await notify({"type": kind, "data": {**data, "prompt_id": job.ident}})

    async def run() -> None:
        try:
            async with state.slot(request.path, duration_ms, seen=seen):
                await tell("execution_start")
                for step in range(1, steps + 1):
                    await asyncio.sleep(duration_ms / 1000.0 / steps)
                    await tell("progress", value=step, max=steps, node=_SAMPLER_NODE)
            job.done = True
            await tell("executed", node=_OUTPUT_NODE, output=_history_entry(job)["outputs"]["9"])
            await tell("execution_success")
            # ComfyUI's sign that the prompt is over: executing no node.
            await tell("executing", node=None)
        except asyncio.CancelledError:
            job.cancelled = True

    task = job.task = asyncio.get_running_loop().create_task(run())
    tasks: set[asyncio.Task[None]] = request.app[TASKS_KEY]
    tasks.add(task)
    task.add_done_callback(tasks.discard)
    _jobs(request)[job.ident] = job


def _model(state: server.SimState, body: dict[str, Any]) -> str:
    return server._model_name(state, body)


# -- sdapi ---------------------------------------------------------------------------------


async def handle_img2img(request: web.Request) -> web.Response:
    # The source image is not looked at: the work is priced as txt2img's.
    return await server.handle_txt2img(request)


async def handle_options_get(request: web.Request) -> web.Response:
    state = request.app[server.STATE_KEY]
    if not state.loaded:
        return server._loading()
    options: dict[str, Any] = request.app[OPTIONS_KEY]
    return server._json({"sd_model_checkpoint": state.config.alias, **options})


async def handle_options_post(request: web.Request) -> web.Response:
    parsed = await _read(request)
    if isinstance(parsed, web.Response):
        return parsed
    state = request.app[server.STATE_KEY]
    # Recorded as work so that tests can read which checkpoint the router named.
    async with state.slot(request.path, 0.0, seen=server._seen(request, parsed)):
        pass
    options: dict[str, Any] = request.app[OPTIONS_KEY]
    options.update({k: v for k, v in parsed.items() if k not in ("model", "sd_model_checkpoint")})
    return server._json(None)


# -- OpenAI edits and variations (multipart) -------------------------------------------------


async def handle_image_form(request: web.Request) -> web.Response:
    state = request.app[server.STATE_KEY]
    if not state.loaded:
        return server._loading()
    raw = await request.read()
    ctype = request.headers.get("Content-Type", "")
    if multipart_field(raw, ctype, "image") is None:
        return server._bad_request("multipart body has no image field")
    model = multipart_field(raw, ctype, "model")
    size = multipart_field(raw, ctype, "size")
    n = multipart_field(raw, ctype, "n")
    fields: dict[str, Any] = {}
    if size:
        fields["size"] = size.decode()
    if n and n.strip().isdigit():
        fields["n"] = int(n)
    duration = _duration_ms(state, fields)
    if isinstance(duration, web.Response):
        return duration
    seen = {"model": model.decode() if model is not None else None}
    async with state.slot(request.path, duration, seen=seen):
        await asyncio.sleep(duration / 1000.0)
    count = fields.get("n", 1)
    return server._json({"created": int(time.time()), "data": [{"b64_json": PNG_B64}] * count})


# -- sd.cpp async jobs ---------------------------------------------------------------------


async def handle_sdcpp_submit(request: web.Request) -> web.Response:
    parsed = await _read(request)
    if isinstance(parsed, web.Response):
        return parsed
    state = request.app[server.STATE_KEY]
    duration = _duration_ms(state, parsed)
    if isinstance(duration, web.Response):
        return duration
    kind = "video" if request.path.endswith("vid_gen") else "image"
    count = int(parsed.get("video_frames", 1)) if kind == "video" else 1
    job = _Job(uuid.uuid4().hex, _model(state, parsed), kind, max(1, count))
    _start(request, job, duration, server._seen(request, parsed))
    return server._json(_job_doc(job))


def _job_doc(job: _Job) -> dict[str, Any]:
    status = "cancelled" if job.cancelled else "completed" if job.done else "pending"
    doc: dict[str, Any] = {
        "id": job.ident,
        "object": f"{job.kind}.job",
        "model": job.model,
        "created": job.created,
        "status": status,
    }
    if job.done:
        doc["result"] = {"images": [server.TINY_PNG_B64] * job.count}
    return doc


def _job_or_404(request: web.Request) -> _Job | web.Response:
    job = _jobs(request).get(request.match_info["job_id"])
    if job is None:
        return server._error(404, "job not found", "not_found_error")
    return job


async def handle_sdcpp_job(request: web.Request) -> web.Response:
    job = _job_or_404(request)
    if isinstance(job, web.Response):
        return job
    return server._json(_job_doc(job))


async def handle_sdcpp_cancel(request: web.Request) -> web.Response:
    job = _job_or_404(request)
    if isinstance(job, web.Response):
        return job
    if not job.done and job.task is not None:
        job.task.cancel()
        job.cancelled = True
    return server._json(_job_doc(job))


# -- ComfyUI ---------------------------------------------------------------------------------


def _loaded_model(workflow: dict[str, Any]) -> str | None:
    """What the workflow's model loader names (a checkpoint or a diffusion model)."""
    for graph_node in workflow.values():
        inputs = graph_node.get("inputs") if isinstance(graph_node, dict) else None
        for key in ("ckpt_name", "unet_name"):
            if isinstance(inputs, dict) and isinstance(inputs.get(key), str):
                return str(inputs[key])
    return None


async def handle_comfy_prompt(request: web.Request) -> web.Response:
    parsed = await _read(request)
    if isinstance(parsed, web.Response):
        return parsed
    workflow = parsed.get("prompt")
    if not isinstance(workflow, dict):
        return server._error(400, "prompt must be a workflow", "invalid_prompt")
    state = request.app[server.STATE_KEY]
    sampler: dict[str, Any] = next(
        (
            n["inputs"]
            for n in workflow.values()
            if isinstance(n, dict) and isinstance(n.get("inputs"), dict) and "steps" in n["inputs"]
        ),
        {},
    )
    duration = _duration_ms(state, {"steps": sampler.get("steps", 1)})
    if isinstance(duration, web.Response):
        return duration
    job = _Job(uuid.uuid4().hex, _model(state, parsed), "comfy", 1, workflow=workflow)
    seen = {**server._seen(request, parsed), "loads": _loaded_model(workflow)}
    steps = sampler.get("steps", 1)
    client_id = parsed.get("client_id")
    notify = _notifier(request, client_id) if isinstance(client_id, str) else None
    _start(
        request, job, duration, seen, steps=steps if isinstance(steps, int) else 1, notify=notify
    )
    number = len(_jobs(request))
    return server._json({"prompt_id": job.ident, "number": number, "node_errors": {}})


def _history_entry(job: _Job) -> dict[str, Any]:
    image = {"filename": job.filename, "subfolder": "", "type": "output"}
    return {
        "prompt": [0, job.ident, job.workflow, {}, ["9"]],
        "outputs": {"9": {"images": [image]}},
        "status": {"status_str": "success", "completed": True, "messages": []},
    }


async def handle_comfy_history(request: web.Request) -> web.Response:
    done = {i: _history_entry(j) for i, j in _jobs(request).items() if j.kind == "comfy" and j.done}
    return server._json(done)


async def handle_comfy_history_item(request: web.Request) -> web.Response:
    job = _jobs(request).get(request.match_info["prompt_id"])
    if job is None or job.kind != "comfy" or not job.done:
        # ComfyUI answers an unknown or unfinished prompt with an empty object.
        return server._json({})
    return server._json({job.ident: _history_entry(job)})


async def handle_comfy_view(request: web.Request) -> web.Response:
    name = request.query.get("filename", "")
    if not any(j.filename == name and j.done for j in _jobs(request).values()):
        return web.Response(status=404)
    return web.Response(body=PNG, content_type="image/png")


async def handle_comfy_queue(request: web.Request) -> web.Response:
    pending = [
        [0, j.ident, j.workflow, {}, []]
        for j in _jobs(request).values()
        if j.kind == "comfy" and not j.done
    ]
    return server._json({"queue_running": pending[:1], "queue_pending": pending[1:]})


async def handle_comfy_system_stats(request: web.Request) -> web.Response:
    state = request.app[server.STATE_KEY]
    return server._json(
        {
            "system": {"os": "sim", "comfyui_version": "sim", "python_version": "sim"},
            "devices": [{"name": f"sim:{state.config.alias}", "type": "cpu"}],
        }
    )


async def handle_comfy_object_info(request: web.Request) -> web.Response:
    state = request.app[server.STATE_KEY]
    loader = {
        "input": {"required": {"ckpt_name": [[state.config.alias]]}},
        "output": ["MODEL", "CLIP", "VAE"],
        "name": "CheckpointLoaderSimple",
    }
    return server._json({"CheckpointLoaderSimple": loader})


async def handle_comfy_ok(request: web.Request) -> web.Response:
    await request.read()
    return server._json({})


async def handle_comfy_upload(request: web.Request) -> web.Response:
    raw = await request.read()
    ctype = request.headers.get("Content-Type", "")
    if multipart_field(raw, ctype, "image") is None:
        return server._bad_request("multipart body has no image field")
    return server._json(
        {"name": f"upload_{uuid.uuid4().hex[:8]}.png", "subfolder": "", "type": "input"}
    )


# The sampler's and the output's node IDs in the progress messages (the tests' workflows).
_SAMPLER_NODE = "3"
_OUTPUT_NODE = "9"


def _notifier(request: web.Request, client_id: str) -> Notify:
    """Send a message to every progress socket of `client_id`, as ComfyUI does; a socket that
    went away is skipped."""
    sockets: dict[str, set[web.WebSocketResponse]] = request.app[SOCKETS_KEY]

    async def notify(message: dict[str, Any]) -> None:
        for ws in list(sockets.get(client_id, ())):
            with contextlib.suppress(ConnectionResetError, RuntimeError):
                await ws.send_json(message)

    return notify


async def handle_comfy_ws(request: web.Request) -> web.WebSocketResponse:
    """ComfyUI's progress socket: a status message on connect, then the progress of every
    prompt posted with this `clientId`."""
    ws = web.WebSocketResponse()
    await ws.prepare(request)
    client_id = request.query.get("clientId") or uuid.uuid4().hex
    sockets: dict[str, set[web.WebSocketResponse]] = request.app[SOCKETS_KEY]
    sockets.setdefault(client_id, set()).add(ws)
    try:
        pending = sum(1 for j in _jobs(request).values() if j.kind == "comfy" and not j.done)
        status = {"status": {"exec_info": {"queue_remaining": pending}}, "sid": client_id}
        await ws.send_json({"type": "status", "data": status})
        async for _ in ws:
            pass  # ComfyUI's clients send nothing that matters here
    finally:
        sockets[client_id].discard(ws)
        if not sockets[client_id]:
            del sockets[client_id]
    return ws


def register(app: web.Application) -> None:
    """Add this family's routes to the simulated backend."""
    app[JOBS_KEY] = {}
    app[SOCKETS_KEY] = {}
    app.router.add_get("/ws", handle_comfy_ws)
    app[OPTIONS_KEY] = {}
    app[TASKS_KEY] = set()
    app.router.add_post("/sdapi/v1/img2img", handle_img2img)
    app.router.add_get("/sdapi/v1/options", handle_options_get)
    app.router.add_post("/sdapi/v1/options", handle_options_post)
    app.router.add_post("/v1/images/edits", handle_image_form)
    app.router.add_post("/v1/images/variations", handle_image_form)
    app.router.add_post("/sdcpp/v1/img_gen", handle_sdcpp_submit)
    app.router.add_post("/sdcpp/v1/vid_gen", handle_sdcpp_submit)
    app.router.add_get("/sdcpp/v1/jobs/{job_id}", handle_sdcpp_job)
    app.router.add_post("/sdcpp/v1/jobs/{job_id}/cancel", handle_sdcpp_cancel)
    app.router.add_post("/prompt", handle_comfy_prompt)
    app.router.add_get("/history", handle_comfy_history)
    app.router.add_get("/history/{prompt_id}", handle_comfy_history_item)
    app.router.add_get("/view", handle_comfy_view)
    app.router.add_get("/queue", handle_comfy_queue)
    app.router.add_get("/system_stats", handle_comfy_system_stats)
    app.router.add_get("/object_info", handle_comfy_object_info)
    app.router.add_post("/interrupt", handle_comfy_ok)
    app.router.add_post("/upload/image", handle_comfy_upload)
    app.router.add_post("/upload/mask", handle_comfy_upload)
