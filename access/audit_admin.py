"""The audit log in the Django admin: writes made there are recorded, and the log is read-only.

`AuditedAdmin` goes first in a ModelAdmin's bases. It records one row per object for every
add, change and delete, including the bulk "delete selected" (through `delete_queryset`) and
any other bulk action (each is wrapped: the selected objects are read before and after it runs,
and every one it changed gets a row). The actor is the signed-in admin user.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.contrib.auth.admin import GroupAdmin, UserAdmin
from django.contrib.auth.models import Group, User
from django.db.models import Model, QuerySet
from django.forms.models import model_to_dict
from django.http import HttpRequest

from access.audit import audit_request
from access.models import AuditEntry

if TYPE_CHECKING:
    from django.contrib.admin import ModelAdmin as TypedModelAdmin
else:

    class TypedModelAdmin(admin.ModelAdmin):
        # django-stubs types ModelAdmin as generic; Django's own class is not subscriptable.
        def __class_getitem__(cls, item: object) -> type:
            return cls


Action = Callable[..., Any]
# Django's own bulk delete ends in delete_queryset, which records each object already.
BULK_DELETE = "delete_selected"


class AuditedAdmin(TypedModelAdmin[Any]):
    """Records every write made through this admin page in the audit log.

    `audit_name` is the action prefix (`guardian` → guardian.create, .update, .delete).
    """

    audit_name: str = ""

    def audit_state(self, obj: Any) -> dict[str, Any]:
        """The object as its audit rows keep it (secret-named fields are dropped anyway)."""
        return model_to_dict(obj)

    def _audit_action(self, verb: str) -> str:
        return f"{self.audit_name or self.model._meta.model_name}.{verb}"

    def _audit_target(self, obj: Model) -> str:
        return f"{self.model._meta.label} {obj.pk}: {obj}"

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        old = self.model._default_manager.filter(pk=obj.pk).first() if change else None
        before = self.audit_state(old) if old is not None else None
        super().save_model(request, obj, form, change)
        verb = "update" if change else "create"
        after = self.audit_state(obj)
        audit_request(request, self._audit_action(verb), self._audit_target(obj), before, after)

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        target, before = self._audit_target(obj), self.audit_state(obj)
        super().delete_model(request, obj)
        audit_request(request, self._audit_action("delete"), target, before, None)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        doomed = [(self._audit_target(obj), self.audit_state(obj)) for obj in queryset]
        super().delete_queryset(request, queryset)
        for target, before in doomed:
            audit_request(request, self._audit_action("delete"), target, before, None)

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        actions: dict[str, Any] = {}
        for name, entry in super().get_actions(request).items():
            if entry is not None and name != BULK_DELETE:
                func, label, description = entry
                entry = (self._audited(name, func), label, description)
            actions[name] = entry
        return actions

    def _audited(self, name: str, func: Action) -> Action:
        def run(model_admin: Any, request: HttpRequest, queryset: QuerySet[Any]) -> Any:
            pks = list(queryset.values_list("pk", flat=True))
            before = {obj.pk: (self._audit_target(obj), self.audit_state(obj)) for obj in queryset}
            answer = func(model_admin, request, queryset)
            still = self.model._default_manager.filter(pk__in=pks)
            after = {obj.pk: self.audit_state(obj) for obj in still}
            for pk, (target, state) in before.items():
                if after.get(pk) != state:
                    verb = name if pk in after else "delete"
                    audit_request(request, self._audit_action(verb), target, state, after.get(pk))
            return answer

        return run


@admin.register(AuditEntry)
class AuditEntryAdmin(TypedModelAdmin[AuditEntry]):
    """Read-only: the log records the admin's own writes, so no one edits it here."""

    list_display = ("at", "actor", "action", "target", "node_id", "request_id")
    list_filter = ("action", "actor")
    search_fields = ("target",)
    readonly_fields = (
        "at",
        "actor",
        "action",
        "target",
        "before",
        "after",
        "node_id",
        "request_id",
    )
    ordering = ("-at", "-id")
    list_per_page = 100

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


# Who may sign in to the admin is a management write like any other: Django's own user and
# group pages are re-registered with the audit mixin (auth's admin module loads before this
# one, INSTALLED_APPS order). The password hash never reaches a row: its field is named so.
class AuditedUserAdmin(AuditedAdmin, UserAdmin):
    audit_name = "user"


class AuditedGroupAdmin(AuditedAdmin, GroupAdmin):
    audit_name = "group"


for _model, _audited_admin in ((User, AuditedUserAdmin), (Group, AuditedGroupAdmin)):
    if admin.site.is_registered(_model):
        admin.site.unregister(_model)
    admin.site.register(_model, _audited_admin)
