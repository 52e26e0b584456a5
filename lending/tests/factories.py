"""Rows of lending's tables, for tests: each factory fills what its model requires and nothing
else, so a test names every value its assertions depend on."""

from __future__ import annotations

import factory
from factory.django import DjangoModelFactory

from lending.models import (
    ImageLink,
    LegacyRoutingGroupMember,
    OffloadDecision,
    OffloadSetting,
    TextLink,
)
from lending.planner import Lease


class ImageLinkFactory(DjangoModelFactory[ImageLink]):
    class Meta:
        model = ImageLink

    owner_node_id = "node-a"
    owner_model_id = factory.Sequence(lambda n: f"owner-{n}")
    helper_node_id = "node-b"
    helper_model_id = factory.Sequence(lambda n: f"helper-{n}")


class TextLinkFactory(DjangoModelFactory[TextLink]):
    class Meta:
        model = TextLink

    owner_node_id = "node-a"
    owner_model_id = factory.Sequence(lambda n: f"owner-{n}")
    helper_node_id = "node-b"
    helper_model_id = factory.Sequence(lambda n: f"helper-{n}")


class OffloadSettingFactory(DjangoModelFactory[OffloadSetting]):
    class Meta:
        model = OffloadSetting

    key = factory.Sequence(lambda n: f"setting_{n}")
    value = ""
    updated_at = 1


class OffloadDecisionFactory(DjangoModelFactory[OffloadDecision]):
    class Meta:
        model = OffloadDecision

    recorded_at = factory.Sequence(lambda n: 1_000 + n)


class LegacyRoutingGroupMemberFactory(DjangoModelFactory[LegacyRoutingGroupMember]):
    class Meta:
        model = LegacyRoutingGroupMember

    lane = "text"
    group_id = "group"
    node_id = "node-a"
    model_id = factory.Sequence(lambda n: f"model-{n}")


class LeaseFactory(factory.Factory[Lease]):
    """A priced text lease of o/a on h/b; a test overrides what its numbers depend on."""

    class Meta:
        model = Lease

    lane = "text"
    owner_node_id = "o"
    owner_model_id = "a"
    helper_node_id = "h"
    helper_model_id = "b"
    load_helper_model = True
    restore_helper_model = False
    helper_slots = 1
    probe = False
    ttl_ms = 30_000
    owner_job_ms = 1000.0
    helper_switch_ms = 0.0
    helper_service_ms = 200.0
