"""Admin pages for lending: links, settings overrides, the decision log, legacy groups.

Every page here is read-only on purpose. Links and settings change through the site API
(the Lending tab), because that path validates, applies the change in the running router
and republishes it to every slave; an edit saved here would do none of that and leave the
cluster running values the database no longer shows.
"""

from __future__ import annotations

from datetime import UTC, datetime
from functools import cached_property
from typing import TYPE_CHECKING, Any, cast

from django.contrib import admin
from django.core.paginator import Paginator
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html
from django.utils.safestring import SafeString

from lending.decisions import DECISION_OUTCOMES
from lending.models import (
    ImageLink,
    LegacyRoutingGroupMember,
    LinkBase,
    OffloadDecision,
    OffloadSetting,
    TextLink,
)

if TYPE_CHECKING:
    from django.contrib.admin import ModelAdmin as TypedModelAdmin
else:

    class TypedModelAdmin(admin.ModelAdmin):
        # django-stubs types ModelAdmin as generic; at run time Django's is not, and the
        # stubs' run-time patch is a dev dependency only.
        def __class_getitem__(cls, item: object) -> type:
            return cls


# Past this many rows the decision changelist stops counting and shows "more than".
DECISIONS_COUNT_CAP = 10_000

# Known values for the decision filters. Django's default filter for a plain text column
# runs SELECT DISTINCT over the whole table on every page view; the log can hold millions
# of rows, and its values are a closed set written by our own code.
DECISION_KINDS = ("plan", "dispatch", "helper")
DECISION_LANES = ("image", "text")


class ReadOnlyAdmin(TypedModelAdmin[Any]):
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


def _endpoint(node_id: str, model_id: str) -> SafeString:
    return format_html("{} / <strong>{}</strong>", node_id, model_id)


class LinkAdmin(ReadOnlyAdmin):
    list_display = ("owner", "helper", "load_if_unloaded", "restore_after_borrow", "updated_at")
    list_filter = ("load_if_unloaded", "restore_after_borrow")
    search_fields = ("owner_node_id", "owner_model_id", "helper_node_id", "helper_model_id")
    ordering = ("owner_node_id", "owner_model_id", "helper_node_id", "helper_model_id")
    readonly_fields = ("created_at", "updated_at")

    @admin.display(description="owner (lends)", ordering="owner_node_id")
    def owner(self, obj: LinkBase) -> SafeString:
        return _endpoint(obj.owner_node_id, obj.owner_model_id)

    @admin.display(description="→ helper (borrows)", ordering="helper_node_id")
    def helper(self, obj: LinkBase) -> SafeString:
        return _endpoint(obj.helper_node_id, obj.helper_model_id)


@admin.register(ImageLink)
class ImageLinkAdmin(LinkAdmin):
    pass


@admin.register(TextLink)
class TextLinkAdmin(LinkAdmin):
    pass


@admin.register(OffloadSetting)
class OffloadSettingAdmin(ReadOnlyAdmin):
    list_display = ("key", "value", "updated")
    search_fields = ("key",)
    ordering = ("key",)

    @admin.display(description="updated", ordering="updated_at")
    def updated(self, obj: OffloadSetting) -> str:
        return _ms_text(obj.updated_at)


@admin.register(LegacyRoutingGroupMember)
class LegacyRoutingGroupMemberAdmin(ReadOnlyAdmin):
    list_display = ("lane", "group_id", "node_id", "model_id", "restore_after_borrow")
    list_filter = ("lane", "restore_after_borrow")
    search_fields = ("group_id", "node_id", "model_id")
    ordering = ("lane", "group_id", "node_id", "model_id")


def _ms_text(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


class _ChoiceFilter(admin.SimpleListFilter):
    choices_list: tuple[str, ...] = ()

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(value, value) for value in self.choices_list]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if value:
            return queryset.filter(**{str(self.parameter_name): value})
        return queryset


class KindFilter(_ChoiceFilter):
    title = "kind"
    parameter_name = "kind"
    choices_list = DECISION_KINDS


class OutcomeFilter(_ChoiceFilter):
    title = "outcome"
    parameter_name = "outcome"
    choices_list = DECISION_OUTCOMES


class LaneFilter(_ChoiceFilter):
    title = "lane"
    parameter_name = "lane"
    choices_list = DECISION_LANES


class CappedPaginator(Paginator):
    """Counts at most ``DECISIONS_COUNT_CAP`` rows: COUNT(*) over a large log is slow."""

    @cached_property
    def count(self) -> int:
        rows = cast("QuerySet[Any]", self.object_list)
        # A sliced queryset counts as COUNT(*) over a LIMITed subquery, so it stays bounded.
        return rows[:DECISIONS_COUNT_CAP].count()


@admin.register(OffloadDecision)
class OffloadDecisionAdmin(ReadOnlyAdmin):
    list_display = (
        "recorded",
        "node_id",
        "kind",
        "trigger",
        "lane",
        "owner",
        "helper",
        "outcome",
        "reason",
        "slots",
        "lent_out",
    )
    list_filter = (KindFilter, OutcomeFilter, LaneFilter)
    ordering = ("-recorded_at",)
    paginator = CappedPaginator
    show_full_result_count = False
    list_per_page = 100

    @admin.display(description="recorded (UTC)", ordering="recorded_at")
    def recorded(self, obj: OffloadDecision) -> str:
        return _ms_text(obj.recorded_at)

    @admin.display(description="owner")
    def owner(self, obj: OffloadDecision) -> SafeString | str:
        return _endpoint(obj.owner_node_id, obj.owner_model_id) if obj.owner_node_id else ""

    @admin.display(description="helper")
    def helper(self, obj: OffloadDecision) -> SafeString | str:
        return _endpoint(obj.helper_node_id, obj.helper_model_id) if obj.helper_node_id else ""
