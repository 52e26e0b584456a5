"""OpenAPI paths of the media family, joined by `proxy.api.client_paths`."""

from __future__ import annotations

from typing import Any

from proxy.families.openapi import (
    _client_op,
    _error,
    _json_body,
    _json_response,
    _obj,
    _ref,
    _str,
)

Schema = dict[str, Any]

TAG = "Client: images"
BINARY = "application/octet-stream"


def _answer(description: str) -> Schema:
    return _json_response(description, _ref("BackendAnswer"))


def _backend_json(description: str) -> Schema:
    return _json_response(description, {"description": "The backend's answer, as it sent it."})


def _form(description: str) -> Schema:
    schema = _obj(
        {
            "model": _str("Public image ID; the X-Tensors-Model header may name it instead."),
            "image": _str("The image.", contentMediaType="image/png"),
            "prompt": _str(),
        },
        description=description,
    )
    return {"required": True, "content": {"multipart/form-data": {"schema": schema}}}


def _any_json() -> Schema:
    return _json_body({"type": "object", "description": "Passed to the backend as it is."})


def _param(name: str, description: str) -> Schema:
    return {
        "name": name,
        "in": "path",
        "required": True,
        "schema": {"type": "string"},
        "description": description,
    }


def _op(
    operation_id: str,
    summary: str,
    ok: Schema,
    *,
    body: Schema | None = None,
    params: list[Schema] | None = None,
) -> Schema:
    op = _client_op(operation_id, summary, TAG, ok, body=body)
    if params:
        op["parameters"] = params
    return op


REST = _param("path", "The rest of the path (slashes included), passed to the backend.")
JOB = _param("job_id", "An sd.cpp job ID from img_gen or vid_gen; its node answers.")
PROMPT = _param("prompt_id", "A ComfyUI prompt ID from POST /prompt; its node answers.")
DEFAULT = (
    " A request that names no model goes to the default image model: the checkpoint selected"
    " with POST /sdapi/v1/options on this node, else the only enabled image model, else the"
    " first by ID."
)


def paths() -> dict[str, Schema]:
    """The family's client paths, keyed as in `proxy.edge.routes.ROUTES`."""
    job = _backend_json("The job: its ID, status, model and (once done) result.")
    return {
        "/v1/images/edits": {
            "post": _op(
                "openaiImageEdits",
                "Image edit (multipart, the model in its form field)",
                _answer("The images."),
                body=_form("OpenAI's edit form."),
            )
        },
        "/v1/images/variations": {
            "post": _op(
                "openaiImageVariations",
                "Image variations (multipart, the model in its form field)",
                _answer("The images."),
                body=_form("OpenAI's variation form."),
            )
        },
        "/v1/images/{path}": {
            "post": _op(
                "openaiImagesOther",
                "Any other /v1/images/* path: JSON as generations, multipart as edits",
                _answer("The backend's answer."),
                body=_json_body(_ref("ImageRequest")),
                params=[REST],
            )
        },
        "/sdapi/v1/img2img": {
            "post": _op(
                "sdImg2Img",
                "Image to image, AUTOMATIC1111 style." + DEFAULT,
                _answer("The images."),
                body=_json_body(_ref("Txt2ImgRequest")),
            )
        },
        "/sdapi/v1/options": {
            "get": _op(
                "sdOptionsGet",
                "The selected model's options; sd_model_checkpoint is its public ID",
                _backend_json("The options."),
            ),
            "post": _op(
                "sdOptionsSet",
                "Set options; sd_model_checkpoint selects the model later sdapi requests"
                " without one run on (per node, until it restarts)",
                _backend_json("The backend's answer."),
                body=_json_body(
                    _obj({"sd_model_checkpoint": _str("Public image ID.", minLength=1)})
                ),
            ),
        },
        "/sdapi/v1/refresh-checkpoints": {
            "post": _op(
                "sdRefreshCheckpoints",
                "Answered here with {}: the router's model list is always current",
                _json_response("Nothing to report.", _obj({})),
            )
        },
        "/sdapi/v1/{path}": {
            "get": _op(
                "sdOtherGet",
                "Any other sdapi path." + DEFAULT,
                _backend_json("The answer."),
                params=[REST],
            ),
            "post": _op(
                "sdOtherPost",
                "Any other sdapi path." + DEFAULT,
                _backend_json("The answer."),
                body=_any_json(),
                params=[REST],
            ),
        },
        "/sdcpp/v1/img_gen": {
            "post": _op(
                "sdcppImgGen",
                "sd.cpp image job; its ID follows the node that runs it." + DEFAULT,
                job,
                body=_json_body(_ref("ImageRequest")),
            )
        },
        "/sdcpp/v1/vid_gen": {
            "post": _op(
                "sdcppVidGen",
                "sd.cpp video job (image lane); its ID follows the node that runs it." + DEFAULT,
                job,
                body=_json_body(_ref("ImageRequest")),
            )
        },
        "/sdcpp/v1/jobs/{job_id}": {
            "get": _op("sdcppJob", "An sd.cpp job's status, from its node", job, params=[JOB]),
            "delete": _op("sdcppJobDelete", "Delete a job, on its node", job, params=[JOB]),
        },
        "/sdcpp/v1/jobs/{job_id}/cancel": {
            "post": _op("sdcppJobCancel", "Cancel a job, on its node", job, params=[JOB]),
        },
        "/sdcpp/v1/{path}": {
            "get": _op(
                "sdcppOtherGet",
                "Any other sd.cpp path." + DEFAULT,
                _backend_json("The answer."),
                params=[REST],
            ),
            "post": _op(
                "sdcppOtherPost",
                "Any other sd.cpp path." + DEFAULT,
                _backend_json("The answer."),
                body=_any_json(),
                params=[REST],
            ),
        },
        **_comfy_paths(),
    }


def _comfy_paths() -> dict[str, Schema]:
    answer = _backend_json("ComfyUI's answer, as the backend sent it.")
    workflow = _json_body(
        _obj(
            {
                "prompt": {
                    "type": "object",
                    "description": "The workflow; its model loader's ckpt_name or unet_name (a"
                    " public image ID, a file ending allowed) names the model.",
                },
                "model": _str("Public image ID, when the workflow names none."),
                "client_id": _str(),
            },
            required=("prompt",),
        )
    )
    upload = {
        "required": True,
        "content": {"multipart/form-data": {"schema": _obj({"image": _str()})}},
    }
    return {
        "/prompt": {
            "get": _op("comfyPromptInfo", "ComfyUI queue size." + DEFAULT, answer),
            "post": _op(
                "comfyPrompt",
                "Queue a ComfyUI workflow on its checkpoint's node; the prompt ID follows it",
                answer,
                body=workflow,
            ),
        },
        "/queue": {
            "get": _op("comfyQueue", "ComfyUI queue." + DEFAULT, answer),
            "post": _op(
                "comfyQueueEdit", "Clear or delete queue items." + DEFAULT, answer, body=_any_json()
            ),
        },
        "/history": {
            "get": _op("comfyHistory", "ComfyUI history." + DEFAULT, answer),
            "post": _op(
                "comfyHistoryEdit", "Clear or delete history." + DEFAULT, answer, body=_any_json()
            ),
        },
        "/history/{prompt_id}": {
            "get": _op(
                "comfyHistoryItem", "One prompt's history, from its node", answer, params=[PROMPT]
            ),
        },
        "/view": {
            "get": _op(
                "comfyView",
                "An output file, from the node whose history named it, else the default",
                {"description": "The file.", "content": {BINARY: {"schema": {}}}},
            )
        },
        "/object_info": {
            "get": _op("comfyObjectInfo", "ComfyUI node types." + DEFAULT, answer),
        },
        "/object_info/{path}": {
            "get": _op("comfyObjectInfoOne", "One node type." + DEFAULT, answer, params=[REST]),
        },
        "/system_stats": {
            "get": _op("comfySystemStats", "ComfyUI system stats." + DEFAULT, answer),
        },
        "/interrupt": {
            "post": _op(
                "comfyInterrupt",
                "Interrupt: a named prompt_id's node, else the default image model's",
                answer,
                body=_json_body(_obj({"prompt_id": _str()}), required=False),
            )
        },
        "/upload/image": {
            "post": _op(
                "comfyUploadImage", "Upload an input image." + DEFAULT, answer, body=upload
            ),
        },
        "/upload/mask": {
            "post": _op("comfyUploadMask", "Upload a mask." + DEFAULT, answer, body=upload),
        },
        "/ws": {"get": _comfy_socket()},
    }


def _comfy_socket() -> Schema:
    op = _op("comfyProgressSocket", "ComfyUI's progress WebSocket", {"description": "See 101."})
    op["description"] = (
        "A WebSocket relayed to the image backend of `?model=` (else the default image model, "
        "on whichever node holds it), which sends the progress of the prompts posted there with "
        "the same `client_id`. A socket that cannot start gets one `error` event and close code "
        "4000 + the HTTP status."
    )
    op["parameters"] = [
        {"name": "clientId", "in": "query", "required": False, "schema": _str()},
        {"name": "model", "in": "query", "required": False, "schema": _str("Public image ID.")},
    ]
    responses = op["responses"]
    responses.pop("200")
    responses["101"] = {"description": "Switching Protocols: the progress socket."}
    responses["426"] = _error("A GET without the WebSocket upgrade (code upgrade_required).")
    return op
