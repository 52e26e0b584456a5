"""How much work an inference request asks for.

The simulated backend and the router's analytics both import this module so that the
time the sim spends on a request and the work the router books for it are computed
from the very same numbers. Pure and stdlib-only: the sim imports it at start-up.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

DEFAULT_MAX_TOKENS = 16
DEFAULT_IMAGE_WIDTH = 512
DEFAULT_IMAGE_HEIGHT = 512
DEFAULT_IMAGE_STEPS = 20

# One token per four bytes is the rule of thumb the contract fixes for prompt size.
BYTES_PER_PROMPT_TOKEN = 4

# Checked in this order: OpenAI (classic, then the newer name), llama.cpp native, Kobold.
_OUTPUT_TOKEN_KEYS = ("max_tokens", "max_completion_tokens", "n_predict", "max_length")

_SIZE_RE = re.compile(r"\s*(\d+)\s*[xX]\s*(\d+)\s*")

# Streaming WAV writers that cannot seek back put this in the data chunk's size.
_WAV_UNKNOWN_SIZE = 0xFFFFFFFF
_WAV_ERROR = "audio must be WAV"


def prompt_tokens_for_bytes(n_bytes: int) -> int:
    """Prompt tokens for a request body of `n_bytes` bytes (rounded up)."""
    if n_bytes <= 0:
        return 0
    return -(-n_bytes // BYTES_PER_PROMPT_TOKEN)


def _positive_int(value: Any) -> int | None:
    # bool is an int subclass; `true` is never a token count.
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if value > 0 else None


def requested_output_tokens(body: dict[str, Any]) -> int | None:
    """The output token limit the client asked for, or None if it gave no usable one."""
    if not isinstance(body, dict):
        return None
    for key in _OUTPUT_TOKEN_KEYS:
        found = _positive_int(body.get(key))
        if found is not None:
            return found
    options = body.get("options")
    if isinstance(options, dict):
        return _positive_int(options.get("num_predict"))
    return None


def output_tokens(body: dict[str, Any]) -> int:
    """Output tokens a request will produce: the requested limit, else the default."""
    requested = requested_output_tokens(body)
    return DEFAULT_MAX_TOKENS if requested is None else requested


@dataclass(frozen=True)
class ImageWork:
    width: int
    height: int
    steps: int
    n: int

    @property
    def units(self) -> int:
        """Pixel-steps over the whole batch: what image time scales with."""
        return self.width * self.height * self.steps * self.n


class WorkError(ValueError):
    """A request field the router refuses; `param` names it for the error envelope."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def _image_int(body: dict[str, Any], keys: tuple[str, ...], default: int) -> int:
    for key in keys:
        value = body.get(key)
        if value is None:
            continue
        # JSON clients sometimes send 512.0; accept it but nothing fractional.
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise WorkError(f"{key} must be a positive integer", key)
        return value
    return default


def image_work(body: dict[str, Any]) -> ImageWork:
    """Image work of an OpenAI images or sdapi txt2img request; ValueError names a bad field."""
    if not isinstance(body, dict):
        raise ValueError("body must be a JSON object")
    size = body.get("size")
    if size is not None and size != "auto":
        match = _SIZE_RE.fullmatch(size) if isinstance(size, str) else None
        if match is None:
            raise WorkError("size must look like WIDTHxHEIGHT", "size")
        width, height = int(match.group(1)), int(match.group(2))
        if width <= 0 or height <= 0:
            raise WorkError("size must have a positive width and height", "size")
    else:
        width = _image_int(body, ("width",), DEFAULT_IMAGE_WIDTH)
        height = _image_int(body, ("height",), DEFAULT_IMAGE_HEIGHT)
    steps = _image_int(body, ("steps", "sample_steps"), DEFAULT_IMAGE_STEPS)
    n = _image_int(body, ("n", "batch_size"), 1)
    return ImageWork(width=width, height=height, steps=steps, n=n)


def wav_duration_seconds(data: bytes) -> float:
    """Seconds of audio in a RIFF/WAVE file, from its fmt byte rate and data size."""
    if len(data) < 12 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        raise ValueError(_WAV_ERROR)
    byte_rate: int | None = None
    data_size: int | None = None
    offset = 12
    while offset + 8 <= len(data) and (byte_rate is None or data_size is None):
        chunk_id = data[offset : offset + 4]
        (chunk_size,) = struct.unpack_from("<I", data, offset + 4)
        body_start = offset + 8
        remaining = len(data) - body_start
        if chunk_id == b"fmt ":
            if chunk_size < 16 or remaining < 16:
                raise ValueError(_WAV_ERROR)
            (byte_rate,) = struct.unpack_from("<I", data, body_start + 8)
        elif chunk_id == b"data":
            # A truncated upload or a streamed file: count the bytes that are really there.
            data_size = remaining if chunk_size == _WAV_UNKNOWN_SIZE else min(chunk_size, remaining)
        if chunk_size == _WAV_UNKNOWN_SIZE:
            break
        # RIFF chunks are padded to an even length.
        offset = body_start + chunk_size + (chunk_size & 1)
    if not byte_rate or data_size is None:
        raise ValueError(_WAV_ERROR)
    return data_size / byte_rate


def _header_params(value: str) -> tuple[str, dict[str, str]]:
    """Split `type; a=1; b="x;y"` into the first token and lower-cased parameters."""
    parts: list[str] = []
    current: list[str] = []
    quoted = False
    escaped = False
    for char in value:
        if escaped:
            current.append(char)
            escaped = False
        elif quoted and char == "\\":
            escaped = True
        elif char == '"':
            quoted = not quoted
        elif char == ";" and not quoted:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    params: dict[str, str] = {}
    for part in parts[1:]:
        key, sep, val = part.partition("=")
        if sep:
            params[key.strip().lower()] = val.strip()
    return parts[0].strip().lower(), params


def _part_name(headers: bytes) -> str | None:
    for line in headers.split(b"\r\n"):
        key, sep, value = line.partition(b":")
        if sep and key.strip().lower() == b"content-disposition":
            _, params = _header_params(value.decode("utf-8", "replace"))
            return params.get("name")
    return None


def with_multipart_fields(
    body: bytes, content_type: str, fields: Sequence[tuple[str, str]]
) -> bytes | None:
    """The multipart/form-data body with `fields` added as parts before its end; None when
    the body is not one (no boundary, or no closing delimiter)."""
    kind, params = _header_params(content_type or "")
    boundary = params.get("boundary")
    if kind != "multipart/form-data" or not boundary:
        return None
    closing = b"--" + boundary.encode("latin-1", "replace") + b"--"
    at = body.rfind(closing)
    if at < 0:
        return None
    delimiter = closing[:-2]
    parts = b"".join(
        delimiter
        + b'\r\nContent-Disposition: form-data; name="'
        + name.encode()
        + b'"\r\n\r\n'
        + value.encode()
        + b"\r\n"
        for name, value in fields
    )
    return body[:at] + parts + body[at:]


def multipart_field(body: bytes, content_type: str, name: str) -> bytes | None:
    """Raw value of form field `name` in a multipart/form-data body, or None.

    Walks the delimiters with bytes.find and slices only the field asked for, so a
    large upload is neither split nor copied.
    """
    kind, params = _header_params(content_type or "")
    boundary = params.get("boundary")
    if kind != "multipart/form-data" or not boundary:
        return None
    delimiter = b"--" + boundary.encode("latin-1", "replace")
    next_delimiter = b"\r\n" + delimiter
    pos = body.find(delimiter)
    if pos < 0:
        return None
    while True:
        after = pos + len(delimiter)
        if body.startswith(b"--", after):
            return None
        line_end = body.find(b"\r\n", after)
        if line_end < 0:
            return None
        part_start = line_end + 2
        if body.startswith(b"\r\n", part_start):
            headers_end, content_start = part_start, part_start + 2
        else:
            headers_end = body.find(b"\r\n\r\n", part_start)
            if headers_end < 0:
                return None
            content_start = headers_end + 4
        content_end = body.find(next_delimiter, content_start)
        if content_end < 0:
            return None
        if _part_name(body[part_start:headers_end]) == name:
            return body[content_start:content_end]
        pos = content_end + 2


def replace_multipart_model(body: bytes, public_id: str, local_id: str) -> bytes:
    """Rename the `model` form field's value (public ID → the serving node's local ID)."""
    marker = b'name="model"'
    at = body.find(marker)
    if at < 0:
        return body
    start = body.find(b"\r\n\r\n", at)
    if start < 0:
        return body
    start += 4
    end = body.find(b"\r\n", start)
    if end < 0 or body[start:end].strip() != public_id.encode():
        return body
    return body[:start] + local_id.encode() + body[end:]
