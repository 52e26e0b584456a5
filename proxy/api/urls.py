"""The schema routes under /router/v1/ (the proxy's other routes are served outside Django)."""

from __future__ import annotations

from django.urls import path

from proxy.api import schema

urlpatterns = [
    path("schema", schema.SchemaView.as_view(), name="router-schema"),
    path("docs", schema.DocsView.as_view(), name="router-docs"),
]
