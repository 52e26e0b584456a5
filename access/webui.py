"""The WebUI's Keys page: a static page that manages stored keys through `site/api-keys`
(contract §8) from the browser; the secret of a new key is shown there once and kept nowhere."""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import path

from routerproject.views import not_found


def keys_page(request: HttpRequest) -> HttpResponse:
    """List, create, edit and revoke stored keys (master or standalone)."""
    if settings.ROUTER.cluster.role == "slave":
        return not_found(request)
    return render(request, "ui/keys.html")


urlpatterns = [path("keys", keys_page, name="ui-keys")]
