from __future__ import annotations

from django.contrib import admin

from guardians.models import GuardianSetting
from lending.admin import TypedModelAdmin


@admin.register(GuardianSetting)
class GuardianSettingAdmin(TypedModelAdmin[GuardianSetting]):
    list_display = ("scope", "key", "guardian_id", "updated_at")
    list_filter = ("scope",)
    search_fields = ("key", "guardian_id")
