"""The Lending tab carries the decision log's own folding fields."""

from __future__ import annotations

import json
import re

import pytest
from django.test import Client

from lending.decisions import DECISION_FIELDS, FOLD_MEASURES, FOLD_SIGNATURE


def test_the_page_folds_by_the_decision_logs_field_lists(client: Client) -> None:
    resp = client.get("/ui/lending")

    assert resp.status_code == 200
    page = resp.content.decode()
    scripts = dict(
        re.findall(r'<script id="(fold-[a-z]+)" type="application/json">(.*?)</script>', page)
    )
    assert json.loads(scripts["fold-measures"]) == list(FOLD_MEASURES)
    assert json.loads(scripts["fold-signature"]) == list(FOLD_SIGNATURE)


def test_every_decision_column_is_either_folded_on_or_measured() -> None:
    # A new column must be placed: shown as part of what a row says, or as a number it weighed.
    # The request ID differs on every row that has one: folding on it would fold nothing, so
    # each fold carries a sample of its rows' IDs and the log filters by one ID instead.
    # The trigger is counted per fold (several triggers can ask for one decision). The key
    # name is sampled like the request ID: a decision is the same whichever key asked.
    placed = {
        "recorded_at",
        "trigger",
        "service_source",
        "router_version",
        "request_id",
        "key_name",
        *FOLD_SIGNATURE,
        *FOLD_MEASURES,
    }
    assert placed == set(DECISION_FIELDS)
    assert not set(FOLD_SIGNATURE) & set(FOLD_MEASURES)


@pytest.fixture
def client() -> Client:
    return Client()
