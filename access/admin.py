"""Admin pages of the access app (the audit log's live in access.audit_admin)."""

from __future__ import annotations

from access import audit_admin  # noqa: F401  (registers AuditEntryAdmin)
