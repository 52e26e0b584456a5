"""The guardian admin: the same rules as `POST /router/v1/site/guardians`, and the same effect.

A row saved here without those checks would route image requests to a model that cannot read
them, so the form runs the site API's validation (guardians.services.changes_resolve) against
the running cluster, and every save or delete is published to the router and its slaves as an
API change is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from asgiref.sync import async_to_sync
from django import forms
from django.contrib import admin
from django.db import transaction
from django.db.models import QuerySet
from django.http import HttpRequest

from access.audit_admin import AuditedAdmin
from guardians.models import GuardianSetting
from guardians.ports import running_node
from guardians.services import changes_resolve, guardians_push
from guardians.store import guardians_load
from lending.admin import TypedModelAdmin
from routerproject.errors import RouterError

# The API's error codes that are about the chosen guardian rather than the scope's key.
_GUARDIAN_CODES = frozenset({"invalid_guardian", "self_guardian"})


if TYPE_CHECKING:
    _SettingForm = forms.ModelForm[GuardianSetting]
else:
    # django-stubs types ModelForm as generic; Django's own class is not subscriptable.
    _SettingForm = forms.ModelForm


class GuardianSettingForm(_SettingForm):
    class Meta:
        model = GuardianSetting
        fields = ("scope", "key", "guardian_id")

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        scope, key, guardian = data.get("scope"), data.get("key") or "", data.get("guardian_id")
        if not scope or not guardian:
            return data
        if scope == GuardianSetting.Scope.CLUSTER:
            if key:
                self.add_error("key", "The cluster scope has no key: leave it empty.")
                return data
            body: dict[str, Any] = {"cluster": guardian}
        else:
            if not key:
                self.add_error("key", f"A {scope} guardian needs the {scope}'s ID as its key.")
                return data
            body = {"nodes" if scope == GuardianSetting.Scope.NODE else "models": {key: guardian}}
        try:
            changes_resolve(running_node(), body)
        except RouterError as exc:
            self.add_error("guardian_id" if exc.code in _GUARDIAN_CODES else "key", exc.message)
        return data


def _publish() -> None:
    # Once the admin's transaction has committed: the rows are read on this (the admin's)
    # thread and connection, and only the push runs on the router's own event loop.
    def publish() -> None:
        async_to_sync(guardians_push)(running_node(), guardians_load())

    transaction.on_commit(publish)


@admin.register(GuardianSetting)
class GuardianSettingAdmin(AuditedAdmin, TypedModelAdmin[GuardianSetting]):
    form = GuardianSettingForm
    audit_name = "guardian"
    list_display = ("scope", "key", "guardian_id", "updated_at")
    list_filter = ("scope",)
    search_fields = ("key", "guardian_id")

    def audit_state(self, obj: GuardianSetting) -> dict[str, Any]:
        # `key` is the node's or model's ID here, but the audit log drops any field of that name.
        return {"scope": obj.scope, "scope_id": obj.key, "guardian_id": obj.guardian_id}

    def save_model(
        self, request: HttpRequest, obj: GuardianSetting, form: Any, change: bool
    ) -> None:
        super().save_model(request, obj, form, change)
        _publish()

    def delete_model(self, request: HttpRequest, obj: GuardianSetting) -> None:
        super().delete_model(request, obj)
        _publish()

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[GuardianSetting]) -> None:
        super().delete_queryset(request, queryset)
        _publish()
