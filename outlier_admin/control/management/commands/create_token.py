"""``manage.py create_token --scope ingest|api --name NAME [--user USERNAME] [--group G ...]``.

Prints the new token alone on its last line (scripts: ``TOKEN=$(manage.py create_token ... | tail -1)``).
``--group`` (repeatable, ingest tokens only) scopes the token to those groups: ingest refuses its records
for any other group. Without it the token may push for every group.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from outlier_admin.control.actions import ActionError, do_create_token
from outlier_admin.fleet.models import TokenScope


class Command(BaseCommand):
    help = "Create a bearer token; the token is printed alone on the last line."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--scope", required=True, choices=TokenScope.values)
        parser.add_argument("--name", required=True)
        parser.add_argument("--user", default=None, help="username the token acts as (API tokens)")
        parser.add_argument("--group", action="append", default=[], dest="groups", metavar="GROUP",
                            help="ingest tokens: a group it may push records for (repeat for more); "
                                 "none: every group")

    def handle(self, *args: Any, **opts: Any) -> None:
        user = None
        if opts["user"]:
            try:
                user = get_user_model().objects.get(username=opts["user"])
            except get_user_model().DoesNotExist:
                raise CommandError(f"no user {opts['user']!r}") from None
        try:
            row, plaintext = do_create_token(name=opts["name"], scope=opts["scope"], actor="cli:create_token",
                                             user=user, groups=opts["groups"])
        except ActionError as exc:
            raise CommandError(str(exc)) from None
        scope = f" for groups {', '.join(row.ingest_groups)}" if row.ingest_groups else ""
        self.stderr.write(f"created {row.scope} token {row.name!r} (id {row.pk}){scope}; it is shown only once:")
        self.stdout.write(plaintext)
