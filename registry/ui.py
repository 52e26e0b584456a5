"""The WebUI's Recipes page (the site API does the work; the page only calls it)."""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.urls import path

from routerproject.errors import error_envelope


def recipes_page(request: HttpRequest) -> HttpResponse:
    """Lists the split recipes and creates one from models of different nodes."""
    if settings.ROUTER.cluster.role == "slave":
        return JsonResponse(error_envelope("endpoint not found", type="not_found"), status=404)
    return render(request, "ui/recipes.html")


urlpatterns = [path("recipes", recipes_page, name="ui-recipes")]
