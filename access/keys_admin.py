"""The Django admin's page for stored keys (registered from access/admin.py).

Listing, editing scopes, limits and expiry, and revoking go through the same services as the
site API; the running master notices the change within a second (registry/keysync.py watches
the rows) and pushes the table to every slave. The secret is shown once, in the message after
a key is added; no form shows the secret or its hash.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone

from access import services
from access.audit_admin import AuditedAdmin
from access.keys import new_secret, secret_hash, visible_prefix
from access.models import ApiKey

if TYPE_CHECKING:
    from django.contrib.admin import ModelAdmin as TypedModelAdmin
else:

    class TypedModelAdmin(admin.ModelAdmin):
        # django-stubs types ModelAdmin as generic; at run time Django's is not.
        def __class_getitem__(cls, item: object) -> type:
            return cls


class ApiKeyForm(forms.ModelForm):
    """The same rules as the site API's body (access/api/serializers.py), on a form."""

    class Meta:
        model = ApiKey
        fields = (
            "name",
            "role",
            "allowed_models",
            "rpm",
            "tpm",
            "max_concurrent",
            "share",
            "expires_at",
        )

    def clean_allowed_models(self) -> list[str] | None:
        value = self.cleaned_data.get("allowed_models")
        if value is None:
            return None
        if not isinstance(value, list) or not all(isinstance(m, str) and m for m in value):
            raise forms.ValidationError("a JSON list of public model IDs, or null for all")
        return value

    def _limit(self, field: str) -> int | None:
        value = self.cleaned_data.get(field)
        if value is not None and value < 1:
            raise forms.ValidationError("must be at least 1, or empty for no limit")
        return value

    def clean_rpm(self) -> int | None:
        return self._limit("rpm")

    def clean_tpm(self) -> int | None:
        return self._limit("tpm")

    def clean_max_concurrent(self) -> int | None:
        return self._limit("max_concurrent")

    def clean_share(self) -> float:
        value = self.cleaned_data.get("share")
        if value is None or not value > 0:
            raise forms.ValidationError("must be a number above 0")
        return float(value)

    def clean_expires_at(self) -> Any:
        value = self.cleaned_data.get("expires_at")
        if value is not None and value <= timezone.now() and "expires_at" in self.changed_data:
            raise forms.ValidationError("must be in the future")
        return value


@admin.register(ApiKey)
class ApiKeyAdmin(AuditedAdmin):
    audit_name = "api_key"
    form = ApiKeyForm
    list_display = ("name", "key_prefix", "role", "models_shown", "expires_at", "state")
    list_filter = ("role",)
    search_fields = ("name", "key_prefix")
    readonly_fields = ("key_prefix", "created_at", "updated_at", "revoked_at")
    actions = ("revoke",)

    @admin.display(description="models")
    def models_shown(self, key: ApiKey) -> str:
        return "all" if key.allowed_models is None else ", ".join(key.allowed_models)

    @admin.display(description="state")
    def state(self, key: ApiKey) -> str:
        if key.revoked_at is not None:
            return "revoked"
        if key.expires_at is not None and key.expires_at <= timezone.now():
            return "expired"
        return "active"

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Usage rows and the audit log keep naming a key: revoke it instead.
        return False

    def save_model(self, request: HttpRequest, obj: ApiKey, form: Any, change: bool) -> None:
        if change:
            super().save_model(request, obj, form, change)
            return
        secret = new_secret()
        obj.key_hash, obj.key_prefix = secret_hash(secret), visible_prefix(secret)
        super().save_model(request, obj, form, change)
        self.message_user(
            request,
            f'Key "{obj.name}" created. Its secret, shown this once (copy it now): {secret}',
            messages.WARNING,
        )

    @admin.action(description="Revoke the selected keys")
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        now = timezone.now()
        revoked = 0
        for key in queryset.filter(revoked_at__isnull=True):
            services.api_key_revoke(key_id=key.pk, now=now)
            revoked += 1
        self.message_user(request, f"{revoked} key(s) revoked.", messages.SUCCESS)
