"""The Lending tab: a static page that reads the site API from the browser.

It lives with lending so that the page folds the decision log by the log's own field lists
(FOLD_SIGNATURE, FOLD_MEASURES) instead of a copy of them in the page's script.
"""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import path

from lending.decisions import FOLD_MEASURES, FOLD_SIGNATURE
from routerproject.views import not_found


def lending_tab(request: HttpRequest) -> HttpResponse:
    if settings.ROUTER.cluster.role == "slave":
        return not_found(request)
    context = {"fold_signature": list(FOLD_SIGNATURE), "fold_measures": list(FOLD_MEASURES)}
    return render(request, "ui/lending.html", context)


urlpatterns = [path("lending", lending_tab, name="ui-lending")]
