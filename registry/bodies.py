"""Request bodies passed on to another model: the model field set to the ID that serves them.

Nodes pass a request on under a different model ID than the client asked for (a public ID to
the local ID that serves it, an owner's model to the helper's it is lent to), and the node
that serves it prices and records it by its body: so the rewrite keeps every other byte.
"""

from __future__ import annotations

import re

import orjson


class InvalidRequestJSON(ValueError):
    """A request body that must be a JSON object is not."""


_MODEL_VALUE_RE = re.compile(rb'"model"\s*:\s*')


def set_body_model(body: bytes, model: str) -> bytes:
    """Set (or insert) the top-level ``model`` of a request body.

    An existing string ID is replaced in place, so the rest of the body keeps its bytes: the
    node that serves the request measures the same body size (and, on a backend that counts
    tokens from bytes, the same prompt) as the node that received it, which is what lets a
    helper's cost fit price an owner's held work. The splice is checked by parsing it; when
    it cannot be shown equal, the body is re-serialised.
    """
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequestJSON("request body is not valid json") from exc
    if not isinstance(obj, dict):
        raise InvalidRequestJSON("request body is not a json object")
    current = obj.get("model")
    if current == model:
        return body
    obj["model"] = model
    if isinstance(current, str):
        old, new = orjson.dumps(current), orjson.dumps(model)
        # A nested object may have a "model" of its own: each place is tried until the
        # parsed result is the top-level change and nothing else.
        for match in _MODEL_VALUE_RE.finditer(body):
            start = match.end()
            if body.startswith(old, start):
                spliced = body[:start] + new + body[start + len(old) :]
                if orjson.loads(spliced) == obj:
                    return spliced
    return orjson.dumps(obj)


def set_image_body_model(body: bytes, public_id: str, served_id: str) -> bytes:
    """An image request body for the node or backend that serves `public_id` as `served_id`.

    sd-server and AUTOMATIC1111 (Forge) clients name the checkpoint in three places: the
    top-level `model`, a top-level `sd_model_checkpoint`, and
    `override_settings.sd_model_checkpoint`. `model` is set as for any request; each
    checkpoint field only where it names the public ID (surrounding spaces ignored), so a
    client's other settings pass through untouched.
    """
    body = set_body_model(body, served_id)
    if public_id == served_id or b"sd_model_checkpoint" not in body:
        return body
    obj = orjson.loads(body)
    changed = False
    for holder in (obj, obj.get("override_settings")):
        if not isinstance(holder, dict):
            continue
        value = holder.get("sd_model_checkpoint")
        if isinstance(value, str) and value.strip() == public_id:
            holder["sd_model_checkpoint"] = served_id
            changed = True
    return orjson.dumps(obj) if changed else body
