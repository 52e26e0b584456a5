"""Rows of the analytics tables, for tests: each factory fills what its model requires and
nothing else, so a test names every value its assertions depend on."""

from __future__ import annotations

from datetime import timedelta

import factory
from django.utils import timezone
from factory.django import DjangoModelFactory

from analytics.models import LoadRecord, RequestRecord


class RequestRecordFactory(DjangoModelFactory[RequestRecord]):
    class Meta:
        model = RequestRecord

    node_id = "node-a"
    model_id = "chat"
    lane = "text"
    duration_ms = 1.0
    finished_at = factory.LazyFunction(timezone.now)
    started_at = factory.LazyAttribute(lambda row: row.finished_at - timedelta(seconds=1))


class LoadRecordFactory(DjangoModelFactory[LoadRecord]):
    class Meta:
        model = LoadRecord

    node_id = "node-a"
    model_id = "chat"
    config_filename = factory.LazyAttribute(lambda row: f"{row.model_id}.kcpps")
    lane = "text"
    duration_ms = 1.0
    finished_at = factory.LazyFunction(timezone.now)
