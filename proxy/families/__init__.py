"""The path families, one package each (text, media, voice), over the serving core; the
OpenAPI vocabulary their schemas share is `openapi`. A family never imports another."""
