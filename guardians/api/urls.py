"""Routes under /router/v1/site/ for guardian settings."""

from __future__ import annotations

from django.urls import path

from guardians.api import views

urlpatterns = [
    path("guardians", views.guardians, name="site-guardians"),
]
