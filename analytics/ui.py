"""The WebUI's Usage page: a static page that reads `site/usage` from the browser."""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import path

from routerproject.views import not_found


def usage_page(request: HttpRequest) -> HttpResponse:
    """Requests, tokens and backend time per key over a chosen range, and tokens per day."""
    if settings.ROUTER.cluster.role == "slave":
        return not_found(request)
    return render(request, "ui/usage.html")


urlpatterns = [path("usage", usage_page, name="ui-usage")]
