"""The Lending tab: a static page that reads the site API from the browser.

It lives with lending so that the page names the decision log's folds, measures, outcomes and
reasons by the log's own lists (FOLD_SIGNATURE, FOLD_MEASURES, OUTCOME_TEXT, REASON_TEXT)
instead of a copy of them in the page's script; the folding itself is the server's.
"""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import path

from lending.decisions import FOLD_MEASURES, FOLD_SIGNATURE, OUTCOME_TEXT, REASON_TEXT
from routerproject.views import not_found


def lending_tab(request: HttpRequest) -> HttpResponse:
    if settings.ROUTER.cluster.role == "slave":
        return not_found(request)
    context = {
        "fold_signature": list(FOLD_SIGNATURE),
        "fold_measures": list(FOLD_MEASURES),
        "outcome_text": OUTCOME_TEXT,
        "reason_text": REASON_TEXT,
    }
    return render(request, "ui/lending.html", context)


urlpatterns = [path("lending", lending_tab, name="ui-lending")]
