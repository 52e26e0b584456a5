"""Admin pages of the access app; each lives in its own module, registered on import."""

from __future__ import annotations

from access import (
    audit_admin,  # noqa: F401  (registers AuditEntryAdmin)
    keys_admin,  # noqa: F401  (registers ApiKeyAdmin)
)
