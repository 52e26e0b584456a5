"""Does a request body carry an image?

Only the JSON structure is read, never string contents: a prompt that talks about
"image_url" is text, and scanning strings would both misfire on it and cost time on
large prompts. Any shape is accepted and nothing here raises, because bodies come
straight from clients.
"""

from __future__ import annotations

from typing import Any

# Content part types that hold an image: OpenAI chat, Anthropic, OpenAI Responses.
_IMAGE_PART_TYPES = frozenset({"image_url", "image", "input_image"})


def _is_image_part(part: Any) -> bool:
    if not isinstance(part, dict):
        return False
    kind = part.get("type")
    # A junk `type` such as a list is unhashable, so test it is a string first.
    return isinstance(kind, str) and kind in _IMAGE_PART_TYPES


def _content_has_image(content: Any) -> bool:
    if not isinstance(content, list):
        return False
    for part in content:
        if _is_image_part(part):
            return True
        # Anthropic tool results carry their own content list, which may hold images.
        if isinstance(part, dict) and part.get("type") == "tool_result":
            inner = part.get("content")
            if isinstance(inner, list) and any(_is_image_part(p) for p in inner):
                return True
    return False


def _non_empty_list(value: Any) -> bool:
    return isinstance(value, list) and len(value) > 0


def body_has_image(body: Any) -> bool:
    """True when an OpenAI, Responses, Anthropic, Ollama or Kobold body includes an image."""
    if not isinstance(body, dict):
        return False
    # Ollama /api/generate and Kobold put base64 images in a top-level list.
    if _non_empty_list(body.get("images")):
        return True
    messages = body.get("messages")
    if isinstance(messages, list):
        for message in messages:
            if not isinstance(message, dict):
                continue
            if _non_empty_list(message.get("images")) or _content_has_image(message.get("content")):
                return True
    items = body.get("input")
    if isinstance(items, list):
        for item in items:
            if _is_image_part(item):
                return True
            if isinstance(item, dict) and _content_has_image(item.get("content")):
                return True
    return False
