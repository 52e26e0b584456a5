"""Stored keys' routes under /router/v1/."""

from __future__ import annotations

from django.urls import path

from access.api import views

urlpatterns = [
    path("site/api-keys", views.ApiKeysView.as_view(), name="site-api-keys"),
    path("site/api-keys/<str:key_id>", views.ApiKeyView.as_view(), name="site-api-key"),
]
