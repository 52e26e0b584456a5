"""Create one stored API key and print its secret, once.

Scope: the node's database (from `ROUTER_CONFIG` or `--config`), which must be a master's or a
standalone node's: the running router notices the new row within a second and pushes it to
every slave. The body rules are the site API's (access/api/serializers.py); the command
cannot see which models the cluster serves, so `--models` is checked for form only.
Not idempotent by nature (a name is unique): a second run with the same name fails.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction
from django.utils import timezone

from access import services
from access.api.serializers import ApiKeyCreateSerializer
from access.audit import record
from access.keys import ROLES
from routerproject.api import field_error
from routerproject.errors import RouterError

# The audit log's actor for keys made on the node's own command line (no key, no admin user).
COMMAND_ACTOR = "manage.py"


class Command(BaseCommand):
    help = "Create a stored API key (rk-…) and print its secret once."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--config", help="The node's config file (read by manage.py, not by this command)."
        )
        parser.add_argument("--name", required=True, help="Unique name of the key.")
        parser.add_argument("--role", choices=ROLES, default="inference")
        parser.add_argument(
            "--models", help="Comma-separated public model IDs the key may use (default: all)."
        )
        parser.add_argument("--expires-at", help="RFC 3339 time the key stops working.")
        parser.add_argument(
            "--dry-run", action="store_true", help="Check the input, create nothing."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        body: dict[str, Any] = {"name": options["name"], "role": options["role"]}
        if options.get("models"):
            body["models"] = [m.strip() for m in options["models"].split(",") if m.strip()]
        if options.get("expires_at"):
            body["expires_at"] = options["expires_at"]
        checked = ApiKeyCreateSerializer(data=body)
        if not checked.is_valid():
            _param, message = field_error(checked.errors)
            raise CommandError(message)
        fields = dict(checked.validated_data)
        scope = "all models" if fields.get("models") is None else ", ".join(fields["models"])
        if options["dry_run"]:
            self.stdout.write(
                f'Would create key "{fields["name"]}" ({fields.get("role")}, {scope}).'
            )
            self.stdout.write(self.style.SUCCESS("Dry run: nothing created."))
            return
        try:
            with transaction.atomic():
                write = services.api_key_create(**fields, now=timezone.now())
                record(
                    actor=COMMAND_ACTOR,
                    action="api_key.create",
                    target=write.key.name,
                    before=None,
                    after=write.after,
                )
        except RouterError as exc:
            raise CommandError(exc.message) from exc
        key = write.key
        self.stdout.write(f'Created key "{key.name}" (id {key.pk}, {key.role}, {scope}).')
        self.stdout.write("Its secret, shown this once:")
        self.stdout.write(str(write.secret))
        self.stdout.write(self.style.SUCCESS("1 key created."))
