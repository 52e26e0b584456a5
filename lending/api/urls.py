"""Routes under /router/v1/site/ (included before the registry's /router/v1/ routes)."""

from __future__ import annotations

from django.urls import path

from lending.api import views

urlpatterns = [
    path("offload/settings", views.offload_settings, name="site-offload-settings"),
    path("offload/decisions", views.offload_decisions, name="site-offload-decisions"),
]
