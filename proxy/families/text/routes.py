"""The text family's route table: OpenAI, Ollama and Kobold text paths, and the rest of the
text surface (`surface`), joined into the client table by `proxy.edge.routes`."""

from __future__ import annotations

from proxy.families.text import koboldgen, surface
from proxy.families.text.kobold import (
    handle_kobold,
    handle_kobold_model,
    handle_kobold_version,
)
from proxy.families.text.ollama import (
    handle_ollama,
    handle_ollama_embed,
    handle_ollama_show,
    handle_ollama_version,
    handle_ps,
    handle_tags,
    handle_unknown_ollama,
)
from proxy.families.text.openai import (
    handle_embeddings,
    handle_model,
    handle_models,
    handle_openai_text,
)
from proxy.serving.core import ALL_METHODS, GET, POST, Route

ROUTES: dict[str, Route] = {
    "/v1/models": (GET, handle_models, True),
    "/v1/models/{model}": (GET, handle_model, True),
    "/v1/chat/completions": (POST, handle_openai_text, True),
    "/v1/completions": (POST, handle_openai_text, True),
    "/v1/embeddings": (POST, handle_embeddings, True),
    "/api/chat": (POST, handle_ollama, True),
    "/api/generate": (POST, handle_ollama, True),
    "/api/tags": (GET, handle_tags, True),
    "/api/ps": (GET, handle_ps, True),
    "/api/version": (GET, handle_ollama_version, True),
    "/api/embed": (POST, handle_ollama_embed, True),
    "/api/embeddings": (POST, handle_ollama_embed, True),
    "/api/show": (POST, handle_ollama_show, True),
    "/api/v1/generate": (POST, handle_kobold, True),
    "/api/v1/model": (GET, handle_kobold_model, True),
    "/api/extra/version": (GET, handle_kobold_version, True),
    "/api/extra/generate/check": (GET | POST, koboldgen.handle_check, True),
    "/api/extra/abort": (POST, koboldgen.handle_abort, True),
    **surface.ROUTES,
}

UNKNOWN_OLLAMA: Route = (ALL_METHODS, handle_unknown_ollama, False)
