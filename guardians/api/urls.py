"""Guardians' routes under /router/v1/."""

from __future__ import annotations

from django.urls import path

from guardians.api import views

urlpatterns = [
    path("site/guardians", views.GuardiansView.as_view(), name="site-guardians"),
]
